"""The trajectory viewer: one cell per generated token with its step, grouped by block, safe against odd tokens."""

import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from dare.eval.trajectory import write_trajectory_html
from dare.models import tiny

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
    res = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "tiny:sdar", "--prompt", "Hi",
                          "--gen-length", "12", "--trajectory", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    cells = cells_of(out.read_text())
    assert 0 < len(cells) <= 12 and "block = 4" in out.read_text()
    assert sorted(c["step"] for c in cells) == sorted(c["step"] for c in cells if c["step"] >= 0)


def test_length_mismatch_is_an_error(tmp_path):
    import pytest
    _, tok = tiny("dream")
    with pytest.raises(ValueError, match="3 tokens but 2 step entries"):
        write_trajectory_html(str(tmp_path / "x.html"), tok, torch.tensor([5, 6, 7]), torch.tensor([0, 1]))
