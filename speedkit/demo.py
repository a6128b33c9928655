"""The demo: notebooks/00_quickstart.ipynb run headlessly, then where its outputs are and the speed-up.

The quickstart trains the hand-written baseline and a speed-up recipe on Fashion-MNIST with the same
budget, seed, initial weights and test set; ``make demo`` and ``speedkit demo`` run it with the
``params/demo`` parameter set and print the comparison from the two RunRecords it wrote.
"""
from __future__ import annotations

from pathlib import Path

from speedkit.runs import RunRecord, load_records

QUICKSTART = "00_quickstart"


def run_demo(root: str | Path = ".", out: str | Path = "runs/demo", overrides: dict | None = None,
             params: str = "demo") -> int:
    """Execute the quickstart notebook; print the executed notebook, its HTML and the speed-up."""
    from speedkit.notebooks import run_notebooks

    notebook = Path(root) / "notebooks" / f"{QUICKSTART}.ipynb"
    if not notebook.exists():
        raise FileNotFoundError(f"{notebook} not found: the demo runs the quickstart notebook of a speedkit "
                                f"checkout; run it from the repository root or pass --root")
    print(f"running {notebook} headlessly (papermill) ...", flush=True)
    result = run_notebooks(params, out=out, root=root, only=[QUICKSTART], overrides=overrides)[0]
    print(f"executed notebook: {result.executed}\nHTML:              {result.html}")
    runs = [r for r in load_records(result.out_dir) if r.status == "completed"]
    baseline = [r for r in runs if r.config.get("recipe") == "baseline"]
    recipes = [r for r in runs if r.config.get("recipe") != "baseline"]
    if baseline and recipes:
        print(comparison_table(baseline[-1], recipes[-1]))
    if result.failed:
        print(f"the quickstart failed: {result.error}")
        return 1
    return 0


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
        f"speed-up at an equal {baseline.config['max_duration']} budget: {speedup:.2f}x "
        f"(baseline time / recipe time; evaluation excluded)",
        f"records: {baseline.path}, {recipe.path}",
    ])
