"""The documentation site (docs/, mkdocs.yml; CI builds it with --strict): its generated tables match their
generators and the commands of its getting-started page run as written."""

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


def test_every_page_is_in_the_navigation():
    import yaml
    nav = {page for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"] for page in entry.values()}
    assert nav == {p.name for p in DOCS.glob("*.md")}


def test_the_getting_started_commands_run_as_written(tmp_path):
    """SFT, RL and evaluation of the RL output, in order, their output folders moved into ``tmp_path``."""
    page = (DOCS / "getting-started.md").read_text()
    lines = [line for line in page.splitlines() if line.startswith(("python train_", "python evaluate.py"))]
    assert [shlex.split(line)[1] for line in lines] == ["train_sft.py", "train_rl.py", "evaluate.py"]
    for line in lines:
        argv = shlex.split(line.split("  #")[0])[1:]
        for flag in ("--output-dir", "--model"):
            if flag in argv and argv[argv.index(flag) + 1].startswith("outputs/"):
                argv[argv.index(flag) + 1] = str(tmp_path / argv[argv.index(flag) + 1])
        res = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert res.returncode == 0, (line, res.stderr[-2000:])
    assert (tmp_path / "outputs" / "rl-task" / "model.safetensors").exists()


def test_the_multi_gpu_page_shows_each_recipes_own_launch_line():
    """docs/scale-out.md repeats each recipe's first line (its launch command): a recipe that changes its launch
    changes the page."""
    page = (DOCS / "scale-out.md").read_text()
    for family in ("llada", "dream", "sdar", "llada2", "diffusion_gemma"):
        for recipe in ("sft.yaml", "sft_lora.yaml", "d1_math.yaml"):
            line = (ROOT / "recipes" / family / recipe).read_text().splitlines()[0].lstrip("# ")
            assert line.startswith("accelerate launch ") and f"\n{line}\n" in page, (family, recipe)
