"""The README's figure: seconds to the target for every baseline and recipe of each benchmarked task, drawn with
matplotlib from the committed records (bench/results/summary.json) alone.

    python scripts/draw_results_figure.py [--summary bench/results/summary.json] [--out bench/results/time_to_target.png]

One panel per task: a bar per recipe at its median time to the target over the seeds, a dot per seed, the
strongest baseline's bar hatched, and the best recipe's median speed-up over it written above its bar. A recipe
that missed the target in some seed is drawn over the seeds that reached it, and its label says how many did.
`make readme` runs it after rewriting the README's tables from the same file.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "bench" / "results" / "summary.json"
OUT = ROOT / "bench" / "results" / "time_to_target.png"
LOWER_IS_BETTER = ("bpb", "loss", "perplexity")


def target_label(entry: dict) -> str:
    metric, value = entry["target"]["metric"], entry["target"]["value"]
    name = metric.split("/")[-1]
    if name == "accuracy":
        return f"{entry['task']}: seconds to {value:.0%} accuracy"
    return f"{entry['task']}: seconds to {value:.2f} {'bits per byte' if name == 'bpb' else name}"


def panel_rows(entry: dict) -> list[tuple[str, list[float], int]]:
    """(name, the seeds' times to target that reached it, seeds run) for each baseline, then each recipe."""
    baselines = entry.get("baselines") or {"baseline": entry["baseline"]}
    rows = []
    for name, r in [*baselines.items(), *entry["recipes"].items()]:
        times = [t for t in r["time_to_target_s"] if t is not None]
        rows.append((name, times, len(r["time_to_target_s"])))
    return rows


def draw(summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    tasks = list(summary.items())
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.8), squeeze=False)
    for ax, (key, entry) in zip(axes[0], tasks):
        rows = panel_rows(entry)
        strongest, best = entry.get("strongest_baseline"), entry.get("best_recipe")
        names = [n if len(t) == seeds else f"{n}\n({len(t)}/{seeds})" for n, t, seeds in rows]
        medians = [statistics.median(t) if t else 0.0 for _, t, _ in rows]
        colours = ["#9e9e9e" if n in (entry.get("baselines") or {"baseline": 0}) else "#3f6fd8" for n, _, _ in rows]
        bars = ax.bar(range(len(rows)), medians, color=colours, width=0.65)
        for i, (name, times, _) in enumerate(rows):
            if name == strongest:
                bars[i].set_hatch("//")
                bars[i].set_edgecolor("white")
            ax.scatter([i] * len(times), times, color="black", s=9, zorder=3)
        if best in (n for n, _, _ in rows) and entry.get("speedup_median") is not None:
            i = [n for n, _, _ in rows].index(best)
            ax.annotate(f"{entry['speedup_median']:.1f}x sooner\nthan {strongest}", (i, medians[i]),
                        xytext=(0, 6), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(range(len(rows)), names, fontsize=8, rotation=30, ha="right")
        ax.set_ylabel("training seconds (median, dots: seeds)", fontsize=8)
        ax.set_title(target_label(entry), fontsize=9)
        ax.set_ylim(0, max(max(t, default=0) for _, t, _ in rows) * 1.12)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(axis="y", labelsize=8)
    machine = {f"{m['cpu']} CPU, {m.get('torch_threads', '?')} torch thread(s)" for m in
               (entry.get("machine") or {} for _, entry in tasks) if m.get("cpu")}
    fig.suptitle("Time to target, committed benchmark (bench/results/summary.json"
                 + (f"; {', '.join(sorted(machine))}" if machine else "") + "). Grey: baselines; hatched: strongest",
                 fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})  # no version stamp: the same records draw the same file
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw the README's time-to-target figure from summary.json.")
    parser.add_argument("--summary", type=Path, default=SUMMARY)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    print(f"wrote {draw(json.loads(args.summary.read_text()), args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
