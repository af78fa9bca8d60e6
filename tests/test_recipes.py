"""Every recipe under recipes/ parses into its script's Args (train_sft.py for sft*.yaml, train_rl.py for the rest;
unknown keys raise), names a known model family and reads public datasets by hub name whose local copies exist; every
accelerate config under accelerate_configs/ loads with the installed accelerate."""

import pytest
from conftest import ROOT, SHARED, load_script

import train_rl
import train_sft
from dare.config import parse, peek
from dare.data.public import PUBLIC
from dare.models import Family, tiny

STANDIN_RECIPES = sorted((ROOT / "recipes" / "standin").glob("*.yaml"))  # bench models: tests/test_benches.py
RECIPES = sorted(set((ROOT / "recipes").rglob("*.yaml")) - set(STANDIN_RECIPES))
SFT_RECIPES = [p for p in RECIPES if p.stem.startswith("sft")]
EVAL_RECIPES = [p for p in RECIPES if p.stem.startswith("eval")]
RL_RECIPES = [p for p in RECIPES if p not in SFT_RECIPES + EVAL_RECIPES]
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
FAMILY_MARKERS = {"llada": "LLaDA-", "dream": "Dream", "sdar": "SDAR", "llada2": "LLaDA2",
                  "diffusion_gemma": "diffusiongemma", "nemotron_diffusion": "Nemotron-Labs-Diffusion"}
# checkpoints of a family's architecture under another name: TraDo (SDAR's), a causal LM dare.convert made ("a2d-")
CHECKPOINTS = {"sdar": ("TraDo", "outputs/a2d-"), "dream": ("outputs/a2d-",)}


def of_family(model: str, family: str) -> bool:
    return any(marker in model for marker in (FAMILY_MARKERS[family], *CHECKPOINTS.get(family, ())))


def test_recipes_exist():
    assert {p.parent.name for p in SFT_RECIPES} >= set(FAMILY_MARKERS)
    # no RL recipe for DiffusionGemma: no algorithm's estimator is derived for uniform noise yet (python -m dare.algos)
    assert {p.parent.name for p in RL_RECIPES} >= set(FAMILY_MARKERS) - {"diffusion_gemma"}
    assert len(SFT_RECIPES) >= 2 * len(FAMILY_MARKERS)


def check_paths(path, local: str, *paths: tuple[str, str]):
    """Every data source of the recipe is a public dataset by hub name (or a generated task), and the local copy that
    ``--data.local-dir ../shared/data/<local>`` reads instead exists."""
    for group, split in paths:
        for name in (p.strip() for p in group.split(",")):
            assert name in PUBLIC or name.startswith("task:"), f"{path.name}: {name} is not a public dataset"
            if name in PUBLIC and SHARED.is_dir():
                assert PUBLIC[name].local(split, str(SHARED / "data" / local)).exists()


@pytest.mark.parametrize("path", SFT_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_sft_recipe_parses(path):
    assert path.read_text().startswith("# accelerate launch "), "first line: the launch command"
    args = parse(train_sft.Args, ["--config", str(path)])
    family = path.parent.name
    assert of_family(args.model, family), f"{args.model} is not a {family} model"
    assert isinstance(args.learning_rate, float) and 0 < args.learning_rate < 1e-3
    assert args.data.prompt_key and args.data.response_key and args.data.max_length > 0
    assert (args.lora.rank > 0) == path.stem.endswith("lora")
    check_paths(path, "sft", (args.data.path, "train"))


@pytest.mark.parametrize("path", RL_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_rl_recipe_parses(path):
    assert path.read_text().startswith("# accelerate launch "), "first line: the launch command"
    algo = peek("algo", ["--config", str(path)])
    assert algo and path.stem.startswith(algo), f"{path.name}: file name should start with {algo}"
    args = parse(train_rl.args_class(algo), ["--config", str(path)])
    family = path.parent.name
    assert of_family(args.model, family), f"{args.model} is not a {family} model"
    assert isinstance(args.learning_rate, float) and 0 < args.learning_rate < 1e-3
    model, tokenizer = tiny(family)
    fam = Family.from_pretrained(model.config, tokenizer)
    args.algo_config.validate(fam)
    args.rollout.resolve(fam).validate()
    args.validation.over(args.rollout).resolve(fam).validate()
    if args.algo_config.trainer == "preference":  # preference pairs, usually a hub name: not checked
        assert args.preference.path and args.preference.chosen_key and args.preference.rejected_key
        return
    assert args.save_steps % args.algo_config.cycle == 0
    held_out = [(args.data.eval_path, "test")] if args.data.eval_path else []
    check_paths(path, "rl", (args.data.path, "train"), *held_out)


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
    assert of_family(args.model, family), f"{args.model} is not a {family} model"
    assert all(b in known() for b in args.bench.split(","))
    model, tokenizer = tiny(family)
    args.sampling.resolve(Family.from_pretrained(model.config, tokenizer)).validate()


def test_paper_profiles_inherit_their_base_recipe():
    """``base:`` merges section by section: the paper profile changes its knobs and keeps the rest of DARE's recipe."""
    from dare.config import load_recipe
    for name in ("d1", "coupled-grpo", "cj-grpo"):
        paper, base = (load_recipe(ROOT / "recipes" / "llada" / f"{name}_math{s}.yaml") for s in ("_paper", ""))
        assert "base" not in paper and paper["algo"] == base["algo"] and paper["data"] == base["data"]
        assert paper["algo_config"]["eps_high"] == 0.5 != base["algo_config"]["eps_high"]
        assert paper["algo_config"]["dual_clip"] is None
        assert {k: v for k, v in paper["algo_config"].items() if k not in ("num_iterations", "eps_low", "eps_high",
                "beta", "kl", "dual_clip", "advantage")} == {k: v for k, v in base["algo_config"].items() if k not in (
                "num_iterations", "eps_low", "eps_high", "beta", "kl", "dual_clip", "advantage")}


def shared_data():
    if not (ROOT.parent / "shared").is_dir():
        pytest.skip("../shared is absent: the recipes' real data is not here")


def step_recipes() -> list:
    """The RL recipes run for a step: every algorithm's, once, on families taken in turn (18 algorithms over 5
    families: each family 3-4 times), and every family's d1 recipe. ``test_rl_recipe_parses`` checks every recipe's
    settings against its family; the recipes of one family share their data sections, so a step of each of the ~100
    recipes repeated the same loading (6 of CI's minutes)."""
    math = sorted(p for p in RL_RECIPES if p.stem.endswith("_math"))
    algos = sorted({p.stem for p in math})
    chosen = {p for p in math if p.stem == "d1_math"}
    for i, stem in enumerate(algos):
        have = [p for p in math if p.stem == stem]
        chosen.add(have[i % len(have)])
    return sorted(chosen)


@pytest.mark.parametrize("path", step_recipes(), ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_rl_recipe_runs_a_step_on_its_own_data(path, tmp_path, capsys):
    """A shipped RL recipe (``step_recipes``), offline with the one flag --data.local-dir, starts on its real data
    section (every file loaded whole through the loaders the recipe uses, rows its reward cannot score dropped and
    reported) and trains on one rollout: a tiny model of its family, eight prompts, short completions (a masked
    family's semi-AR blocks and step counts shrink to fit), one pass (its mini-batches are the optimiser steps)."""
    from test_train_rl import set_fields
    shared_data()
    algo = peek("algo", ["--config", str(path)])
    args = parse(train_rl.args_class(algo), ["--config", str(path), "--data.local-dir", str(SHARED / "data" / "rl")])
    family = path.parent.name
    args = set_fields(args, model=f"tiny:{family}", output_dir=str(tmp_path), max_steps=1, save_steps=1,
                      prompts_per_step=2, num_generations=4, micro_batch_size=2, bf16=False, report_to="none",
                      log_completions=0, data__limit=8, data__eval_limit=4, rollout__gen_length=8,
                      validation__gen_length=8)
    if family in ("llada", "dream", "nemotron_diffusion"):  # blocks of the whole (short) completion
        for section in (args.rollout, args.validation):
            section.block_length = section.steps = None
    args.algo_config.num_iterations = 1  # one rollout: its mini-batches are the steps
    args.max_steps = args.save_steps = args.algo_config.cycle
    train_rl.main(args)
    assert (tmp_path / f"checkpoint-{args.max_steps}").is_dir()
    if "DigitalLearningGmbH/MATH-lighteval" in args.data.path:
        assert "DigitalLearningGmbH/MATH-lighteval: dropped 4 of 7474 rows the reward cannot score: 4 no ground " \
               "truth (rows 886, 1009, 5328, 5330)" in capsys.readouterr().out


@pytest.mark.parametrize("path", SFT_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_sft_recipe_runs_a_step_on_its_own_data(path, tmp_path):
    from test_train_rl import set_fields
    shared_data()
    args = parse(train_sft.Args, ["--config", str(path), "--data.local-dir", str(SHARED / "data" / "sft")])
    args = set_fields(args, model=f"tiny:{path.parent.name}", output_dir=str(tmp_path), max_steps=1, save_steps=1,
                      bf16=False, report_to="none", per_device_train_batch_size=2, gradient_accumulation_steps=1,
                      data__limit=8, data__max_length=1024,  # the tiny models' positions
                      # the recipe's evaluation, short
                      data__eval_limit=4, eval_generate=2, eval_sampling__gen_length=8)
    train_sft.main(args)
    assert (tmp_path / "checkpoint-1").is_dir()


def test_every_shared_data_file_loads_through_the_recipes_loaders():
    """Every RL file (prompt rows for the rewards: unscorable rows dropped and counted) and every SFT file (tokenized
    in full with a tiny tokenizer) of ../shared/data loads; MATH train keeps 7,470 of its 7,474 rows."""
    from dare.data.loading import load_rows
    from dare.data.rl import RLDataConfig, prompt_rows
    from dare.data.sft import SFTDataConfig, tokenize_dataset
    shared_data()
    data = ROOT.parent / "shared" / "data"
    sizes = {p.relative_to(data).as_posix(): len(prompt_rows(str(p), "train", RLDataConfig()))
             for p in sorted((data / "rl").rglob("*.parquet"))}
    assert len(sizes) >= 13 and all(sizes.values()) and sizes["rl/train/math_1.parquet"] == 7470
    model, tokenizer = tiny("llada")
    family = Family.from_pretrained(model.config, tokenizer)
    for p in sorted((data / "sft").rglob("*.parquet")):
        rows = load_rows(str(p))
        config = SFTDataConfig(path=str(p), max_length=8192)  # the tiny tokenizer splits finer than the real ones
        assert len(tokenize_dataset(rows, tokenizer, family, config)) == len(rows) > 1000


# The authors' released configurations (file and commit in each recipe's header), as DARE's keys: a :paper recipe
# that drifts from them fails here.
AUTHORS = {
    "llada/tracerl_math_paper.yaml": {  # Gen-Verse/dLLM-RL 10b4fd1 configs/rl_llada.yaml (one GPU)
        "algo_config.shrink": 8, "algo_config.eps_low": 0.2, "algo_config.eps_high": 0.2,
        "algo_config.dual_clip": None, "algo_config.beta": 0.01, "algo_config.kl": "k3",
        "algo_config.kl_to": "rollout", "algo_config.dynamic_sampling.mode": "drop",
        "algo_config.dynamic_sampling.keep": "accuracy", "algo_config.dynamic_sampling.low": 0.2,
        "algo_config.dynamic_sampling.high": 0.8, "algo_config.mini_batches": 64, "truncated_is_wrong": True,
        "prompts_per_step": 32, "num_generations": 8, "micro_batch_size": 2, "rollout.temperature": 0.8,
        "rollout.gen_length": 512, "rollout.steps": 512, "rollout.block_length": 32, "learning_rate": 1e-6,
        "weight_decay": 0.0, "adam_beta2": 0.999, "max_grad_norm": 1.0, "max_steps": 3200},
    "sdar/tracerl_math_paper.yaml": {  # the same commit, configs/rl_sdar.yaml (8 GPUs)
        "algo_config.shrink": 1, "algo_config.dual_clip": None, "algo_config.beta": 0.01,
        "algo_config.kl_to": "rollout",
        "algo_config.dynamic_sampling.mode": "drop", "algo_config.mini_batches": 4, "truncated_is_wrong": True,
        "prompts_per_step": 64, "num_generations": 16, "micro_batch_size": 1, "rollout.temperature": 1.0,
        "rollout.gen_length": 2000, "rollout.threshold": 0.9, "rollout.top_k": None, "learning_rate": 1e-6,
        "max_grad_norm": 1.0, "max_steps": 320},
    "sdar/dipo_math_paper.yaml": {  # OpenMOSS/DiRL ec4bfb3 examples/example-dapo.sh, scripts/dapo.sh, configs/rl.yaml
        "algo_config.eps_low": 0.2, "algo_config.eps_high": 0.28, "algo_config.dual_clip": None,
        "algo_config.beta": 0.0, "algo_config.dynamic_sampling.mode": "resample",
        "algo_config.dynamic_sampling.keep": "mixed", "algo_config.dynamic_sampling.extra": 2.0,
        "truncated_is_wrong": True, "prompts_per_step": 128, "num_generations": 8, "rollout.temperature": 1.0,
        "rollout.top_k": 50, "rollout.threshold": 0.9, "learning_rate": 1e-6, "warmup_steps": 10,
        "weight_decay": 0.0, "max_grad_norm": 1.0},
    "llada/igpo_math_paper.yaml": {  # facebookresearch/igpo e85eaea run_igpo.sh over train.yaml
        "algo_config.num_iterations": 4, "algo_config.eps_low": 0.2, "algo_config.eps_high": 0.2,
        "algo_config.dual_clip": None, "algo_config.ratio_level": "sequence", "algo_config.p_prompt": 0.0,
        "algo_config.beta": 0.01, "algo_config.kl": "k3", "algo_config.chunk_min": 5, "algo_config.chunk_max": 10,
        "algo_config.hint_low": 0.2, "algo_config.hint_high": 0.6, "algo_config.replace_fraction": 0.5,
        "prompts_per_step": 64, "num_generations": 8, "rollout.gen_length": 256, "rollout.block_length": 32,
        "rollout.steps": 128, "rollout.temperature": 1.2, "lora.rank": 128, "lora.alpha": 64, "lora.dropout": 0.05,
        "learning_rate": 5e-7, "warmup_steps": 50, "weight_decay": 0.1, "adam_beta2": 0.99, "max_grad_norm": 0.2,
        "seed": 3},
}


@pytest.mark.parametrize("recipe", list(AUTHORS))
def test_paper_profiles_equal_the_authors_released_configuration(recipe):
    """Each value the authors' files set, as the profile parses it (train_rl.py's types, the base recipe merged)."""
    from dare.config import parse, peek
    path = ROOT / "recipes" / recipe
    args = parse(train_rl.args_class(peek("algo", ["--config", str(path)])), ["--config", str(path)])
    got = {}
    for key in AUTHORS[recipe]:
        value = args
        for part in key.split("."):
            value = getattr(value, part)
        got[key] = value
    assert got == AUTHORS[recipe]
