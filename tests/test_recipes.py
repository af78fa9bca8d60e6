"""Every recipe under recipes/ parses into its script's Args (train_sft.py for sft*.yaml, train_rl.py for the rest;
unknown keys raise), names a known model family and points at data that exists; every accelerate config under
accelerate_configs/ loads with the installed accelerate."""

import pytest
from conftest import ROOT, load_script

import train_rl
import train_sft
from dare.config import parse, peek
from dare.models import Family, tiny

RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
SFT_RECIPES = [p for p in RECIPES if p.stem.startswith("sft")]
EVAL_RECIPES = [p for p in RECIPES if p.stem.startswith("eval")]
RL_RECIPES = [p for p in RECIPES if p not in SFT_RECIPES + EVAL_RECIPES]
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
FAMILY_MARKERS = {"llada": "LLaDA-", "dream": "Dream", "sdar": "SDAR", "llada2": "LLaDA2"}


def test_recipes_exist():
    assert {p.parent.name for p in SFT_RECIPES} >= set(FAMILY_MARKERS)
    assert {p.parent.name for p in RL_RECIPES} >= set(FAMILY_MARKERS)
    assert len(SFT_RECIPES) >= 2 * len(FAMILY_MARKERS)


def check_paths(path, *paths):
    if not (ROOT.parent / "shared").is_dir():
        pytest.skip("../shared is absent: data path not checked")
    for data in (ROOT / p.strip() for group in paths for p in group.split(",")):
        assert data.exists(), f"{path.name}: {data} does not exist"


@pytest.mark.parametrize("path", SFT_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_sft_recipe_parses(path):
    assert path.read_text().startswith("# accelerate launch "), "first line: the launch command"
    args = parse(train_sft.Args, ["--config", str(path)])
    family = path.parent.name
    assert FAMILY_MARKERS[family] in args.model, f"{args.model} is not a {family} model"
    assert isinstance(args.learning_rate, float) and 0 < args.learning_rate < 1e-3
    assert args.data.prompt_key and args.data.response_key and args.data.max_length > 0
    assert (args.lora.rank > 0) == path.stem.endswith("lora")
    check_paths(path, args.data.path)


@pytest.mark.parametrize("path", RL_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_rl_recipe_parses(path):
    assert path.read_text().startswith("# accelerate launch "), "first line: the launch command"
    algo = peek("algo", ["--config", str(path)])
    assert algo and path.stem.startswith(algo.replace("-", "_")), f"{path.name}: file name should start with {algo}"
    args = parse(train_rl.args_class(algo), ["--config", str(path)])
    family = path.parent.name
    assert FAMILY_MARKERS[family] in args.model, f"{args.model} is not a {family} model"
    assert isinstance(args.learning_rate, float) and 0 < args.learning_rate < 1e-3
    model, tokenizer = tiny(family)
    fam = Family.from_pretrained(model.config, tokenizer)
    args.algo_config.validate(fam)
    args.rollout.resolve(fam).validate()
    args.validation.resolve(fam).validate()
    if getattr(type(args.algo_config), "offline", False):  # preference pairs, usually a hub name: not checked
        assert args.preference.path and args.preference.chosen_key and args.preference.rejected_key
        return
    assert args.save_steps % args.algo_config.cycle == 0
    check_paths(path, args.data.path, *([args.data.eval_path] if args.data.eval_path else []))


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    config = load_config_from_file(str(path))  # unknown top-level keys raise
    dests = {a.dest for a in launch_command_parser()._actions}
    for section in ("fsdp_config", "deepspeed_config"):
        unknown = set(getattr(config, section) or {}) - dests  # the launcher copies these into its args silently
        assert not unknown, f"{path.name}: {section} keys unknown to accelerate launch: {unknown}"


@pytest.mark.parametrize("path", EVAL_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_eval_recipe_parses(path):
    import tyro
    from dare.eval.benchmarks import known
    assert path.read_text().startswith("# accelerate launch evaluate.py "), "first line: the launch command"
    # loaded by path: the module name `evaluate` belongs to HF's package once the OpenCompass extra is imported
    script = load_script(ROOT / "evaluate.py", "dare_evaluate_script")
    args = parse(script.Args, ["--config", str(path)], config=(tyro.conf.OmitArgPrefixes,))
    family = path.parent.name
    assert FAMILY_MARKERS[family] in args.model
    assert all(b in known() for b in args.bench.split(","))
    model, tokenizer = tiny(family)
    args.sampling.resolve(Family.from_pretrained(model.config, tokenizer)).validate()


def test_paper_profiles_inherit_their_base_recipe():
    """``base:`` merges section by section: the paper profile changes its knobs and keeps the rest of DARE's recipe."""
    from dare.config import load_recipe
    for name in ("d1", "coupled_grpo", "cj_grpo"):
        paper, base = (load_recipe(ROOT / "recipes" / "llada" / f"{name}_math{s}.yaml") for s in ("_paper", ""))
        assert "base" not in paper and paper["algo"] == base["algo"] and paper["data"] == base["data"]
        assert paper["algo_config"]["eps_high"] == 0.5 != base["algo_config"]["eps_high"]
        assert paper["algo_config"]["dual_clip"] is None
        assert {k: v for k, v in paper["algo_config"].items() if k not in ("num_iterations", "eps_low", "eps_high",
                "beta", "kl", "dual_clip", "advantage")} == {k: v for k, v in base["algo_config"].items() if k not in (
                "num_iterations", "eps_low", "eps_high", "beta", "kl", "dual_clip", "advantage")}
