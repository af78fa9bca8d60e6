"""The README stays true: its Python example runs and its shell commands name files that exist."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", PAGES, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "outputs" / "tiny-llada" / "config.json").exists()


PAGES = README + "".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))  # README + docs site


def test_commands_refer_to_real_files():
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", PAGES, flags=re.S))
    for script in re.findall(r"python ([\w/]+\.py)", shell):
        assert (ROOT / script).exists(), script
    tests = "python -m pytest -q -n 2 --dist loadfile"  # CI runs the README's test command as written
    assert tests in shell and tests in (ROOT / ".ci" / "run").read_text()
    assert "python -m ruff check ." in shell and "python -m ruff check ." in (ROOT / ".ci" / "run").read_text()
    assert "lint-imports" in shell and "lint-imports" in (ROOT / ".ci" / "run").read_text()
    for recipe in re.findall(r"--config ([^\s\"']+)", shell):
        assert (ROOT / recipe).exists(), recipe
    for req in re.findall(r"-r (\S+)", shell):
        assert req == "req-gpu.txt" or (ROOT / req).exists(), req


def tiny_name(model: str) -> str:
    for key, family in (("tiny:", None), ("diffusiongemma", "diffusion_gemma"),
                        ("LLaDA2", "llada2"), ("LLaDA", "llada"), ("Dream", "dream"),
                        ("SDAR-30B", "sdar_moe"), ("SDAR", "sdar"), ("TraDo", "sdar")):
        if key in model:
            return model if family is None else f"tiny:{family}"
    raise AssertionError(f"README names a model of no known family: {model}")


def test_evaluate_commands_run_with_tiny_stand_ins(tmp_path):
    """Each README and docs `python evaluate.py ...` line runs as written, with hub models swapped for tiny stand-ins of
    the same family (no downloads here); chat-mode lines get one user turn on stdin."""
    import shlex
    import subprocess
    import sys
    lines = [ln.split("#")[0].strip() for ln in PAGES.splitlines() if ln.startswith("python evaluate.py")
             and "--engine sglang" not in ln  # SGLang's own environment: tests/test_sglang_real.py runs those
             and " outputs/" not in ln]  # a model an earlier command of its page trains: tests/test_docs.py
    assert lines
    for i, line in enumerate(lines):
        argv = shlex.split(line)[2:]
        if "--compare" in argv:  # needs earlier reports; tests/test_eval.py covers it
            continue
        if "--data-dir" in argv:
            folder = ROOT / argv[argv.index("--data-dir") + 1]
            if not folder.is_dir():
                continue  # ../shared is absent
            argv[argv.index("--data-dir") + 1] = str(folder)
        if "--bench" in argv and "--limit" not in argv:
            argv += ["--limit", "2"]
        model = argv[argv.index("--model") + 1]
        argv[argv.index("--model") + 1] = tiny_name(model)
        if not model.startswith("tiny:") and "--gen-length" in argv:  # a stand-in need not decode a long answer
            argv[argv.index("--gen-length") + 1] = "32"
            if "--steps" in argv:
                argv[argv.index("--steps") + 1] = "32"
        (tmp_path / str(i)).mkdir()  # each line its own outputs/eval (a folder refuses another run's samples)
        res = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *argv], input="hello\n", text=True,
                             capture_output=True, timeout=300, cwd=tmp_path / str(i))
        assert res.returncode == 0, (line, res.stderr[-2000:])
        assert "tokens/s" in res.stderr, line


def run_readme_line(prefix: str, tmp_path):
    """Run the README or docs line that starts with ``prefix`` as written, its --output-dir moved into
    ``tmp_path``."""
    import shlex
    import subprocess
    import sys
    line = next(ln for ln in PAGES.splitlines() if ln.startswith(prefix))
    argv = shlex.split(line)[1:]
    argv[argv.index("--output-dir") + 1] = str(tmp_path / "out")
    res = subprocess.run([sys.executable, str(ROOT / argv[0]), *argv[1:]], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return tmp_path / "out"


@pytest.mark.parametrize("prefix", ["python train_sft.py --model tiny:diffusion_gemma ",
                                    "python train_sft.py --model tiny:llada --data.path task:sum4 ",  # no key flags
                                    "python train_sft.py --model tiny:sdar "])
def test_tiny_training_command_runs_as_written(tmp_path, prefix):
    assert (run_readme_line(prefix, tmp_path) / "model.safetensors").exists()


def test_tiny_rl_command_runs_as_written(tmp_path):
    out = run_readme_line("python train_rl.py --algo d1 --model tiny:", tmp_path)
    assert (out / "model.safetensors").exists() and (out / "completions.jsonl").exists()


def test_tiny_uniform_noise_rl_command_runs_as_written(tmp_path):
    out = run_readme_line("python train_rl.py --algo gdpo --model tiny:diffusion_gemma", tmp_path)
    assert (out / "model.safetensors").exists()


def test_tiny_preference_command_runs_as_written(tmp_path):
    assert (run_readme_line("python train_rl.py --algo vrpo --model tiny:", tmp_path) / "model.safetensors").exists()


def test_algorithm_matrix_is_generated_from_the_registry():
    from dare.algos import matrix
    block = README.split("<!-- algorithm-matrix -->\n")[1].split("<!-- /algorithm-matrix -->")[0]
    assert block == matrix(), "README's algorithm matrix is stale: paste the output of `python -m dare.algos`"


def test_linter_is_clean():
    """The README's lint command (ruff, configured in pyproject.toml: pyflakes, bugbear, pyupgrade, ...) finds
    nothing."""
    pytest.importorskip("ruff")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]


def test_imports_only_go_down():
    """import-linter's contracts (pyproject.toml: the floors, the forbidden pairs, no cycle inside a package) hold."""
    pytest.importorskip("importlinter")
    out = subprocess.run(["lint-imports"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and " kept, 0 broken" in out.stdout, out.stdout[-3000:]


def test_layout_names_every_module():
    """The layout (docs/extending.md) names every module and package of dare/ (a new one is placed on a floor there)."""
    layout = (ROOT / "docs" / "extending.md").read_text().split("## Layout\n")[1].split("\n## ")[0]
    names = {p.stem for p in (ROOT / "dare").glob("*.py") if p.stem != "__init__" and not p.stem.startswith("_")}
    names |= {p.name for p in (ROOT / "dare").iterdir() if (p / "__init__.py").exists()}
    names |= {p.stem for pkg in ("sampling", "engines", "rewards/sandbox") for p in (ROOT / "dare" / pkg).glob("*.py")
              if p.stem != "__init__"}
    missing = sorted(n for n in names if not re.search(rf"\b{n}(\.py|/)?\b", layout))
    assert not missing, f"the layout does not name {missing}"


@pytest.mark.parametrize("script", ["train_rl.py", "train_sft.py"])
def test_local_copy_commands_run_as_written(script, tmp_path):
    """The README's offline line (the recipe + --data-dir, evaluate.py's name and the training scripts' alias of
    --data.local-dir) runs as written, with the 8B model swapped for a tiny one of its family and one short step
    appended."""
    import shlex
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("../shared is absent")
    line = next(ln for ln in PAGES.splitlines() if ln.startswith(f"python {script} ") and "--data-dir" in ln)
    argv = shlex.split(line.split("#")[0])[1:]
    short = {"train_rl.py": ["--prompts-per-step", "2", "--num-generations", "2", "--micro-batch-size", "2",
                             "--rollout.gen-length", "8", "--rollout.block-length", "8", "--rollout.steps", "8",
                             "--data.limit", "2", "--data.eval-path", "None"],
             "train_sft.py": ["--per-device-train-batch-size", "1", "--gradient-accumulation-steps", "1",
                              "--data.limit", "2", "--data.max-length", "1024", "--data.eval-limit", "4",
                              "--eval-generate", "2", "--eval-sampling.gen-length", "8"]}[script]
    argv += ["--model", "tiny:llada", "--max-steps", "1", "--save-steps", "1", "--no-bf16",
             "--no-gradient-checkpointing", "--report-to", "none", "--output-dir", str(tmp_path / "out"), *short]
    res = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_reproduction_table_is_generated_and_measures_nothing_by_hand():
    """The README's reproduction table is bench/reproduce.py's, with an empty "DARE measured" column (only a GPU run
    of the commands fills it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("reproduce", ROOT / "bench" / "reproduce.py")
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    assert reproduce.table({}) in PAGES
    assert all(row.source for row in reproduce.ROWS)
    for row in reproduce.ROWS:
        files = re.findall(r"python ([\w/]+\.py)", row.command) + re.findall(r"--config (\S+)", row.command)
        for script in files + re.findall(r"^opencompass (\S+)", row.command):
            assert (ROOT / script).exists(), script


def test_the_readme_sections_the_code_points_to_exist():
    """Help texts and comments point users to README sections (the resume flags pointed to a "Resume" section that
    did not exist): each named section is a heading or a bold paragraph title of the README."""
    def titles(text):
        return set(re.findall(r"^#+ (.+)$", text, re.M)) | set(re.findall(r"^\*\*(.+?)\.?\*\*", text, re.M))

    sources = {path.name: re.sub(r"\s*\n#\s*", " ", path.read_text()) for path in ROOT.rglob("*.py")
               if ".git" not in path.parts and path.name != "test_readme.py"}  # comments joined across lines
    refs = {(name, "README.md", ref) for name, text in sources.items()
            for ref in re.findall(r'README[ ,]*"([^"]+)"', text)}
    refs |= {(name, page, ref) for name, text in sources.items()
             for page, ref in re.findall(r'(docs/[\w-]+\.md)[ ,]*"([^"]+)"', text)}
    assert {page for _, page, _ in refs} >= {"docs/sglang.md", "docs/benchmarks.md"}, "the patterns find the references"
    missing = sorted((name, page, ref) for name, page, ref in refs if not (ROOT / page).exists()
                     or not any(t.startswith(ref) for t in titles((ROOT / page).read_text())))
    assert not missing, missing


def test_every_algorithm_has_a_card_whose_command_runs(tmp_path):
    """``python -m dare.algos`` says what each algorithm is (its paper, kind and recipe with its rate) and
    ``python -m dare.algos NAME`` prints one card, whose tiny command runs as written."""
    import shlex

    from dare.algos import known
    from dare.algos.catalogue import card, catalogue
    rows = catalogue().splitlines()[2:]
    assert [r.split(" | ")[0][2:] for r in rows] == known()
    assert all(re.search(r"\| arXiv \d{4}\.\d{4,5} \| (online RL|offline pairs) \| `recipes/", r) for r in rows), rows
    d1 = card("d1")
    assert "p_prompt = 0.15" in d1 and "advantage = 'drgrpo'  (GRPO: 'grpo')" in d1
    assert "recipes/llada/d1_math.yaml (5e-07)" in d1
    assert "not on diffusion_gemma: its noise is uniform" in card("vrpo")
    command = next(line.strip() for line in d1.splitlines() if line.strip().startswith("python train_rl.py"))
    argv = shlex.split(command)
    argv[argv.index("--output-dir") + 1] = str(tmp_path / "out")
    res = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0 and (tmp_path / "out" / "model.safetensors").exists(), res.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "dare.algos", "cj_grpo"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1 and "did you mean 'cj-grpo'?" in out.stderr
