"""Reports: the per-benchmark table (json + markdown) of one run, and several runs side by side (table + PNG)."""

import json
from pathlib import Path

COLUMNS = ("prompts", "samples", "decoded", "reused", "accuracy", "pass@1", "tokens_per_s", "forwards_per_token",
           "mean_length")


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
    text = markdown(summaries, meta.get("model", ""))
    if "fp" in meta:
        text += (f"\nSamples made under fingerprint {meta['fp']} (fingerprint.json). Speed covers only the samples "
                 "decoded by this run.\n")
    (folder / "report.json").write_text(json.dumps({"meta": meta, "benchmarks": summaries}, indent=2))
    (folder / "report.md").write_text(text)
    return text


def compare(reports: list[str], plot: str | None = None, metric: str = "accuracy") -> str:
    """Runs side by side: one row per benchmark, one column per run (named by its model), and a bar chart."""
    runs = [json.loads(Path(r).read_text()) for r in reports]
    names = [f"{r['meta'].get('model', Path(p).parent.name)} ({Path(p).parent.name})" for r, p in zip(runs, reports)]
    benches = list(dict.fromkeys(b for r in runs for b in r["benchmarks"]))
    lines = ["| benchmark | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for b in benches:
        values = [r["benchmarks"].get(b, {}).get(metric) for r in runs]
        lines.append(f"| {b} | " + " | ".join("" if v is None else f"{v:.4f}" for v in values) + " |")
    if plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(max(4, 1.5 * len(benches) * len(runs) / 2), 3.5))
        width = 0.8 / len(runs)
        for i, (run, name) in enumerate(zip(runs, names)):
            ax.bar([j + i * width for j in range(len(benches))],
                   [run["benchmarks"].get(b, {}).get(metric) or 0 for b in benches], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(benches))], benches)
        ax.set_ylabel(metric)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
    return "\n".join(lines) + "\n"
