"""A screenshot of the built documentation site, so its rendering (math, tables, code blocks) is seen, not assumed.

    npm install --prefix /tmp/katex katex@0.19.1            # the site's KaTeX, from the npm registry (no CDN here)
    python bench/site_screenshot.py --katex /tmp/katex/node_modules/katex/dist --page algorithms/d1 \
        --out bench/results/site-d1.png

Builds the site (``mkdocs build --strict``) into a temporary folder, points its KaTeX links (unpkg, as published) at
the local copy, and has headless Chromium (Debian's ``chromium``; ``--chromium`` for another) render the page to a
PNG. Prints how many formulas KaTeX rendered and how many it could not, read from the page's DOM; exits 1 when a
formula failed or none rendered on a page that has some.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CDN = re.compile(r"https://unpkg\.com/katex@[\d.]+/dist/")
# without these Chromium keeps calling Google's hosts, refused on a closed network (and slow to give up)
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def build(site: Path, katex: Path) -> None:
    """The site into ``site``, its KaTeX links on ``katex``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT, env=env,
                   check=True)
    for html in site.rglob("*.html"):
        text = html.read_text()
        if CDN.search(text):
            html.write_text(CDN.sub(katex.resolve().as_uri() + "/", text))


def chromium(binary: str, *args: str, timeout: int = 120) -> str:
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run([binary, *QUIET, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                             timeout=timeout)
    if res.returncode != 0:
        raise SystemExit(f"error: {binary} failed ({res.returncode}): {res.stderr[-800:]}")
    return res.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--katex", type=Path, required=True, help="KaTeX's dist folder (katex.min.js, ...)")
    parser.add_argument("--page", default="algorithms/d1", help="the page's path in the site, without index.html")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "site.png", help="the PNG to write")
    parser.add_argument("--size", default="1280,2400", help="window width,height in pixels")
    parser.add_argument("--chromium", default="chromium", help="the Chromium binary")
    args = parser.parse_args()
    if not (args.katex / "katex.min.js").exists():
        sys.exit(f"error: --katex {args.katex} has no katex.min.js (npm install katex: node_modules/katex/dist)")
    if shutil.which(args.chromium) is None:
        sys.exit(f"error: no {args.chromium} on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        build(site, args.katex)
        page = site / args.page / "index.html"
        if not page.exists():
            sys.exit(f"error: the site has no page {args.page} ({page})")
        url = page.as_uri()
        dom = chromium(args.chromium, "--virtual-time-budget=5000", "--dump-dom", url)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        chromium(args.chromium, "--virtual-time-budget=5000", f"--window-size={args.size}",
                 f"--screenshot={args.out.resolve()}", url)
    rendered, failed = dom.count('class="katex"'), dom.count("katex-error")
    formulas = dom.count("arithmatex")
    print(f"{args.page}: {formulas} formulas, {rendered} rendered by KaTeX, {failed} failed -> {args.out}")
    return 1 if failed or (formulas and not rendered) else 0


if __name__ == "__main__":
    sys.exit(main())
