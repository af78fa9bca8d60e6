"""Every recipe under recipes/ parses into train_sft.Args (unknown keys raise), names a known model family and points
at data that exists; every accelerate config under accelerate_configs/ loads with the installed accelerate."""

from pathlib import Path

import pytest

import train_sft
from dare.config import parse

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
FAMILY_MARKERS = {"llada": "LLaDA-", "dream": "Dream", "sdar": "SDAR", "llada2": "LLaDA2"}


def test_recipes_exist():
    assert {p.parent.name for p in RECIPES} >= set(FAMILY_MARKERS)
    assert len(RECIPES) >= 2 * len(FAMILY_MARKERS)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_parses(path):
    assert path.read_text().startswith("# accelerate launch "), "first line: the launch command"
    args = parse(train_sft.Args, ["--config", str(path)])
    family = path.parent.name
    assert FAMILY_MARKERS[family] in args.model, f"{args.model} is not a {family} model"
    assert isinstance(args.learning_rate, float) and 0 < args.learning_rate < 1e-3
    assert args.data.prompt_key and args.data.response_key and args.data.max_length > 0
    assert (args.lora.rank > 0) == path.stem.endswith("lora")
    data = ROOT / args.data.path
    if not (ROOT.parent / "shared").is_dir():
        pytest.skip("../shared is absent: data path not checked")
    assert data.exists(), f"{path.name}: {data} does not exist"


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    config = load_config_from_file(str(path))  # unknown top-level keys raise
    dests = {a.dest for a in launch_command_parser()._actions}
    for section in ("fsdp_config", "deepspeed_config"):
        unknown = set(getattr(config, section) or {}) - dests  # the launcher copies these into its args silently
        assert not unknown, f"{path.name}: {section} keys unknown to accelerate launch: {unknown}"
