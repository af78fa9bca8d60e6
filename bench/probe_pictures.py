"""Does a model that reads pictures answer the held-out visual task? Greedy answers to ``task:shapes`` test pictures
(never trained on), scored by the math reward, beside the majority answer's accuracy: a first look before the lab
(``recipes/lab``) measures pictures with a control.

    python train_sft.py --model tiny:llada_v --data.path task:shapes --data.max-length 160 --data.pad-to longest \\
        --max-steps 1500 --learning-rate 1e-3 --per-device-train-batch-size 16 --output-dir outputs/shapes-sft
    python bench/probe_pictures.py --model outputs/shapes-sft --questions 300
    python bench/probe_pictures.py --model outputs/shapes-sft --questions 300 --wrong-pictures   # the control
"""

import argparse
import collections
import math

import torch

from dare.data.images import PicturePrompt, load_image
from dare.data.tasks import make_task
from dare.engines import HFEngine
from dare.models import load_pretrained
from dare.rewards import get_reward
from dare.sampling import SamplingConfig


def answers(model, tokenizer, family, rows, gen_length: int, batch: int, wrong: bool = False) -> list[str]:
    """Greedy answers (up to the first stop token) through the hf engine, each prompt with its picture (``wrong``:
    with the next question's picture, a control: a model that reads the picture loses accuracy)."""
    shown = [r["images"] for r in rows]
    shown = shown[1:] + shown[:1] if wrong else shown
    prompts = [PicturePrompt(r["prompt"], tuple(load_image(i) for i in own)) for r, own in zip(rows, shown,
                                                                                                strict=True)]
    config = SamplingConfig(gen_length=gen_length, steps=gen_length, temperature=0.0)
    return HFEngine(model, tokenizer, family, max_batch_size=batch).generate(prompts, 1, config, seed=0).texts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder (or tiny:llada_v) that reads pictures")
    p.add_argument("--questions", type=int, default=300, help="held-out pictures (default 300)")
    p.add_argument("--gen-length", type=int, default=16, help="answer tokens (default 16)")
    p.add_argument("--batch", type=int, default=32, help="pictures decoded together (default 32)")
    p.add_argument("--wrong-pictures", action="store_true",
                   help="control: each question shown the next question's picture")
    args = p.parse_args(argv)
    model, tokenizer, family = load_pretrained(args.model, dtype=torch.float32)
    if not family.pictures:
        raise SystemExit(f"error: {args.model} is a {family.name} model, which reads no pictures")
    rows = make_task("shapes", args.questions, seed=0, split="test")
    texts = answers(model.eval(), tokenizer, family, rows, args.gen_length, args.batch, args.wrong_pictures)
    reward = get_reward("math")
    right = [reward(t, r["reward_model"]["ground_truth"], r["extra_info"]).acc for t, r in zip(texts, rows,
                                                                                               strict=True)]
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    majority, count = collections.Counter(truths).most_common(1)[0]
    n, acc = len(right), sum(right) / len(right)
    se = math.sqrt(acc * (1 - acc) / n)
    margin = f" ({(acc - count / n) / se:+.1f} SE)" if se else ""
    shown = "the next question's pictures" if args.wrong_pictures else "held-out pictures"
    print(f"{args.model}: {acc:.3f} ± {se:.3f} right on {n} {shown}; always answering {majority}: "
          f"{count / n:.3f}{margin}")
    for text, row in list(zip(texts, rows, strict=True))[:5]:
        print(f"  truth {row['reward_model']['ground_truth']}: {text!r}")
    return acc


if __name__ == "__main__":
    main()
