"""The documentation site (docs/, mkdocs.yml; CI builds it with --strict): its generated tables match their
generators and the commands of its getting-started page run as written."""

import re
import shlex
import subprocess
import sys

from conftest import ROOT

DOCS = ROOT / "docs"


def test_the_algorithm_catalogue_is_generated_from_the_registry():
    from dare.algos.catalogue import catalogue
    page = (DOCS / "algorithms.md").read_text()
    block = page.split("<!-- algorithm-catalogue -->\n")[1].split("<!-- /algorithm-catalogue -->")[0]
    assert block == catalogue(), "docs/algorithms.md is stale: paste the second table of `python -m dare.algos`"


def test_each_algorithm_has_a_generated_page_with_its_objective():
    """docs/algorithms/NAME.md is ``python -m dare.algos --pages docs/algorithms``: the objective each algorithm file
    declares (display math that KaTeX can close), its docstring, knobs, recipes and commands."""
    from dare.algos import ALGORITHMS, known
    from dare.algos.catalogue import page
    assert sorted(p.stem for p in (DOCS / "algorithms").glob("*.md")) == sorted(known())
    for name in known():
        objective = ALGORITHMS.lookup(name).__dict__.get("objective", "")  # its own, not inherited
        assert objective.startswith("$$") and objective.count("$$") % 2 == 0, f"{name}: no display objective"
        assert objective.count("{") == objective.count("}"), f"{name}: unbalanced braces in its objective"
        assert (DOCS / "algorithms" / f"{name}.md").read_text() == page(name), \
            f"docs/algorithms/{name}.md is stale: python -m dare.algos --pages docs/algorithms"
    assert "\\mathcal{C}(\\rho, A) = \\min" in page("d1") and "| `p_prompt` | `0.15` | — |" in page("d1")


def nav_pages(entries) -> set[str]:
    return {p for e in entries for v in e.values() for p in (nav_pages(v) if isinstance(v, list) else {v})}


def test_every_page_is_in_the_navigation():
    import yaml
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert nav == {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}


def run_in_order(lines: list[str], tmp_path) -> list[str]:
    """Run each command line as written, every ``outputs/...`` argument moved into ``tmp_path``; their stdouts."""
    outs = []
    for line in lines:
        argv = [str(tmp_path / a) if a.startswith("outputs/") else a for a in shlex.split(line.split("  #")[0])[1:]]
        res = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert res.returncode == 0, (line, res.stderr[-2000:])
        outs.append(res.stdout)
    return outs


def test_the_getting_started_commands_run_as_written(tmp_path):
    """SFT, RL and evaluation of the RL output, in order, their output folders moved into ``tmp_path``."""
    page = (DOCS / "getting-started.md").read_text()
    lines = [line for line in page.splitlines() if line.startswith(("python train_", "python evaluate.py"))]
    assert [shlex.split(line)[1] for line in lines] == ["train_sft.py", "train_rl.py", "evaluate.py"]
    run_in_order(lines, tmp_path)
    assert (tmp_path / "outputs" / "rl-task" / "model.safetensors").exists()


def test_base_and_adapter_compare_in_one_report(tmp_path):
    """docs/evaluation.md: a LoRA run, the base and its adapter folder evaluated, one table of both."""
    section = (DOCS / "evaluation.md").read_text().split("# Base vs adapter")[1].split("\n# ")[0]
    lines = [line for line in section.splitlines() if line.startswith("python ")]
    assert len(lines) == 4
    table = run_in_order(lines, tmp_path)[-1]
    assert "| benchmark | base | lora |" in table and "sft-lora" in table, table
    assert (tmp_path / "outputs" / "base-vs-lora.png").stat().st_size > 0


def test_the_multi_gpu_page_shows_each_recipes_own_launch_line():
    """docs/scale-out.md repeats each recipe's first line (its launch command): a recipe that changes its launch
    changes the page."""
    page = (DOCS / "scale-out.md").read_text()
    for family in ("llada", "dream", "sdar", "llada2", "diffusion_gemma", "nemotron_diffusion"):
        for recipe in ("sft.yaml", "sft_lora.yaml", "d1_math.yaml"):
            line = (ROOT / "recipes" / family / recipe).read_text().splitlines()[0].lstrip("# ")
            assert line.startswith("accelerate launch ") and f"\n{line}\n" in page, (family, recipe)


def shell_lines(text: str) -> list[str]:
    """The lines of the ``bash`` blocks of ``text``, continuations joined, comments dropped."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S)).replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in blocks.splitlines() if line.strip()]


def test_every_training_command_of_the_docs_parses(monkeypatch, capsys):
    """Each ``train_rl.py`` / ``train_sft.py`` line of the README and every docs page (``python`` or ``accelerate
    launch``) parses with its script's own parser: a renamed or removed flag, or a recipe that is gone, fails here
    (the tiny ones also run: test_readme.py, the card test, getting-started)."""
    from conftest import load_script

    from dare.config import parse, peek
    monkeypatch.chdir(ROOT)  # recipes are named from the checkout's root
    text = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in sorted(DOCS.rglob("*.md")))
    checked = []
    for line in shell_lines(text):
        words = shlex.split(line) if "$" not in line else []  # shell variables: a cluster's own (scale-out)
        script = next((w for w in words if w in ("train_rl.py", "train_sft.py")), None)
        if script is None or "--help" in words:
            continue
        argv = words[words.index(script) + 1:]
        module = load_script(ROOT / script, f"dare_docs_{script[:-3]}")
        cls = module.args_class(peek("algo", argv, default="d1")) if script == "train_rl.py" else module.Args
        try:
            parse(cls, argv)
        except SystemExit as e:
            raise AssertionError(f"{line!r} does not parse") from e
        checked.append(script)
    with capsys.disabled():
        print(f"\ndocs: {checked.count('train_rl.py')} train_rl.py and {checked.count('train_sft.py')} train_sft.py "
              "commands parse")
    assert checked.count("train_rl.py") >= 25 and checked.count("train_sft.py") >= 15, checked
