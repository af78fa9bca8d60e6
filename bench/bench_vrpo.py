"""VRPO on generated preference pairs: held-out margin, accuracy and ELBO gap before / after, greedy answer accuracy
on the held-out questions before / after, seconds per optimiser step and model forward passes per pair and step.

    python bench/bench_vrpo.py                                  # tiny LLaDA SFT'd 600 steps, 3 variants, ~5 min
    python bench/bench_vrpo.py --sft-steps 0 --steps 40         # from the random tiny model
    python bench/bench_vrpo.py --memory                         # peak memory of one step vs K, streamed or not
    python bench/bench_vrpo.py --memory --unstreamed-max-k 4    # the one-graph rows only where they fit

What each column measures: bench/README.md.
"""

import argparse
import contextlib
import io
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import LivePeak, in_child, rss_kib

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_rl  # noqa: E402
import train_sft  # noqa: E402
from dare.data.preference import PreferenceDataConfig, pair_rows  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.engines import HFEngine  # noqa: E402
from dare.models import load_pretrained  # noqa: E402
from dare.models.family import Family  # noqa: E402
from dare.sampling import SamplingConfig  # noqa: E402
from dare.trainers.preference import PreferenceTrainer  # noqa: E402

VARIANTS = {"K=4": dict(samples=4), "K=1": dict(samples=1), "K=4, ELBO / R (DARE)": dict(normalise="padded_length")}
HELD_OUT = 200


def sft(folder, steps, queue):
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        a = train_sft.Args(model="tiny:llada", output_dir=folder, max_steps=steps, learning_rate=3e-3,
                           warmup_steps=0.0, lr_scheduler_type="constant", per_device_train_batch_size=16,
                           logging_steps=100, save_steps=10 ** 6, overwrite_output_dir=True)
        a.data.path = write_task("addition", f"{tmp}/train.jsonl", 4000, 0, "train")
        a.data.prompt_key, a.data.response_key, a.data.max_length, a.data.pad_to = ("prompt", "extra_info.solution",
                                                                                    64, "longest")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            train_sft.main(a)
    queue.put(folder)


def answer_accuracy(model_path) -> float:
    """Greedy answers to the held-out questions: the last \\boxed{} equals the chosen (right) one."""
    model, tokenizer, family = load_pretrained(str(model_path), dtype=torch.float32)
    pairs = pair_rows("task:addition", "test", PreferenceDataConfig(), HELD_OUT)
    texts = HFEngine(model.eval(), tokenizer, family, 256).generate([p["prompt"] for p in pairs], 1,
                                                                    SamplingConfig(gen_length=12), seed=0).texts
    boxed = [re.findall(r"\\boxed\{([^}]*)\}", t) for t in [*texts, *(p["chosen"] for p in pairs)]]
    found, chosen = boxed[:len(pairs)], boxed[len(pairs):]
    return sum(bool(a) and a[-1] == b[-1] for a, b in zip(found, chosen, strict=True)) / len(pairs)


def baseline(model, queue):
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        queue.put(answer_accuracy(model))


def vrpo(model, knobs, steps, lr, queue):
    torch.set_num_threads(1)
    counter = {"on": False, "rows": 0, "seconds": 0.0}
    logits, step = Family.logits, PreferenceTrainer.training_step

    def counted(self, network, input_ids, *args, **kwargs):
        counter["rows"] += counter["on"] * input_ids.shape[0]  # sequences through the model
        return logits(self, network, input_ids, *args, **kwargs)

    def timed(self, *args, **kwargs):
        counter["on"], start = True, time.perf_counter()
        try:
            return step(self, *args, **kwargs)
        finally:
            counter["on"], counter["seconds"] = False, counter["seconds"] + time.perf_counter() - start

    Family.logits, PreferenceTrainer.training_step = counted, timed
    with tempfile.TemporaryDirectory() as out:
        a = train_rl.args_class("vrpo")(model=model, output_dir=out, max_steps=steps, prompts_per_step=16,
                                        micro_batch_size=32, learning_rate=lr, eval_steps=steps, eval_on_start=True,
                                        save_steps=10 ** 6, logging_steps=10)
        for key, value in knobs.items():
            setattr(a.algo_config, key, value)
        p = a.preference
        p.path, p.eval_path, p.eval_split, p.limit, p.eval_limit = ("task:addition", "task:addition", "test",
                                                                    16 * steps, HELD_OUT)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trainer = train_rl.main(a)
            accuracy = answer_accuracy(out)
    before, after = [h for h in trainer.state.log_history if "eval_margin" in h]
    queue.put(dict(before=before, after=after, accuracy=accuracy, step=counter["seconds"] / steps,
                   forwards=counter["rows"] / (16 * steps)))


MEMORY_MODELS = {"llada": dict(d_model=512, n_heads=8, n_kv_heads=8, n_layers=8, mlp_hidden_size=2048),
                 "sdar": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                              num_key_value_heads=8, head_dim=64)}


def memory_step(family, samples, stream, queue):
    from dare.algos import get_algorithm
    from dare.data.preference import PreferenceCollator
    from dare.models import tiny
    model, tok = tiny(family, **MEMORY_MODELS[family])
    fam = Family.from_pretrained(model.config, tok)
    config = PreferenceDataConfig(max_response_length=256)
    pairs = [{"prompt": "Write a story.", "chosen": "once upon a time " * 60, "rejected": "the end " * 120, "index": i}
             for i in range(4)]
    batch = PreferenceCollator(tok, fam, config)(pairs)
    vrpo = get_algorithm("vrpo")(samples=samples, stream=stream).validate(fam)
    noise = vrpo.corrupt(fam, batch, [torch.Generator().manual_seed(i) for i in range(8)])
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.no_grad():
        reference = vrpo.elbo(model, fam, batch, noise)
    base, start = rss_kib("VmRSS"), time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        policy = vrpo.elbo(model, fam, batch, noise)
    vrpo.loss(policy, reference)[0].mean().backward()
    seconds, rss = time.perf_counter() - start, (rss_kib("VmHWM") - base) / 1024
    model.zero_grad(set_to_none=True)
    with LivePeak() as live:  # the same step again, its live tensors recorded (slower: not timed)
        vrpo.loss(vrpo.elbo(model, fam, batch, noise), reference)[0].mean().backward()
    queue.put({"saved": saved[0] / 2 ** 20, "peak": rss, "live": live.mib, "seconds": seconds,
               "params": sum(p.numel() for p in model.parameters()) / 1e6})


def memory_table(ks, unstreamed_max):
    print("| family | params | K | streamed | activations kept (MiB) | live peak (MiB) | RSS peak above start (MiB) | "
          "s / step |")
    print("|---|---|---|---|---|---|---|---|")
    for family in MEMORY_MODELS:
        for samples in ks:
            for stream in (True, False)[: 2 if samples <= unstreamed_max else 1]:
                try:
                    r = in_child(memory_step, family, samples, stream)
                except SystemExit as e:  # the unstreamed graph can outgrow the machine: report, go on
                    print(f"| {family} | | {samples} | {'yes' if stream else 'no'} | failed: {e} | | | |", flush=True)
                    continue
                print(f"| {family} | {r['params']:.0f}M | {samples} | {'yes' if stream else 'no'} | {r['saved']:.1f} | "
                      f"{r['live']:.0f} | {r['peak']:.0f} | {r['seconds']:.2f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft-steps", type=int, default=600)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--memory", action="store_true", help="only the peak-memory-vs-K table (streamed or not)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4, 8, 16], help="--memory: the K values (default 2 4 8 16)")
    p.add_argument("--unstreamed-max-k", type=int, default=16,
                   help="--memory: also time the unstreamed graph up to this K (default 16; it can outgrow the "
                        "machine)")
    args = p.parse_args()
    if args.memory:
        return memory_table(args.k, args.unstreamed_max_k)
    with tempfile.TemporaryDirectory() as tmp:
        model = in_child(sft, f"{tmp}/sft", args.sft_steps) if args.sft_steps else "tiny:llada"
        start = in_child(baseline, model)
        print(f"tiny LLaDA{f' SFT {args.sft_steps} steps' if args.sft_steps else ' (random)'}; VRPO {args.steps} "
              f"steps x 16 pairs, lr {args.lr}, beta 0.2; {HELD_OUT} held-out pairs\n")
        print("| variant | held-out margin before | after | accuracy before | after | ELBO gap before | after | "
              "greedy answer acc before | after | s / opt. step | forwards per pair per step |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name in args.variants:
            r = in_child(vrpo, model, VARIANTS[name], args.steps, args.lr)
            b, a = r["before"], r["after"]
            nats = 512 if VARIANTS[name].get("normalise") == "padded_length" else 1  # back from ELBO / R to nats

            def gap(h, nats=nats):
                return (h["eval_elbo/chosen"] - h["eval_elbo/rejected"]) * nats
            print(f"| {name} | {b['eval_margin'] * nats:.2f} | {a['eval_margin'] * nats:.2f} | "
                  f"{b['eval_accuracy']:.3f} | {a['eval_accuracy']:.3f} | {gap(b):.2f} | {gap(a):.2f} | {start:.3f} | "
                  f"{r['accuracy']:.3f} | {r['step']:.2f} | {r['forwards']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
