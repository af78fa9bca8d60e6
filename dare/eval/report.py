"""Reports: the per-benchmark table (json + markdown) of one run, and several runs side by side (table + PNG)."""

import json
import os
from pathlib import Path

COLUMNS = ("prompts", "samples", "decoded", "reused", "metric", "value", "accuracy", "pass@1", "tokens_per_s",
           "examples_per_s", "forwards_per_token", "mean_length")


def markdown(summaries: dict, title: str = "") -> str:
    keys = [c for c in COLUMNS if any(c in s for s in summaries.values())]
    keys += sorted({k for s in summaries.values() for k in s if k.startswith("pass@") and k not in keys})
    lines = ([f"### {title}", ""] if title else []) + ["| benchmark | " + " | ".join(keys) + " |",
                                                     "|---|" + "---|" * len(keys)]
    for bench, s in summaries.items():
        cells = [f"{v:.4g}" if isinstance(v, float) else "—" if v is None else str(v) for v in
                 (s.get(k, "") for k in keys)]
        lines.append(f"| {bench} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(folder: Path, summaries: dict, meta: dict) -> str:
    title = meta.get("model", "") + (f" ({meta['protocol']} protocol)" if meta.get("protocol") else "")
    text = markdown(summaries, title.strip())
    if "fp" in meta:
        text += (f"\nSamples made under fingerprint {meta['fp']} (fingerprint.json). Speed covers only the samples "
                 "decoded by this run.\n")
    (folder / "report.json").write_text(json.dumps({"meta": meta, "benchmarks": summaries}, indent=2))
    (folder / "report.md").write_text(text)
    return text


SEPARATORS = "-_/. "


def run_names(reports: list[str]) -> list[str]:
    """Short, distinct names for runs from their report paths: the path parts the runs do not share (the common
    folders and the file name dropped), then a common prefix/suffix cut at a separator (``eval-base``, ``eval-rl``
    -> ``base``, ``rl``). Falls back to the longer form whenever names would collide or vanish."""
    parts = [list(Path(r).with_suffix("").parts) for r in reports]
    if len(parts) < 2:
        return [p[-2] if len(p) > 1 else p[-1] for p in parts]
    if len({p[-1] for p in parts}) == 1:  # every file is report.json: name the folders
        parts = [p[:-1] or p for p in parts]
    while all(len(p) > 1 for p in parts) and len({p[0] for p in parts}) == 1:
        parts = [p[1:] for p in parts]
    while all(len(p) > 1 for p in parts) and len({p[-1] for p in parts}) == 1:
        parts = [p[:-1] for p in parts]
    names = ["/".join(p) for p in parts]
    if len(set(names)) < len(names):
        return [str(r) for r in reports]
    head = os.path.commonprefix(names)
    cut = max((head.rfind(c) for c in SEPARATORS), default=-1) + 1
    tail = os.path.commonprefix([n[::-1] for n in names])
    back = max((tail.rfind(c) for c in SEPARATORS), default=-1) + 1
    short = [n[cut:len(n) - back] for n in names]
    return short if all(short) and len(set(short)) == len(short) else names


def compare(reports: list[str], plot: str | None = None, metric: str = "accuracy") -> str:
    """Runs side by side: one row per benchmark, one column per run (a short name from its path; the model and
    path are listed under the table), and a grouped bar chart with value labels and the legend outside the axes."""
    runs = [json.loads(Path(r).read_text()) for r in reports]
    names = run_names(reports)
    benches = list(dict.fromkeys(b for r in runs for b in r["benchmarks"]))
    lines = ["| benchmark | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for b in benches:
        values = [r["benchmarks"].get(b, {}).get(metric) for r in runs]
        lines.append(f"| {b} | " + " | ".join("" if v is None else f"{v:.4f}" for v in values) + " |")
    lines.append("")
    lines += [f"- {name}: {r['meta'].get('model', '?')} ({p})" for name, r, p in zip(names, runs, reports, strict=True)]
    if plot:
        fig = plot_comparison(plot, names, benches, runs, metric)
        import matplotlib.pyplot as plt
        plt.close(fig)
    return "\n".join(lines) + "\n"


def plot_comparison(path: str, names: list[str], benches: list[str], runs: list[dict], metric: str):
    """Grouped bars (one colour per run, its value on top, "n/a" where a run lacks the benchmark), the legend to the
    right of the axes; saved to ``path``. Returns the figure (the caller closes it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(min(12.0, 2.5 + len(benches) * (0.6 + 0.45 * len(runs))), 4.0))
    top = 0.0
    for i, (run, name) in enumerate(zip(runs, names, strict=True)):
        values = [run["benchmarks"].get(b, {}).get(metric) for b in benches]
        bars = ax.bar([j - 0.4 + (i + 0.5) * width for j in range(len(benches))],
                      [v or 0 for v in values], width, label=name, color=plt.get_cmap("tab10")(i % 10))
        ax.bar_label(bars, ["n/a" if v is None else f"{v:.2f}" for v in values], padding=2, fontsize=8)
        top = max([top] + [v for v in values if v is not None])
    ax.set_xticks(range(len(benches)), benches, rotation=20 if len(benches) > 4 else 0,
                  ha="right" if len(benches) > 4 else "center")
    ax.set_ylabel(metric)
    ax.set_ylim(0, (top or 1) * 1.15)  # room for the value labels
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(f"{metric} by benchmark")
    ax.legend(title="run", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
