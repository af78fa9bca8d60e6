"""The trajectory viewer: one cell per generated token with its step, grouped by block, safe against odd tokens;
the prompt, visible whitespace, a colour legend, the confidence of each token at its commit, and long answers that
wrap (many blocks per line)."""

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare.eval.trajectory import committed_confidences, write_trajectory_html
from dare.models import Family, tiny
from dare.sampling import SamplingConfig, generate

ROOT = Path(__file__).resolve().parents[1]


def cells_of(page: str) -> list[dict]:
    return json.loads(re.search(r"const cells = (\[.*?\]), block", page, re.S).group(1).replace("<\\/", "</"))


def test_cells_carry_tokens_and_steps(tmp_path):
    _, tok = tiny("llada")
    ids = tok("hello </script> world", add_special_tokens=False)["input_ids"]
    steps = list(range(len(ids)))[::-1]
    steps[-1] = -1  # padding after an early stop is left out
    page = Path(write_trajectory_html(str(tmp_path / "t.html"), tok, ids, steps, block=4)).read_text()
    cells = cells_of(page)
    assert [c["step"] for c in cells] == steps[:-1]
    assert "".join(c["text"] for c in cells) == tok.decode(ids[:-1])
    assert page.count("</script>") == 1  # the token text cannot close the script element
    assert "const cells" in page and "block = 4" in page


def test_evaluate_writes_the_page(tmp_path):
    out = tmp_path / "traj.html"
    res = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "tiny:sdar", "--prompt", "Hi <b>",
                          "--gen-length", "12", "--trajectory", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    cells = cells_of(page)
    assert 0 < len(cells) <= 12 and "block = 4" in page
    assert sorted(c["step"] for c in cells) == sorted(c["step"] for c in cells if c["step"] >= 0)
    assert '<div class="text" id="prompt">Hi &lt;b&gt;</div>' in page  # the user's message, escaped
    assert all(0 < c["conf"] <= 1 for c in cells)  # recorded for the page (record_states)


def test_length_mismatch_is_an_error(tmp_path):
    import pytest
    _, tok = tiny("dream")
    with pytest.raises(ValueError, match="3 tokens but 2 step entries"):
        write_trajectory_html(str(tmp_path / "x.html"), tok, torch.tensor([5, 6, 7]), torch.tensor([0, 1]))


def test_page_shows_prompt_visible_whitespace_legend_and_confidences(tmp_path):
    _, tok = tiny("llada")
    ids = tok("a b\n\tc", add_special_tokens=False)["input_ids"]
    conf = [0.5 + 0.1 * i for i in range(len(ids))]
    conf[0] = None  # unknown for one token
    prompt = "Add <x> & y\n__CELLS__ please"  # escaped, and never taken for a slot of the page
    page = Path(write_trajectory_html(str(tmp_path / "t.html"), tok, ids, list(range(len(ids))), block=4,
                                      prompt=prompt, confidences=conf)).read_text()
    assert f'<div class="text" id="prompt">{html.escape(prompt)}</div>' in page
    cells = cells_of(page)
    shown = "".join(c["shown"] for c in cells)
    assert "·" in shown and "↵" in shown and "→" in shown and " " not in shown and "\n" not in shown
    assert "".join(c["text"] for c in cells) == tok.decode(ids)  # the raw text is kept for the tooltip
    assert "conf" not in cells[0] and [c["conf"] for c in cells[1:]] == pytest.approx(conf[1:])
    assert 'id="legend"' in page and "step fixed (early → late)" in page and "confidence at commit" in page
    assert 'value="conf" disabled' not in page and "mean confidence at commit" in page
    plain = Path(write_trajectory_html(str(tmp_path / "p.html"), tok, ids, list(range(len(ids))))).read_text()
    assert 'value="conf" disabled' in plain and "(not given)" in plain  # no confidences: that view is off
    with pytest.raises(ValueError, match="confidences"):
        write_trajectory_html(str(tmp_path / "x.html"), tok, ids, list(range(len(ids))), confidences=[0.5])


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_confidences_at_commit_come_from_the_recorded_decoding(name):
    model, tok = tiny(name)
    fam = Family.from_pretrained(model.config, tok)
    ids = torch.randint(16, fam.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    cfg = SamplingConfig(gen_length=8, block_length=None if fam.block_size else 4, steps=fam.block_size or 4,
                         stop_at_eos=False, record_states=True)
    out = generate(model, fam, ids, torch.ones_like(ids), cfg)
    for row in range(2):  # here step k is the k-th recorded state: the probability of the token at its step
        conf = committed_confidences(out.states, out.confidences, fam.mask_id, row)
        expected = [float(out.confidences[s][row, i]) for i, s in enumerate(out.step_map[row].tolist())]
        assert conf == pytest.approx(expected) and all(0 < c <= 1 for c in conf)
    odd = generate(model, fam, ids[:, :5], torch.ones_like(ids[:, :5]), cfg)  # SDAR: the first block is shorter,
    conf = committed_confidences(odd.states, odd.confidences, fam.mask_id, 1)  # its steps skip a number
    assert len(conf) == 8 and all(0 < c <= 1 for c in conf)
    dual = generate(model, fam, ids, torch.ones_like(ids), SamplingConfig(gen_length=8, cache="dual",
                                                                          record_states=True)) if not fam.block_size \
        else None
    assert dual is None or committed_confidences(dual.states, dual.confidences, fam.mask_id) is None


def long_page(tmp_path) -> str:
    """A 256-token SDAR-like answer in blocks of 4 (steps in a shuffled order inside each block)."""
    _, tok = tiny("sdar")
    ids = (tok("The sum of 15 and 4 is 19.\nSo the answer is 19. ", add_special_tokens=False)["input_ids"] * 40)[:256]
    steps = [b + (3 - i) for b in range(0, 256, 4) for i in range(4)]
    return write_trajectory_html(str(tmp_path / "long.html"), tok, ids, steps, block=4, prompt="What is 15 + 4?",
                                 confidences=[0.9] * 256)


def test_a_long_answer_wraps_many_blocks_per_line(tmp_path):
    page = Path(long_page(tmp_path)).read_text()
    css = {m.group(1).strip(): m.group(2) for m in re.finditer(r"^([#.\w ,]+)\{([^}]*)\}", page, re.M)}
    assert "flex-wrap: wrap" in css["#t"] and "display: flex" in css["#t"]  # blocks flow and wrap
    assert "display: inline-flex" in css[".block"]  # a block is a box in the line, not a line of its own
    assert len(cells_of(page)) == 256 and "block = 4" in page


CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless chromium to lay the page out")
def test_a_256_token_block_4_answer_renders_in_far_fewer_than_64_lines(tmp_path):
    path = long_page(tmp_path)
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900",
                          "--dump-dom", f"file://{path}"], capture_output=True, text=True, timeout=120).stdout
    rows = int(re.search(r'data-rows="(\d+)"', dom).group(1))
    assert 0 < rows <= 16, rows  # one line per block would be 64
