"""The hf and sglang engines on the same prompts: tokens/s, identical greedy tokens, and RL steps with weight sync.

    python bench/bench_sglang.py                       # a GPU, SGLang's environment (docs/sglang.md): ~1B models
    python bench/bench_sglang.py --size tiny --prompts 4 --gen-length 16 --rl-steps 2 --rl-prompts 2  # smoke (CPU)

For each of SDAR and LLaDA2 (MoE) a random checkpoint is built locally (no download; the official vocabularies, since
SGLang fixes each architecture's mask id; ``--size 1b``: SDAR ~1.4B parameters, LLaDA2 ~1.2B with 32 experts; bf16
on a GPU) and the same ``--prompts`` chat prompts are decoded greedily to ``--gen-length`` tokens by the hf engine
(DARE's block sampler on the in-process model, micro-batches of ``--batch``) and by the sglang engine (DareBlock in
SGLang's scheduler): tokens/s over the decoding alone, and the share of completion tokens that are identical (bf16
kernels differ, so a few flips are expected; fp32 on CPU gives 100%). Then ``train_rl.py --algo d1 --rollout-engine
sglang`` runs ``--rl-steps`` steps on the SDAR checkpoint: step time, rollout time and the weight push into the engine
(``time/weight_sync``), against the same run on ``--rollout-engine hf``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {  # config overrides of dare.models.<family>.tiny_config
    "tiny": {"sdar": {}, "llada2": {"block_size": 4}},
    "1b": {"sdar": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, max_position_embeddings=4096),
           "llada2": dict(hidden_size=1024, intermediate_size=4096, moe_intermediate_size=512, num_hidden_layers=12,
                          num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32,
                          num_experts_per_tok=4, n_group=4, topk_group=2, max_position_embeddings=4096)},
}
OFFICIAL = {"sdar": (151936, 151669), "llada2": (157184, 156895)}  # vocabulary, mask id SGLang expects


def build(family: str, size: str, folder: Path) -> str:
    from dare.models import llada2, sdar
    from dare.models.tiny import tiny_model
    from dare.models.tokenizers import tiny_tokenizer

    tok = tiny_tokenizer(family)
    vocab, mask = OFFICIAL[family]
    make = {"sdar": sdar.tiny_config, "llada2": llada2.tiny_config}[family]
    config = make(vocab, mask_token_id=mask, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  bos_token_id=tok.bos_token_id, **SIZES[size][family])
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU where there is one
        model = tiny_model(config)
    with torch.no_grad():  # the tiny tokenizer spells ids < len(tok): only those can be decoded back to text
        head = model.get_output_embeddings().weight
        head[len(tok):] = 0
        head[:len(tok)] *= 8
    if torch.cuda.is_available():
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.mask_token = None  # the mask id is then config.mask_token_id, the one SGLang fixes
    tok.save_pretrained(folder)
    print(f"{family} ({size}): {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters in {folder}")
    return str(folder)


def prompts(count: int) -> list:
    return [[{"role": "user", "content": f"Tom has {3 + i} apples and buys {7 * i + 2} more. How many now?"}]
            for i in range(count)]


def compare(family: str, path: str, args) -> dict:
    from dare.engines import HFEngine
    from dare.engines.sglang import SGLangEngine, SGLangOptions
    from dare.models import load_pretrained
    from dare.sampling import SamplingConfig

    config = SamplingConfig(gen_length=args.gen_length, temperature=0.0)
    asked = prompts(args.prompts)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok, fam = load_pretrained(path, dtype="auto")
    hf = HFEngine(model.to(device).eval(), tok, fam, args.batch)
    hf.generate(asked[:1], 1, config, seed=0)  # warm-up
    ours = hf.generate(asked, 1, config, seed=0)
    del model, hf
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if "sglang" not in args.engines:
        return {"family": family, "hf tok/s": ours.tokens_per_second}
    engine = SGLangEngine(path, tok, fam, SGLangOptions(mem_fraction=0.6, max_running_requests=args.prompts))
    try:
        engine.generate(asked[:1], 1, config, seed=0)
        theirs = engine.generate(asked, 1, config, seed=0)
    finally:
        engine.close()
    both = ours.completion_mask.bool() & theirs.completion_mask.bool()
    same = float((ours.completion_ids == theirs.completion_ids)[both].float().mean()) if both.any() else 0.0
    return {"family": family, "hf tok/s": ours.tokens_per_second, "sglang tok/s": theirs.tokens_per_second,
            "speed-up": theirs.tokens_per_second / max(ours.tokens_per_second, 1e-9), "identical": same}


def rl_steps(path: str, engine: str, args) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"bench-sglang-{engine}-"))
    command = [sys.executable, "train_rl.py", "--algo", "d1", "--model", path, "--data.path", "task:addition",
               "--data.limit", "256", "--max-steps", str(args.rl_steps), "--prompts-per-step", str(args.rl_prompts),
               "--num-generations", "4", "--micro-batch-size", "8", "--rollout.gen-length", str(args.gen_length),
               "--rollout.temperature", "1.0", "--rollout-engine", engine, "--save-steps", str(args.rl_steps),
               "--output-dir", str(out)]
    if torch.cuda.is_available():
        command += ["--bf16"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)}\n{result.stderr[-4000:]}")
    logs = [h for h in json.loads((out / f"checkpoint-{args.rl_steps}" / "trainer_state.json").read_text())
            ["log_history"] if "loss" in h][1:]  # the first step includes the engine's start
    mean = lambda key: sum(h.get(key, 0.0) for h in logs) / max(len(logs), 1)
    return {"engine": engine, "wall s": time.perf_counter() - start, "rollout s/step": mean("time/rollout"),
            "weight sync s/step": mean("time/weight_sync"), "rollout tok/s": mean("rollout/tokens_per_s")}


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)] +
                     ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="1b")
    parser.add_argument("--prompts", type=int, default=128, help="prompts decoded by each engine")
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64, help="hf engine micro-batch")
    parser.add_argument("--rl-steps", type=int, default=3, help="train_rl.py steps per engine (0: skip)")
    parser.add_argument("--rl-prompts", type=int, default=16, help="prompts per RL step (x4 completions)")
    parser.add_argument("--engines", nargs="+", choices=("hf", "sglang"), default=["hf", "sglang"],
                        help="hf alone: the baseline rows where SGLang is not installed")
    parser.add_argument("--out", default=None, help="folder for the checkpoints (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    folder = Path(args.out or tempfile.mkdtemp(prefix="bench-sglang-"))
    paths = {family: build(family, args.size, folder / family) for family in ("sdar", "llada2")}
    print(table([compare(family, path, args) for family, path in paths.items()]))
    if args.rl_steps:
        print(table([rl_steps(paths["sdar"], engine, args) for engine in args.engines]))


if __name__ == "__main__":
    main()
