"""The README stays true: its Python example runs and its shell commands name files that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "outputs" / "tiny-llada" / "config.json").exists()


def test_commands_refer_to_real_files():
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", README, flags=re.S))
    for script in re.findall(r"python ([\w/]+\.py)", shell):
        assert (ROOT / script).exists(), script
    assert "python -m pytest -q" in shell and "python -m pytest -q" in (ROOT / ".ci" / "run").read_text()
    for req in re.findall(r"-r (\S+)", shell):
        assert req in ("requirements.txt", "req-gpu.txt") and (ROOT / "requirements.txt").exists()
