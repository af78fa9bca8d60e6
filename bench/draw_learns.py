"""Does RL teach a drawing model to draw what it is asked? A tiny MMaDA on the drawing task (task:colours): its
held-out drawings scored by the colours reward before and after RL, paired per drawing (the same held-out question
and sample seed), and a control that trains on the negated reward.

    python bench/draw_learns.py --algos maskgrpo d1 --steps 60 --output-dir outputs/draw-lab
    python bench/draw_learns.py --tokenizer-steps 600 --sft-steps 600 --algos d1 --lr 1e-3 --output-dir outputs/draw

The start: a random tiny MMaDA (its random tiny MAGVIT paints any codes as a texture), or with ``--tokenizer-steps``
one whose tiny MAGVIT-v2 was first fit as an autoencoder on random pictures of the task's colours
(``painting_tokenizer``: a lab tokenizer, not MAGVIT-v2's recipe), and with ``--sft-steps`` trained by drawing SFT
on the training questions' pictures (MMaDA's text-to-image loss). Prints one table row per run (mean held-out reward
before -> after, the paired change with its standard error); each run's folder keeps its model and ``result.json``
(a rerun reuses it).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def held_out(model_dir: str, questions: int, samples: int, steps: int) -> list[float]:
    """The colours reward of ``samples`` drawings of each of ``questions`` held-out rows (T = 1, seeded per row)."""
    import torch

    from dare.data.images import pictured_prompt
    from dare.data.tasks import make_task
    from dare.engines import HFEngine
    from dare.eval.benchmarks import prompt_rows_from
    from dare.models import Family, load_pretrained
    from dare.rewards import get_reward
    from dare.sampling import SamplingConfig

    model, tokenizer, _ = load_pretrained(model_dir)
    engine = HFEngine(model.eval(), tokenizer, Family.from_pretrained(model.config, tokenizer), max_batch_size=64)
    rows = prompt_rows_from(make_task("colours", questions, seed=0, split="test"))
    reward, scores = get_reward("colours"), []
    config = SamplingConfig(steps=steps, temperature=1.0)
    with torch.no_grad():
        for i, row in enumerate(rows):
            rollout = engine.generate([pictured_prompt(row)], samples, config, seed=1000 + i)
            scores += [reward(text, row["ground_truth"]).score for text in rollout.texts]
    return scores


def train(start: str, out: Path, algo: str, args, control: bool) -> None:
    import train_rl
    from dare.data.tasks import write_task

    data = write_task("colours", str(out.parent / "colours-train.parquet"), 2000, 0, "train")
    run = train_rl.args_class(algo)(model=start, output_dir=str(out), max_steps=args.steps, save_steps=args.steps,
                                    prompts_per_step=args.prompts, num_generations=args.generations,
                                    micro_batch_size=args.prompts * args.generations, learning_rate=args.lr,
                                    warmup_steps=0.0, lr_scheduler_type="constant", seed=0,
                                    rewards=["colours:-1" if control else "colours"], logging_steps=10)
    run.data.path, run.rollout.temperature, run.rollout.steps = data, 1.0, args.draw_steps
    if algo == "maskgrpo":  # MaskGRPO's drawing settings, fewer inner iterations
        run.algo_config.remasking, run.algo_config.num_iterations = "random", 2
        run.save_steps = args.steps - args.steps % 2
    train_rl.main(run)


def painting_tokenizer(folder: Path, steps: int, lr: float = 1e-3) -> str:
    """A tiny MAGVIT-v2 that paints flat colours, saved in ``folder`` (reused when there); its absolute path. Fit as an
    autoencoder (mean squared error, straight-through signs) on random 64-px pictures of the task's six colours: 4 x 4
    cells of 16 px (one code each) or 2 x 2 blocks of them, never the task's own pictures; 8 GroupNorm groups (four
    channels a group, as the released tokenizer's 128 / 32: with one channel a group every normalisation removes a
    flat region's colour). Prints the colours reward of its reconstructions of the task's training pictures."""
    from dataclasses import replace

    import torch
    import torch.nn.functional as F

    from dare.models.magvit import MAGVITv2, tiny_config
    from dare.rewards.pictures import PALETTE

    if not (folder / "model.safetensors").exists():
        colours = torch.tensor(list(PALETTE.values()), dtype=torch.float32) / 127.5 - 1
        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = MAGVITv2(replace(tiny_config(), groups=8))
        optimiser = torch.optim.Adam(model.parameters(), lr=lr)
        for step in range(steps):
            cells = torch.randint(0, len(colours), (16, 4, 4), generator=generator)
            blocks = torch.randint(0, len(colours), (16, 2, 2), generator=generator).repeat_interleave(2, 1)
            cells = torch.where(torch.rand(16, 1, 1, generator=generator) < 0.5,
                                blocks.repeat_interleave(2, 2), cells)
            batch = colours[cells].permute(0, 3, 1, 2).repeat_interleave(16, 2).repeat_interleave(16, 3)
            z = model.encoder(batch)
            signs = torch.sign(z).detach()
            loss = F.mse_loss(model.decoder(z + (signs - z).detach()), batch) + 0.1 * F.mse_loss(z, signs)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            if step % 100 == 0 or step == steps - 1:
                print(f"tokenizer step {step}: loss {loss.item():.4f}", flush=True)
        model.eval().save(str(folder))
    print(f"tokenizer: its reconstructions of the task's training pictures score {repainted(folder):.3f} (colours)")
    return str(folder.resolve())


def repainted(folder: Path) -> float:
    """The mean colours reward of the tokenizer's reconstructions of the distinct training questions' pictures."""
    import torch

    from dare.data.images import data_uri, load_image, png
    from dare.data.tasks import make_task
    from dare.models.magvit import MAGVITv2
    from dare.models.readers import painted, square
    from dare.rewards import get_reward

    rows = {r["prompt"][-1]["content"]: r for r in make_task("colours", 1000, 0)}.values()
    tokenizer, reward = MAGVITv2.from_folder(str(folder)), get_reward("colours")
    pixels = tokenizer.picture(tokenizer.codes(torch.stack([square(load_image(r["extra_info"]["solution"]), 64)
                                                           for r in rows])))
    scores = [reward(data_uri(png(p)), r["reward_model"]["ground_truth"]).score
              for p, r in zip(painted(pixels), rows, strict=True)]
    return statistics.fmean(scores)


def drawing_sft(start: str, out: Path, args) -> None:
    """Drawing SFT of ``start`` on the training questions' pictures (constant learning rate)."""
    import train_sft
    from dare.data.tasks import write_task

    sft = train_sft.Args(model=start, output_dir=str(out), max_steps=args.sft_steps, save_steps=args.sft_steps,
                         per_device_train_batch_size=16, learning_rate=args.sft_lr, warmup_steps=0.0,
                         lr_scheduler_type="constant", logging_steps=50)
    sft.data.path = write_task("colours", str(out.parent / "colours-sft.parquet"), 2000, 0, "train")
    sft.data.max_length = 80
    train_sft.main(sft)


def paired(before: list[float], after: list[float]) -> tuple[float, float]:
    diffs = [b - a for a, b in zip(before, after, strict=True)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["maskgrpo"], help="each also runs as NAME:control")
    parser.add_argument("--steps", type=int, default=60, help="RL steps (rollout batches)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="drawings per prompt (the group)")
    parser.add_argument("--lr", type=float, default=3e-3, help="RL learning rate (constant)")
    parser.add_argument("--draw-steps", type=int, default=4, help="MaskGIT steps per drawing")
    parser.add_argument("--questions", type=int, default=64, help="held-out rows")
    parser.add_argument("--samples", type=int, default=4, help="drawings per held-out row")
    parser.add_argument("--tokenizer-steps", type=int, default=0,
                        help="fit the tiny MAGVIT-v2 to the training pictures first (0: its random weights)")
    parser.add_argument("--sft-steps", type=int, default=0, help="drawing SFT steps of the start (0: none)")
    parser.add_argument("--sft-lr", type=float, default=3e-3, help="drawing SFT learning rate (constant)")
    parser.add_argument("--output-dir", default="outputs/draw-lab")
    args = parser.parse_args(argv)
    import torch

    from dare.models import save_tiny

    torch.set_num_threads(1)
    out = Path(args.output_dir)
    start = out / "start"
    if not (start / "model.safetensors").exists():
        painter = {"vq_model_name": painting_tokenizer(out / "tokenizer", args.tokenizer_steps)} \
            if args.tokenizer_steps else {}
        save_tiny("mmada", start, **painter)
    if args.sft_steps:
        if not (out / "sft" / "model.safetensors").exists():
            drawing_sft(str(start), out / "sft", args)
        start = out / "sft"
    cached = start / "held_out.json"
    if not cached.exists():
        cached.write_text(json.dumps(held_out(str(start), args.questions, args.samples, args.draw_steps)))
    before = json.loads(cached.read_text())
    print(f"start: held-out colours reward {statistics.fmean(before):.3f} over {len(before)} drawings")
    print("| run | held-out reward | change (paired) |\n|---|---|---|")
    for algo in args.algos:
        for control in (False, True):
            name = f"{algo}:control" if control else algo
            folder = out / name.replace(":", "-")
            result = folder / "result.json"
            if not result.exists():
                train(str(start), folder, algo, args, control)
                result.write_text(json.dumps(held_out(str(folder), args.questions, args.samples, args.draw_steps)))
            after = json.loads(result.read_text())
            change, se = paired(before, after)
            print(f"| {name} | {statistics.fmean(before):.3f} -> {statistics.fmean(after):.3f} | {change:+.3f} ± "
                  f"{se:.3f} ({change / se:+.1f} SE) |", flush=True)


if __name__ == "__main__":
    main()
