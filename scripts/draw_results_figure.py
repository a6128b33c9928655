"""The README's figure: seconds to the target for every baseline and recipe of each benchmarked task, drawn with
matplotlib from the committed records (bench/results/summary.json) alone.

    python scripts/draw_results_figure.py [--summary bench/results/summary.json] [--out bench/results/time_to_target.png]

One panel per task: a bar per recipe at its median time to the strongest baseline's final quality over the seeds
(bench/README.md, "The target rule"), a dot per seed, the strongest baseline's bar hatched, and the best recipe's
median speed-up over it written above its bar. A recipe that missed that level in some seed is drawn over the seeds
that reached it, and its label says how many did; one that reached it on none has no bar and says so. Where the
committed records time only a lower target, the panel draws that target's times, its title says it is lower,
and each label says on how many seeds the recipe ended at the final quality.
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


def _level_words(metric: str, value: float, digits: int) -> str:
    name = metric.split("/")[-1]
    if name == "accuracy":
        return f"{value:.{max(0, digits - 2)}%} accuracy"
    return f"{value:.{digits}f} {'bits per byte' if name == 'bpb' else name}"


def timed_at_final_quality(entry: dict) -> bool:
    """Whether the summary times its recipes to the baseline's final quality (else only to a lower target)."""
    fq = entry.get("final_quality")
    return bool(fq and fq["times_recorded"])


def target_label(entry: dict) -> str:
    metric, value = entry["target"]["metric"], entry["target"]["value"]
    fq = entry.get("final_quality")
    if fq is None:
        return f"{entry['task']}: seconds to {_level_words(metric, value, 2)}"
    level = _level_words(metric, fq["value"], 3)
    if fq["is_target"]:
        return (f"{entry['task']}: seconds to {_level_words(metric, value, 2)}\n"
                f"(at or beyond {fq['baseline']}'s final quality)")
    if fq["times_recorded"]:
        return f"{entry['task']}: seconds to {level}, {fq['baseline']}'s final quality"
    return (f"{entry['task']}: seconds to the lower target, {_level_words(metric, value, 2)}\n"
            f"({fq['baseline']}'s final quality, {level}, not timed in these records)")


def panel_rows(entry: dict) -> list[tuple[str, list[float], int, str]]:
    """(name, the seeds' times that reached the panel's level, seeds run, a note for the label) for each
    baseline, then each recipe."""
    baselines = entry.get("baselines") or {"baseline": entry["baseline"]}
    rows = []
    for name, r in [*baselines.items(), *entry["recipes"].items()]:
        n = len(r["time_to_target_s"])
        if timed_at_final_quality(entry):
            times = [t for t in r["final_quality"]["time_s"] if t is not None]
            note = "" if len(times) == n else f"({len(times)}/{n})" if times else "(not reached)"
        else:
            times = [t for t in r["time_to_target_s"] if t is not None]
            note = "" if len(times) == n else f"({len(times)}/{n})"
            if "final_quality" in r and r["final_quality"]["reached"] < n:
                note += f" (final quality {r['final_quality']['reached']}/{n})"
        rows.append((name, times, n, note.strip()))
    return rows


def headline_ratio(entry: dict) -> tuple[str | None, float | None, str]:
    """The recipe whose speed-up the panel writes, the ratio, and what it is a ratio at."""
    fq = entry.get("final_quality")
    if fq and fq["times_recorded"]:
        return fq["best_recipe"], fq["speedup_median"], "sooner"
    lower = fq is not None and not fq["is_target"]
    return entry.get("best_recipe"), entry.get("speedup_median"), "sooner to the\nlower target" if lower else "sooner"


def draw(summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    tasks = list(summary.items())
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.8), squeeze=False)
    for ax, (key, entry) in zip(axes[0], tasks):
        rows = panel_rows(entry)
        strongest = entry.get("strongest_baseline")
        best, ratio, what = headline_ratio(entry)
        names = [f"{n}\n{note}" if note else n for n, _, _, note in rows]
        medians = [statistics.median(t) if t else 0.0 for _, t, _, _ in rows]
        colours = ["#9e9e9e" if n in (entry.get("baselines") or {"baseline": 0}) else "#3f6fd8"
                   for n, _, _, _ in rows]
        bars = ax.bar(range(len(rows)), medians, color=colours, width=0.65)
        for i, (name, times, _, _) in enumerate(rows):
            if name == strongest:
                bars[i].set_hatch("//")
                bars[i].set_edgecolor("white")
            ax.scatter([i] * len(times), times, color="black", s=9, zorder=3)
        if best in (n for n, _, _, _ in rows) and ratio is not None:
            i = [n for n, _, _, _ in rows].index(best)
            ax.annotate(f"{ratio:.1f}x {what}\nthan {strongest}", (i, medians[i]),
                        xytext=(0, 6), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(range(len(rows)), names, fontsize=8, rotation=30, ha="right")
        ax.set_ylabel("training seconds (median, dots: seeds)", fontsize=8)
        ax.set_title(target_label(entry), fontsize=9)
        ax.set_ylim(0, max(max(t, default=0) for _, t, _, _ in rows) * 1.18)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(axis="y", labelsize=8)
    machine = {f"{m['cpu']} CPU, {m.get('torch_threads', '?')} torch thread(s)" for m in
               (entry.get("machine") or {} for _, entry in tasks) if m.get("cpu")}
    fig.suptitle("Time to the baseline's final quality, committed benchmark (bench/results/summary.json"
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
