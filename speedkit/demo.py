"""The headless demo: the hand-written baseline and a speed-up recipe on Fashion-MNIST, side by side.

Both runs get the same epoch budget, the same seed, the same initial weights and the same test
set; the demo prints each run's training time (evaluation apart), accuracy, and the ratio.
"""
from __future__ import annotations

from speedkit.runs import RunRecord
from speedkit.tasks import make_trainer

DEMO_DURATION = "1ep"
DEMO_RECIPE = "mild"


def run_demo(duration: str | None = None, data_fraction: float | None = None, run_dir: str = "runs/demo",
             device: str = "auto", recipe: str = DEMO_RECIPE, seed: int = 0) -> dict[str, RunRecord]:
    duration = duration or DEMO_DURATION
    records = {}
    for name in ("baseline", recipe):
        print(f"\n== {name}: {duration} on Fashion-MNIST ==", flush=True)
        trainer = make_trainer("fashion-mnist", name, duration=duration, data_fraction=data_fraction or 1.0,
                               device=device, seed=seed, run_dir=run_dir, run_name=name, progress_bar=True,
                               eval_interval=duration)
        records[name] = trainer.fit()
    print(comparison_table(records["baseline"], records[recipe]))
    return records


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
