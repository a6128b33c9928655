"""What the notebooks import: the quickstart's pairs, its ratio beside the committed benchmark's, whether the
machine was busy, and its figure. The demo (``speedkit demo``, ``speedkit.cli.demo``) runs the quickstart and
prints the same ratio through ``speedup_summary``.

The pairs are measured by ``speedkit.experiments.measure.measure`` (``quickstart_pairs``), the one measuring core the
benchmark and the search use, and ``speedup_summary`` reads its ratios from the ``Measurement`` it returns, so a
ratio here is what it is there: baseline time to target / recipe time to target, pair by pair.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

from speedkit.experiments.measure import Measurement, measure
from speedkit.record.runs import RunRecord

SUMMARY = Path("bench") / "results" / "summary.json"  # under the notebook root: a checkout or the installed copy
TASK_KINDS = {"fashion-mnist": "vision", "pydocs": "language"}  # summary.json's keys
BUSY_SLOWDOWN = 1.25  # a calibration matmul this much slower after the runs than before: something else ran


def quickstart_pairs(explorer, recipe: str, repeats: int, time_budget_s: float | None = None, **run_settings):
    """Run ``baseline`` and ``recipe`` in pairs through the explorer (``run_settings`` go to each run), interleaved,
    up to ``repeats`` pairs or while another fits ``time_budget_s`` seconds of training (``another_pair_fits``).
    Returns the ``Measurement`` (``speedkit.experiments.measure``) and each pair's training seconds."""
    def train_seconds(m) -> list[float]:
        return [sum(m.runs[name][i].timings["train_s"] for name in ("baseline", recipe)) for i in range(len(m.seeds))]

    measurement = measure([recipe], ["baseline"], range(repeats),
                          lambda name, pair: explorer.run_all([{"recipe": name}], **run_settings)[0],
                          keep_going=lambda m: another_pair_fits(train_seconds(m), time_budget_s))
    return measurement, train_seconds(measurement)


# -- what the notebook reports ------------------------------------------------------------------------------------
def speedup_summary(pairs: Measurement, recipe: str | None = None) -> tuple[float, str]:
    """The median of the quickstart's ratios baseline time to target / recipe time to target
    (``Measurement.ratios``: pair i ran side by side), and a line saying it with the spread, the target and the
    budgets. ``pairs``: what ``quickstart_pairs`` measured (or ``Measurement.of_runs``, its records read back);
    ``recipe``: which of its recipes (the first by default), against its first baseline."""
    recipe = recipe or pairs.recipes[0]
    baselines, recipes = pairs.runs[pairs.baselines[0]], pairs.runs[recipe]
    if not baselines:
        raise ValueError("no pair of runs was measured, so there is nothing to compare; repeats must be at least 1")
    missed = [r.name for r in (*baselines, *recipes) if r.time_to_target is None]
    if missed:
        raise ValueError(f"{', '.join(missed)} never reached the target, so there is no time to compare; "
                         f"lower target or raise duration")
    ratios = pairs.ratios(recipe)
    median = statistics.median(ratios)
    name = recipes[0].config.get("recipe", recipes[0].name)
    reached = (f"{name} reached {_target_text(baselines[0])} {median:.2f}x sooner than the baseline "
               f"({_budgets_text(baselines[0], recipes[0])})")
    if len(ratios) == 1:
        return median, (f"{reached}, from one pair of runs (one pair has no spread, and on a busy machine it can "
                        f"be far off)")
    each = ", ".join(f"{r:.2f}x" for r in ratios)
    return median, (f"{reached}: median of {len(ratios)} interleaved pairs, spread {min(ratios):.2f}x to "
                    f"{max(ratios):.2f}x ({each})")


def another_pair_fits(pair_seconds: list[float], budget_s: float | None) -> bool:
    """Whether one more pair is expected to fit in ``budget_s`` seconds of training, going by the mean of the
    pairs run so far. The first pair always runs; ``None`` is no budget."""
    if budget_s is None or not pair_seconds:
        return True
    spent = sum(pair_seconds)
    return spent + spent / len(pair_seconds) <= budget_s


def pairs_note(pair_seconds: list[float], repeats: int, budget_s: float | None) -> str:
    """A line saying how many pairs ran, their training seconds, and why no more did."""
    ran = len(pair_seconds)
    spent = f"{sum(pair_seconds):.0f} s of training ({', '.join(f'{s:.0f} s' for s in pair_seconds)} a pair)"
    if ran >= repeats:
        return f"{ran} pair{'' if ran == 1 else 's'} as asked, {spent}"
    return (f"{ran} of {repeats} pairs, {spent}: another would not fit the {budget_s:.0f} s budget on this machine; "
            f"time_budget_s=None runs all {repeats}")


def _target_text(record: RunRecord) -> str:
    target = record.target or {}
    return f"{target.get('metric', 'the target')} {target.get('value')}"


def _budgets_text(baseline: RunRecord, recipe: RunRecord) -> str:
    budgets = [f"{r.config.get('recipe', r.name)} {r.config.get('max_duration')}" for r in (baseline, recipe)]
    return f"budgets {' and '.join(budgets)}, each stopped at the target; training seconds, evaluation excluded"


def comparison_table(baseline: RunRecord, recipe: RunRecord) -> str:
    """One pair side by side: time to target, training time, accuracy where it stopped, and the setup."""
    rows = []
    for record in (baseline, recipe):
        spec = record.config.get("recipe_spec", {})
        reached = record.time_to_target
        rows.append(f"  {record.config.get('recipe', record.name):<10} "
                    f"{(f'{reached:.1f}s' if reached is not None else 'not reached'):>14} "
                    f"{record.timings['train_s']:>8.1f}s "
                    f"{100 * record.final_metrics.get('eval/accuracy', float('nan')):>8.2f}%   "
                    f"budget {record.config.get('max_duration')}, "
                    f"{spec.get('precision', '?')}/{record.config.get('precision_resolved')}, "
                    f"batch {spec.get('batch_size')}, {spec.get('loader')} loader, "
                    f"methods: {', '.join(spec.get('methods', {})) or 'none'}")
    return "\n".join([
        "",
        f"  {'run':<10} {'time to target':>14} {'trained':>9} {'accuracy':>9}   setup "
        f"(target {_target_text(baseline)})",
        *rows,
        f"records: {baseline.path}, {recipe.path}",
    ])


def committed_benchmark(recipe: str, task: str = "fashion-mnist", root: str | Path | None = None) -> dict:
    """What the committed benchmark (bench/results/summary.json) measured for ``recipe`` against the
    hand-written baseline: its target, the median ratio, the seeds, threads and machine."""
    from speedkit.cli.shipped import notebook_root  # a peer in the top layer: where the committed results are

    path = notebook_root(root) / SUMMARY
    kind = TASK_KINDS.get(task)
    summary = json.loads(path.read_text()).get(kind) if path.exists() else None
    if summary is None or recipe not in summary.get("recipes", {}):
        raise ValueError(f"{path} has no {task} benchmark of {recipe!r}; the committed benchmark measured "
                         f"{sorted((summary or {}).get('recipes', {})) or 'nothing'}")
    machine = summary.get("machine", {})
    return {"recipe": recipe, "target": summary["target"]["value"], "metric": summary["target"]["metric"],
            "ratio": summary["recipes"][recipe]["speedup_median_vs"]["baseline"], "seeds": len(summary["seeds"]),
            "threads": machine.get("torch_threads"), "machine": f"{machine.get('cpu', '?')} {machine.get('device', '')}",
            "date": str(summary.get("date", ""))[:10], "path": str(path)}


def fastest_preset(task: str = "fashion-mnist", root: str | Path | None = None) -> str:
    """The preset the committed benchmark found fastest to its target on ``task`` (``hot`` for vision)."""
    from speedkit.cli.shipped import notebook_root  # a peer in the top layer: where the committed results are

    path = notebook_root(root) / SUMMARY
    summary = json.loads(path.read_text()).get(TASK_KINDS.get(task, task), {}) if path.exists() else {}
    if not summary.get("best_recipe"):
        raise ValueError(f"{path} names no fastest {task} preset; pass recipe= (e.g. 'hot')")
    return summary["best_recipe"]


def benchmark_comparison(ratio: float, recipe: str, target: float, task: str = "fashion-mnist") -> str:
    """The demo's ratio beside the committed benchmark's, each with its target, so neither passes for the other."""
    bench = committed_benchmark(recipe, task)
    return (f"this demo:           {recipe} {ratio:.2f}x sooner to {target} (here, now)\n"
            f"committed benchmark: {recipe} {bench['ratio']:.2f}x sooner to {bench['target']} (the full target; "
            f"median of {bench['seeds']} seeds, {bench['threads']} thread(s) on a quiet {bench['machine'].strip()}, "
            f"{bench['date']}; {bench['path']})\n"
            f"They are different measurements: a lower target, this machine and its load here.")


# -- was the machine busy? ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class MachineLoad:
    """One look at the machine: the 1-minute load average, the cores, and how long a fixed matmul took."""

    load: float | None
    cores: int
    matmul_s: float


def machine_load(device: str = "cpu") -> MachineLoad:
    """The load average and a calibration matmul timed now (median of 5; on CUDA, synchronized)."""
    import torch

    target = torch.device("cuda" if str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available())
                          else "cpu")
    a = torch.randn(512, 512, device=target)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(4):
            a @ a
        if target.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return MachineLoad(load=load, cores=os.cpu_count() or 1, matmul_s=statistics.median(times))


def busy_note(before: MachineLoad, after: MachineLoad) -> str:
    """A line saying whether something else competed with the runs: the load before they started (they had
    not added to it yet) and the calibration matmul after them against before."""
    slowdown = after.matmul_s / before.matmul_s
    signs = []
    if before.load is not None and before.load > 0.5 * before.cores:
        signs.append(f"load average {before.load:.1f} on {before.cores} cores before the runs started")
    if slowdown > BUSY_SLOWDOWN:
        signs.append(f"a calibration matmul took {slowdown:.2f}x as long after the runs as before")
    measured = (f"load average {before.load if before.load is None else round(before.load, 1)} on {before.cores} "
                f"cores before; calibration matmul {1000 * before.matmul_s:.1f} ms before, "
                f"{1000 * after.matmul_s:.1f} ms after")
    if signs:
        return (f"the machine was busy ({'; '.join(signs)}): other work shared the cores, so these times are "
                f"slower and noisier than a quiet machine's (interleaving shares the load between the two sides)")
    return f"the machine looked quiet ({measured})"


# -- the figure -----------------------------------------------------------------------------------------------
def save_accuracy_figure(records: list[RunRecord], path: str | Path, target: float | None = None,
                         metric: str = "eval/accuracy") -> Path:
    """Accuracy against training seconds for every run (baselines dashed, the target as a line), as a PNG
    drawn with matplotlib (offline; no browser or kaleido)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: the file is the output
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"the demo's PNG figure needs matplotlib ({e}): pip install 'torch-speedkit[demo]'") from e
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    colors: dict[str, str] = {}
    for record in records:
        name = record.config.get("recipe", record.name)
        xs, ys = record.series(metric)
        baseline = name == "baseline"
        line, = ax.plot(xs, ys, linestyle="--" if baseline else "-", marker=".", alpha=0.8,
                        color=colors.get(name), label=None if name in colors else name)
        colors.setdefault(name, line.get_color())
    if target is not None:
        ax.axhline(target, color="grey", linewidth=0.8)
        ax.annotate(f"target {target}", (0, target), xycoords=("axes fraction", "data"), textcoords="offset points",
                    xytext=(4, 4), color="grey")
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel(metric)
    ax.set_title("time to target: each pair run interleaved, the baseline dashed")
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
