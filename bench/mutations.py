"""Mutation check of the newer algorithms' distinguishing terms (issue 51), Nemotron's SFT loss and RL reading (issue
58) and UniGRPO's and MaskGRPO's masking and averaging (issue 50): each term below is changed in a copy of the
repository, and the tests named beside it must fail there; a mutation they survive is a term no test pins.

    python bench/mutations.py                      # every mutation, one pytest each (~8 min on 2 cores)
    python bench/mutations.py --only agrpo dmpo    # the mutations whose name holds one of these words
    python bench/mutations.py --out bench/results/cpu-2026-12-07/mutations.md

The working tree is never touched: the tracked files are copied to a temporary folder once, each mutation is applied
there, its tests run with that folder first on PYTHONPATH, and the file is put back. Exit 1 if a mutation survives.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Mutation:
    name: str  # the term changed, and how
    path: str  # the file, relative to the repository
    old: str  # text that occurs exactly once in the file ...
    new: str  # ... and what it becomes
    tests: tuple[str, ...]  # pytest node ids or files, "FILE -k EXPR" for a selection


def tests(*ids: str) -> tuple[str, ...]:
    return tuple(f"tests/{i}" for i in ids)


NEMOTRON_RL = tests("test_nemotron_diffusion.py -k sampler_decodes")
NEMOTRON_SFT = tests("test_objectives.py", "test_nemotron_diffusion.py -k 'spec_formula and nemotron or joint_sft'")

MUTATIONS = [
    Mutation("igpo: the sequence ratio becomes per token", "dare/algos/igpo.py",
             "ratio = torch.exp(logp - logp.detach() + mean_log_ratio.detach()[:, None])",
             "ratio = torch.exp(logp - old_logp)", tests("test_igpo.py")),
    Mutation("igpo: the default ratio level is token", "dare/algos/igpo.py",
             'ratio_level: one_of(*RATIO_LEVELS) = "sequence"', 'ratio_level: one_of(*RATIO_LEVELS) = "token"',
             tests("test_igpo.py")),
    Mutation("igpo: the hint tokens stay in the loss", "dare/algos/igpo.py",
             'batch["loss_mask"] = batch["loss_mask"] * (~rollout.given.to(batch["loss_mask"].device)).long()',
             'batch["loss_mask"] = batch["loss_mask"]', tests("test_igpo.py")),
    Mutation("igpo: every hinted success replaces (no replace_fraction)", "dare/algos/igpo.py",
             "keep = int(self.replace_fraction * n)", "keep = n", tests("test_igpo.py")),
    Mutation("agrpo: every step can be drawn (no content stop rule)", "dare/algos/agrpo.py",
             "return torch.where(steps > last.gather(1, key), -1, steps)", "return steps",
             tests("test_trajectory_algos.py -k agrpo")),
    Mutation("agrpo: the entropy proposal becomes uniform", "dare/likelihood.py",
             "mass = (mass + 1e-8) * inside", "mass = (mass * 0 + 1) * inside",
             tests("test_trajectory_algos.py -k agrpo")),
    Mutation("agrpo: the importance weight 1/(T q) becomes 1/(T sqrt q)", "dare/likelihood.py",
             "weight = torch.where(spans[:, None] > 0, scale[:, None] / drawn.clamp(min=1e-300), 0.0)",
             "weight = torch.where(spans[:, None] > 0, scale[:, None] / drawn.clamp(min=1e-300).sqrt(), 0.0)",
             tests("test_trajectory_algos.py -k agrpo")),
    Mutation("agrpo: the uniform proposal's weight S_b becomes 1", "dare/likelihood.py",
             "weight = (scale * spans)[:, None].expand(-1, self.samples, -1)",
             "weight = (scale * spans.clamp(max=1))[:, None].expand(-1, self.samples, -1)",
             tests("test_trajectory_algos.py -k agrpo")),
    Mutation("agrpo: independent draws instead of strata", "dare/likelihood.py",
             "u = ((order + uniform(shape, generator, device)) / shape[0]).view(rows, self.samples, -1)",
             "u = uniform(shape, generator, device).view(rows, self.samples, -1)",
             tests("test_trajectory_algos.py -k agrpo")),
    Mutation("agrpo: the mean over steps becomes their sum", "dare/likelihood.py",
             'scale = 1 / total if self.step_weight == "mean" else torch.ones_like(total)',
             "scale = torch.ones_like(total)", tests("test_trajectory_algos.py -k agrpo")),
    Mutation("agrpo: scored without the sampler's top-k filter", "dare/algos/agrpo.py",
             "keep = partial(filter_logits, top_k=sampling.top_k, top_p=sampling.top_p) if filtered else None",
             "keep = None", tests("test_trajectory_algos.py -k agrpo")),
    Mutation("tracerl: the value clip is optimistic (min)", "dare/algos/tracerl.py",
             "loss = torch.maximum(loss, (clipped - returns) ** 2)",
             "loss = torch.minimum(loss, (clipped - returns) ** 2)", tests("test_value_model.py")),
    Mutation("tracerl: the value loss reads the clean sequence", "dare/algos/tracerl.py",
             "values = token_values(model, family, batch, canvas_before(family, batch, stream))",
             'values = token_values(model, family, batch, torch.cat([batch["prompt_ids"], batch["completion_ids"]], '
             '1))', tests("test_value_model.py")),
    Mutation("tracerl: the value targets read the clean sequence", "dare/algos/tracerl.py",
             "values = torch.where(at, token_values(model, family, part, canvas_before(family, part, stream)),",
             'values = torch.where(at, token_values(model, family, part, torch.cat([part["prompt_ids"], '
             'part["completion_ids"]], 1)),', tests("test_value_model.py")),
    Mutation("tracerl: GAE's lambda dropped", "dare/algos/tracerl.py",
             "advantage = step_reward[:, t] - step_value[:, t] + gamma * v + gamma * lam * a",
             "advantage = step_reward[:, t] - step_value[:, t] + gamma * v + gamma * a", tests("test_value_model.py")),
    Mutation("tracerl: the shrinkage ignored", "dare/algos/tracerl.py",
             'return torch.where(steps >= 0, torch.div(steps, self.shrink, rounding_mode="floor"), steps)',
             "return steps", tests("test_trajectory_algos.py -k tracerl")),
    Mutation("tracerl: the default KL is to the reference", "dare/algos/tracerl.py",
             'kl_to: one_of(*KL_TARGETS) = "rollout"', 'kl_to: one_of(*KL_TARGETS) = "reference"',
             tests("test_trajectory_algos.py -k 'tracerl or authors_rules'")),
    Mutation("tracerl: no accuracy filter by default", "dare/algos/tracerl.py",
             'DynamicSampling(mode="drop", keep="accuracy"))', 'DynamicSampling(mode="off", keep="accuracy"))',
             tests("test_trajectory_algos.py -k 'tracerl or authors_rules'")),
    Mutation("the accuracy band becomes [0, 1]", "dare/algos/base.py",
             "return (share >= self.low) & (share <= self.high)", "return (share >= 0) & (share <= 1)",
             tests("test_train_rl.py -k 'signal_groups or dropped_groups'")),
    Mutation("the KL to the rollout policy measures the reference", "dare/algos/base.py",
             '        if self.kl_to == "rollout":\n            ref_logp = old_logp\n', "",
             tests("test_train_rl.py -k kl_to")),
    Mutation("truncated_is_wrong does nothing", "dare/trainers/rl.py",
             "return [r if done else RewardResult(0.0, 0.0, r.pred) for r, done in zip(results, stopped, strict=True)]",
             "return results", tests("test_train_rl.py::test_a_truncated_completion_scores_zero")),
    Mutation("dipo: resampling stops after one round", "dare/trainers/rl.py",
             'if dynamic.mode != "resample" or not self._still_short(sum(signal) < len(rows)) \\',
             "if True or not self._still_short(sum(signal) < len(rows)) \\",
             tests("test_train_rl.py::test_dynamic_sampling_trains_on_the_groups_with_a_signal")),
    Mutation("dipo: pads instead of resampling by default", "dare/algos/dipo.py",
             'mode="resample", keep="mixed", extra=2.0, rounds=10))',
             'mode="pad", keep="mixed", extra=2.0, rounds=10))',
             tests("test_trajectory_algos.py -k 'dipo or authors_rules'")),
    Mutation("dipo: 'mixed' keeps every group", "dare/algos/base.py",
             "return (share > 0) & (share < 1)", "return share >= 0", tests("test_train_rl.py -k signal_groups")),
    Mutation("dipo: no clip-higher", "dare/algos/dipo.py",
             "eps_high: float = 0.28", "eps_high: float = 0.2",
             tests("test_trajectory_algos.py -k 'dipo or authors_rules'")),
    Mutation("d2: the group boundaries shift by one step", "dare/algos/d2.py",
             "torch.bucketize(steps, starts, right=True)", "torch.bucketize(steps, starts, right=False)",
             tests("test_trajectory_algos.py -k 'd2 or merge'")),
    Mutation("dmpo: independent masks instead of complements", "dare/likelihood.py",
             "masks = torch.cat([first, ~first & maskable[:, None]], 1)",
             "masks = torch.cat([first, first.flip(0) & maskable[:, None]], 1)", tests("test_algos.py -k dmpo")),
    Mutation("dmpo: the mask rate 0.1 + 0.9 U becomes U", "dare/likelihood.py",
             "rate = 0.1 + 0.9 * uniform((rows, half, 1), generator, maskable.device)",
             "rate = uniform((rows, half, 1), generator, maskable.device)", tests("test_algos.py -k dmpo")),
    Mutation("dmpo: the tilt points away from the reference", "dare/algos/dmpo.py",
             'log_ratio = (ref - old) * whole["loss_mask"].sum(-1)',
             'log_ratio = (old - ref) * whole["loss_mask"].sum(-1)',
             tests("test_algos.py -k dmpo")),
    Mutation("dmpo: the weight is not times G", "dare/algos/dmpo.py",
             'weight=batch["advantages"] * group_size,', 'weight=batch["advantages"],', tests("test_algos.py -k dmpo")),
    Mutation("nemotron sft: the diffusion weight 0.3 becomes 1", "dare/diffusion.py",
             "diffusion_weight=0.3, causal_loss=True", "diffusion_weight=1.0, causal_loss=True", NEMOTRON_SFT),
    Mutation("nemotron sft: no causal term", "dare/diffusion.py",
             "diffusion_weight=0.3, causal_loss=True", "diffusion_weight=0.3, causal_loss=False", NEMOTRON_SFT),
    Mutation("nemotron sft: the clean half reads block-causally", "dare/models/family.py",
             "clean_causal=self.causal_block is not None, block_origin", "clean_causal=False, block_origin",
             NEMOTRON_SFT),
    Mutation("nemotron sft: the causal term divided by the masked count", "dare/objectives.py",
             "causal_term = causal_token.sum() / normaliser[1].clamp(min=1)",
             "causal_term = causal_token.sum() / normaliser[0].clamp(min=1)", NEMOTRON_SFT),
    Mutation("nemotron rl: blocks on the global grid, not from the completion", "dare/likelihood.py",
             'clean_keep=seeds, block_origin=batch["prompt_mask"].sum(-1))', "clean_keep=seeds)", NEMOTRON_RL),
    Mutation("nemotron rl: a block's first token read by the block, not the causal pass", "dare/likelihood.py",
             "logits[:, index % family.causal_block == 0] = causal.view(len(noisy), len(first), -1)", "pass",
             NEMOTRON_RL),
    Mutation("unigrpo: a token mean over the batch, not each copy's mean", "dare/algos/unigrpo.py",
             "per_copy = (surrogate * hidden).sum(-1) / hidden.sum(-1).clamp(min=1)",
             "per_copy = (surrogate * hidden).sum(-1) / hidden.sum(-1).mean().clamp(min=1)",
             tests("test_algos.py -k unigrpo")),
    Mutation("unigrpo: the KL averaged over a copy's tokens, not summed", "dare/algos/unigrpo.py",
             "per_copy = per_copy + self.beta * (kl * hidden).sum(-1)",
             "per_copy = per_copy + self.beta * (kl * hidden).sum(-1) / hidden.sum(-1).clamp(min=1)",
             tests("test_algos.py -k unigrpo")),
    Mutation("unigrpo: one mask ratio for every copy", "dare/likelihood.py",
             "t = self.t_min + (self.t_max - self.t_min) * uniform((n, self.draws, 1), generator, completion.device)",
             "t = self.t_min + (self.t_max - self.t_min) * uniform((1, 1, 1), generator, completion.device)",
             tests("test_algos.py -k unigrpo")),
    Mutation("maskgrpo: the fading line rises instead", "dare/likelihood.py",
             "line = torch.linspace(1, 0, width, device=completion.device)",
             "line = torch.linspace(0, 1, width, device=completion.device)", tests("test_algos.py -k maskgrpo")),
    Mutation("maskgrpo: every inner iteration at the first ratio", "dare/algos/maskgrpo.py",
             "return self.estimator(family, sampling, iteration).corrupt(family, batch, generator)",
             "return self.estimator(family, sampling).corrupt(family, batch, generator)",
             tests("test_algos.py -k maskgrpo")),
    Mutation("maskgrpo: the trainer does not say which inner iteration it draws for", "dare/trainers/rl.py",
             "noise = algo.corrupt(family, batch, generator, self.sampling, iteration=slot)",
             "noise = algo.corrupt(family, batch, generator, self.sampling)",
             tests("test_algos.py -k inner_iterations_noise")),
    Mutation("maskgrpo: the loss averaged over every loss token, not the hidden ones", "dare/algos/maskgrpo.py",
             "return torch.stack([noise[\"masks\"].sum() for noise in batch[\"noise\"]])",
             "return torch.stack([batch[\"loss_mask\"].sum() for noise in batch[\"noise\"]])",
             tests("test_algos.py -k maskgrpo")),
]


def copy_tree(to: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, files.stdout.split("\0")):
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, to / name)


def run(mutation: Mutation, copy: Path) -> tuple[bool, str, float]:
    """Whether the tests fail under the mutation, the first failing test (or pytest's summary) and the seconds."""
    path = copy / mutation.path
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"error: {mutation.name}: its text occurs {text.count(mutation.old)} times in "
                         f"{mutation.path}, not once (update bench/mutations.py)")
    path.write_text(text.replace(mutation.old, mutation.new))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    try:
        done = subprocess.run(f"{sys.executable} -m pytest -q -x -p no:cacheprovider {' '.join(mutation.tests)}",
                              shell=True, cwd=copy, env=env, capture_output=True, text=True)
    finally:
        path.write_text(text)
    lines = done.stdout.strip().splitlines()
    failed = [line.split()[1] for line in lines if line.startswith(("FAILED", "ERROR"))]
    summary = failed[0] if failed else lines[-1] if lines else done.stderr[-200:]
    return done.returncode == 1 and bool(failed), summary, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=None, help="mutations whose name holds one of these words")
    parser.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only is None or any(w in m.name for w in args.only)]
    rows = ["| mutation | file | tests | caught by | s |", "|---|---|---|---|---|"]
    survived = 0
    with tempfile.TemporaryDirectory() as folder:
        copy_tree(Path(folder))
        for m in chosen:
            caught, first, seconds = run(m, Path(folder))
            survived += not caught
            row = f"| {m.name} | `{m.path}` | `{' '.join(m.tests)}` | {first if caught else 'SURVIVED: ' + first} " \
                  f"| {seconds:.0f} |"
            rows.append(row)
            print(row, flush=True)
    table = "\n".join(rows) + f"\n\n{len(chosen) - survived} of {len(chosen)} mutations caught.\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"# Mutation check (`python bench/mutations.py`)\n\n{table}")
    print(table)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
