"""The demo: notebooks/00_quickstart.ipynb run headlessly, then where its outputs are and the speed-up.

The quickstart trains the hand-written baseline and a speed-up recipe on Fashion-MNIST with the same
budget, seed, initial weights and test set; ``make demo`` and ``speedkit demo`` run it with the
``params/demo`` parameter set, show each cell as it starts and the runs' progress lines while it runs,
and print the comparison from the RunRecords it wrote. On a busy machine one pair of runs says little
(the ratio moved from 2.8x to 5.7x between two demos), so the demo runs ``repeats`` short pairs
interleaved (baseline, recipe, baseline, recipe, ...) and reports the median ratio with its spread.
"""
from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path

from speedkit.record.runs import RunRecord, load_records

QUICKSTART = "00_quickstart"


def run_demo(root: str | Path = ".", out: str | Path = "runs/demo", overrides: dict | None = None,
             params: str = "demo") -> int:
    """Execute the quickstart notebook; print the executed notebook, its HTML and the speed-up."""
    from speedkit.cli.notebooks import run_notebooks

    notebook = Path(root) / "notebooks" / f"{QUICKSTART}.ipynb"
    if not notebook.exists():
        raise FileNotFoundError(f"{notebook} not found: the demo runs the quickstart notebook of a speedkit "
                                f"checkout; run it from the repository root or pass --root")
    print(f"running {notebook} headlessly (papermill); each cell and the runs' progress follow ...", flush=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = run_notebooks(params, out=out, root=root, only=[QUICKSTART], overrides=overrides,
                           stream=lambda line: print(line, flush=True))[0]
    print(f"executed notebook: {result.executed}\nHTML:              {result.html}")
    # this demo's runs only (earlier demos' records share the folder), in the order they ran
    runs = sorted((r for r in load_records(result.out_dir) if r.status == "completed" and r.created >= started),
                  key=lambda r: r.created)
    baselines = [r for r in runs if r.config.get("recipe") == "baseline"]
    recipes = [r for r in runs if r.config.get("recipe") != "baseline"]
    if baselines and recipes:
        print(comparison_table(baselines[-1], recipes[-1]))
        print(speedup_summary(baselines, recipes)[1])
    if result.failed:
        print(f"the quickstart failed: {result.error}")
        return 1
    return 0


def speedup_summary(baselines: list[RunRecord], recipes: list[RunRecord]) -> tuple[float, str]:
    """The median of the pairwise ratios baseline time / recipe time (pair i: the i-th of each, run side by
    side), and a line saying it with the spread."""
    if not baselines or len(baselines) != len(recipes):
        raise ValueError(f"pairs need as many baseline runs as recipe runs, got {len(baselines)} and {len(recipes)}")
    ratios = [b.timings["train_s"] / r.timings["train_s"] for b, r in zip(baselines, recipes)]
    median = statistics.median(ratios)
    if len(ratios) == 1:
        return median, (f"speed-up {median:.2f}x from one pair of runs (on a busy machine one pair can be far "
                        f"off; repeats=3 interleaves three)")
    each = ", ".join(f"{r:.2f}x" for r in ratios)
    return median, (f"speed-up {median:.2f}x: median of {len(ratios)} interleaved pairs, spread "
                    f"{min(ratios):.2f}x to {max(ratios):.2f}x ({each})")


def comparison_table(baseline: RunRecord, recipe: RunRecord) -> str:
    rows = []
    for record in (baseline, recipe):
        spec = record.config.get("recipe_spec", {})
        rows.append(f"  {record.config.get('recipe', record.name):<10} {record.timings['train_s']:>8.1f}s "
                    f"{100 * record.final_metrics.get('eval/accuracy', float('nan')):>8.2f}%   "
                    f"{spec.get('precision', '?')}/{record.config.get('precision_resolved')}, "
                    f"batch {spec.get('batch_size')}, {spec.get('loader')} loader, "
                    f"methods: {', '.join(spec.get('methods', {})) or 'none'}")
    speedup = baseline.timings["train_s"] / recipe.timings["train_s"]
    return "\n".join([
        "",
        f"  {'run':<10} {'train time':>9} {'accuracy':>9}   setup",
        *rows,
        f"this pair at an equal {baseline.config['max_duration']} budget: {speedup:.2f}x "
        f"(baseline time / recipe time; evaluation excluded)",
        f"records: {baseline.path}, {recipe.path}",
    ])
