"""Re-create and run the bad-input cases of shared/reports/bad-inputs.md (72 cases) plus our own (x.., "added").

    python bench/bad_inputs.py --out /tmp/bad                   # ~25 min on 2 cores; table in /tmp/bad/table.md
    python bench/bad_inputs.py --out /tmp/bad --only 'resume|2[67]_' --jobs 2

Fixtures are built under <out>/bad, each case writes to <out>/runs/<case>, its command and output to
<out>/logs/<case>.log. A case PASSes when its exit code is the expected one and, for an expected refusal (exit 2):
exactly one one-line `error:` message, no traceback, the message matching the case's `mention` (what the report
asked it to name) and its --output-dir, where one existed, unchanged; for an expected success: its `mention` in the
output and its `creates` file made. Cases that need ../shared (official configs, reference data) skip when it is absent.
"""

import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _bad_input_cases import BADUTF, CASES, EVB, LONG, RL, merge

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
       "DARE_DEBUG": "0", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # the package of this checkout


def sh(argv, **kw):
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, **kw)
    if out.returncode:
        sys.exit(f"fixture command failed: {shlex.join(argv)}\n{out.stderr[-3000:]}")


def damage(path: Path, seed=0):
    """Overwrite the first 4 kB with random bytes (the size stays: only reading the content finds it)."""
    data = bytearray(path.read_bytes())
    n = min(4096, len(data))
    data[:n] = random.Random(seed).randbytes(n)
    path.write_bytes(bytes(data))


def build_fixtures(B: Path, ro_mode: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if B.exists():
        if (B / "ro").exists():
            (B / "ro").chmod(0o755)  # a chmod 0555 folder of an earlier run
        shutil.rmtree(B)
    (B / "emptydir").mkdir(parents=True)
    rows = [json.loads(line) for line in (ROOT / "tests/data/addition.jsonl").read_text().splitlines()]
    pq.write_table(pa.table({"question": ["What is 2 + 5?"], "answer": ["7"]}), B / "wrong_cols.parquet")
    pq.write_table(pa.Table.from_pylist(rows).slice(0, 0), B / "empty.parquet")
    (B / "empty.jsonl").write_text("")
    (B / "garbage.parquet").write_bytes(random.Random(1).randbytes(4096))
    lines = [json.dumps(r).encode() for r in rows]
    lines[1] = lines[1].replace(b'"content": "', b'"content": "\xff\xfe', 1)
    (B / "nonutf8.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for name, text in [("wrong_types", "learning_rate: fast\n"), ("wrong_types2", "max_steps: [1, 2]\n"),
                       ("unknown_key", "learning_rat: 1.0e-5\n"), ("syntax", "model: [tiny:llada\nmax_steps: 2\n"),
                       ("unknown_nested", "rollout:\n  gen_lenght: 16\n")]:
        (B / f"{name}.yaml").write_text(text)
    (B / "output_is_file").write_text("keep me\n")
    (B / "ro").mkdir(0o555 if ro_mode == "chmod" else 0o755)
    # model folders from a saved tiny SDAR
    sh(["-c", "import sys; from dare.models import save_tiny; save_tiny('sdar', sys.argv[1])", str(B / "tiny_sdar")])
    for name in ("noweights", "corrupt", "truncated", "nomask"):
        shutil.copytree(B / "tiny_sdar", B / name)
    (B / "noweights/model.safetensors").unlink()
    (B / "corrupt/model.safetensors").write_bytes(random.Random(2).randbytes(4096))
    full = (B / "truncated/model.safetensors").read_bytes()
    (B / "truncated/model.safetensors").write_bytes(full[: len(full) // 2])
    for file, key in (("config.json", "mask_token_id"), ("tokenizer_config.json", "mask_token")):
        config = json.loads((B / "nomask" / file).read_text())
        config.pop(key, None)
        (B / "nomask" / file).write_text(json.dumps(config, indent=2))
    # checkpoints of a 2-step run, one file damaged in each copy; "mid" copies lack checkpoint-2 (resume trains step 2)
    sh(["train_rl.py", *merge(RL, f"--max-steps 2 --save-steps 1 --output-dir {B}/ck_src")], timeout=600)
    damaged = {"ck_weights": "checkpoint-2/model.safetensors", "ck_state": "checkpoint-2/trainer_state.json",
               "ck_optim": "checkpoint-2/optimizer.pt", "ck_mid_optim": "checkpoint-1/optimizer.pt",
               "ck_mid_weights": "checkpoint-1/model.safetensors", "ck_mid_rng": "checkpoint-1/rng_state.pth",
               "ck_incomplete": None, "ck_lora": None, "ck_algo": None, "ck_more": None, "ck_mid_ok": None}
    for name, file in damaged.items():
        shutil.copytree(B / "ck_src", B / name)
        if "mid" in name:
            shutil.rmtree(B / name / "checkpoint-2")
        if file:
            damage(B / name / file)
    (B / "ck_incomplete/checkpoint-2/COMPLETE").unlink()  # as if killed while writing it
    (B / "ck_incomplete/checkpoint-2/optimizer.pt").unlink()
    for name in ("ck_empty", "ck_must"):
        (B / name / "checkpoint-2").mkdir(parents=True)  # created, nothing written yet
    sh(["evaluate.py", *EVB.split(), "--output-dir", str(B / "eval_tiny")], timeout=600)
    shutil.copytree(B / "eval_tiny", B / "eval_tiny2")


def digest(path: Path) -> str:
    """A hash of a file, or of a folder's file names and contents."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def run_case(case, out: Path, ro_mode: str, timeout: int):
    name, (script, args), expect, mention, *rest = case
    opt = rest[0] if rest else {}
    B, R = out / "bad", out / "runs" / name
    subst = {"B": str(B), "R": str(R), "S": str(SHARED), "BADUTF": BADUTF, "LONG": LONG}
    fill = lambda s: re.sub(r"\{(B|R|S|BADUTF|LONG)\}", lambda m: subst[m[1]], s)
    args = [fill(a) for a in args]
    if (script != "evaluate.py" or "--bench" in args) and "--output-dir" not in args:
        args += ["--output-dir", str(R)]
    if opt.get("shared") and not SHARED.is_dir():
        return name, "-", 0.0, "", f"SKIP: {SHARED} is absent"
    if opt.get("ro") and ro_mode == "skip":
        return name, "-", 0.0, "", "SKIP: root ignores permission bits and `unshare -m` is unavailable"
    argv = [sys.executable, script, *args]
    if opt.get("ro") and ro_mode == "unshare":  # a private mount namespace with <B>/ro bound read-only
        argv = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift '
                '&& exec "$@"', "sh", str(B / "ro"), *argv]
    keep = Path(args[args.index("--output-dir") + 1]) if "--output-dir" in args else None
    keep = keep if expect == 2 and keep and keep.exists() else None
    before = keep and digest(keep)
    start = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=ROOT, env=ENV, input=opt.get("stdin", b""), capture_output=True, timeout=timeout)
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = "timeout", e.stdout or b"", e.stderr or b""
    stdout, stderr = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    wall = time.perf_counter() - start
    (out / "logs").mkdir(exist_ok=True)
    with open(out / "logs" / f"{name}.log", "w", errors="backslashreplace") as f:
        f.write(f"{shlex.join(argv)}\n# exit {rc}, {wall:.1f} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    lines = [s for s in re.split(r"[\r\n]+", stderr) if s.strip()]
    errors = [i for i, s in enumerate(lines) if s.startswith("error:")]
    last = ([s for s in re.split(r"[\r\n]+", stderr + "\n" + stdout) if s.strip()] or [""])[-1]
    first = (lines[errors[0]] if errors else f"(no error line) last: {last.strip()}").replace("`", "'")
    problems = [] if rc == expect else [f"exit {rc}, expected {expect}"]
    if expect == 2:
        if len(errors) != 1:
            problems.append(f"{len(errors)} `error:` lines")
        elif errors[0] + 1 < len(lines) and not lines[errors[0] + 1].startswith("(traceback in"):
            problems.append("the message spans several lines")
        if "Traceback (most recent call last)" in stderr:
            problems.append("traceback printed")
    text = (stdout + "\n" + stderr).replace("\r", "\n")
    if mention and not re.search(mention, first if expect == 2 else text, re.I | re.M):
        problems.append(f"does not mention /{mention}/")
    if opt.get("absent") and re.search(opt["absent"], text, re.M):
        problems.append(f"shows /{opt['absent']}/")
    if keep and digest(keep) != before:
        problems.append(f"changed files in {keep.name}/")
    if "creates" in opt and not Path(fill(opt["creates"])).exists():
        problems.append(f"{Path(fill(opt['creates'])).relative_to(out)} not made")
    return name, rc, wall, first, "PASS" if not problems else "FAIL: " + "; ".join(problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/bad", help="fixtures, runs, logs and table.md go here")
    ap.add_argument("--only", help="regex: run only the cases whose name matches")
    ap.add_argument("--jobs", type=int, default=1, help="cases run in parallel")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per case")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0
    unshare = root and shutil.which("unshare") and subprocess.run(["unshare", "-m", "true"]).returncode == 0
    ro_mode = "unshare" if unshare else "skip" if root else "chmod"
    cases = [c for c in CASES if not a.only or re.search(a.only, c[0])]
    print(f"building fixtures in {out / 'bad'} ...", flush=True)
    build_fixtures(out / "bad", ro_mode)
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        futures = [pool.submit(run_case, c, out, ro_mode, a.timeout) for c in cases]
        for f in futures:
            name, rc, wall, _, verdict = f.result()
            print(f"{name}: exit {rc}, {wall:.1f} s, {verdict}", flush=True)
        results = [f.result() for f in futures]
    rows = ["| case | exit | wall s | first line | verdict |", "|---|---|---|---|---|"]
    for name, rc, wall, first, verdict in results:
        label = f"{name} (added)" if name.startswith("x") else name
        first = f"`{first[:150]}`".replace("|", "\\|") if first else ""
        rows.append(f"| {label} | {rc} | {wall:.1f} | {first} | {verdict.replace('|', '/')} |")
    tally = collections.Counter(verdict.split(":")[0] for *_, verdict in results)
    n_report = sum(not r[0].startswith("x") for r in results)
    rows += ["", f"Tally ({n_report} report cases + {len(results) - n_report} added): "
             + ", ".join(f"**{v} {k}**" for k, v in sorted(tally.items())) + "."]
    text = "\n".join(rows) + "\n"
    print("\n" + text)
    (out / "table.md").write_text(text, errors="backslashreplace")
    return 0 if not tally.get("FAIL") else 1


if __name__ == "__main__":
    sys.exit(main())
