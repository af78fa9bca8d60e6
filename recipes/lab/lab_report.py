"""What the lab measures beside the rewards and how it reports them (``recipes/lab/compare.py``): forward passes,
peak memory, the mean and standard error over seeds, the table and the plot."""

import math
import os
import threading
from pathlib import Path

import torch

from dare.eval.lab import mean_se


class ForwardCounter:
    """Counts model forward passes (every forward embeds its input once: calls of any ``nn.Embedding``)."""

    def __enter__(self):
        self.count = 0

        def hook(module, inputs, output):
            self.count += isinstance(module, torch.nn.Embedding)
        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


class PeakMemory:
    """Peak memory while inside: CUDA's allocator peak, or on CPU the process's resident set, sampled every 20 ms."""

    def __enter__(self):
        self.mb, self.done = 0.0, threading.Event()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        else:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        page_mb = os.sysconf("SC_PAGE_SIZE") / 2 ** 20
        while not self.done.wait(0.02):
            with open("/proc/self/statm") as f:
                self.mb = max(self.mb, int(f.read().split()[1]) * page_mb)

    def __exit__(self, *exc):
        self.done.set()
        if torch.cuda.is_available():
            self.mb = torch.cuda.max_memory_allocated() / 2 ** 20
        else:
            self.thread.join()


def summarise(runs: list[dict]) -> dict:
    """Mean and standard error over seeds of every number. The gain's standard error is the seed-to-seed one, but
    never below one run's measurement noise over sqrt(seeds) (with one seed, or seeds that agree by chance)."""
    keys = [k for k in runs[0] if runs[0][k] is not None]
    out = {k: mean_se([r[k] for r in runs]) for k in keys}
    gains = [r["reward_after"] - r["reward_before"] for r in runs]
    gain, se = mean_se(gains)
    within = max(r["reward_se"] for r in runs)  # one run's paired standard error (the noise of one measurement)
    out["gain"] = (gain, max(se, within / math.sqrt(len(runs))))
    out["z"] = gain / out["gain"][1] if out["gain"][1] else 0.0
    out["seeds"] = len(runs)
    return out


def table(results: dict) -> str:
    lines = ["| family | algorithm | seeds | T=1 reward before | after | gain (SE) | gain / SE | greedy before | "
             "after | s / step | forwards / step | peak MB |", "|---" * 12 + "|"]
    for (family, spec), s in results.items():
        def f(k, d=3, s=s):
            m, e = s.get(k, (None, None))
            return "—" if m is None else f"{m:.{d}f} ± {e:.{d}f}"
        lines.append(f"| {family} | {spec} | {s['seeds']} | {f('reward_before')} | {f('reward_after')} | "
                     f"{s['gain'][0]:+.3f} ({s['gain'][1]:.3f}) | {s['z']:+.1f} | {f('greedy_before')} | "
                     f"{f('greedy_after')} | {f('seconds_per_step', 2)} | {f('forwards_per_step', 1)} | "
                     f"{s['peak_memory_mb'][0]:.0f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [f"{f} {a}" for f, a in results]
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(names)), 4.5))
    for i, key in enumerate(("reward_before", "reward_after")):
        ax.bar([j + 0.4 * i for j in range(len(names))], [s[key][0] for s in results.values()], 0.4,
               yerr=[s[key][1] for s in results.values()], label=key.replace("reward_", "T=1 reward "), capsize=2)
    ax.set_xticks([j + 0.2 for j in range(len(names))], names, fontsize="small", rotation=35, ha="right")
    ax.set_ylabel("held-out reward (T = 1)")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
