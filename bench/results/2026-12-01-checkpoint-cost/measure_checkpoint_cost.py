"""What checkpointing as it trains costs: the share of training time that ``speedkit train``'s default
save interval (``DEFAULT_SAVE_INTERVAL``, 5 minutes of training) spends writing checkpoints, per preset.

Each preset trains for ``--batches`` batches twice, interleaved (A B A B ...): once saving every
``--every`` batches, once with no checkpoint but the final one. A save's cost is read from the
records (``timings["checkpoint_s"]`` over the number of saves, the final save left out) and checked
against the wall-clock difference of the paired runs; the cost at the default interval is one save per
interval: ``seconds per save / interval``. Run it on a quiet machine (the issue asks for under 2%):

    .venv/bin/python bench/results/2026-12-01-checkpoint-cost/measure_checkpoint_cost.py --repeats 3 --out bench/results/2026-12-01-checkpoint-cost/checkpoint_cost.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from speedkit.core import Time
from speedkit.tasks import get_task, make_trainer
from speedkit.tasks.build import DEFAULT_SAVE_INTERVAL

TASKS = {"fashion-mnist": {"data_fraction": 0.25}, "pydocs": {}}


def one_run(task: str, recipe: str, batches: int, every: int | None, run_dir: str, name: str, device: str,
            options: dict) -> dict:
    trainer = make_trainer(task, recipe, duration=f"{batches}ba", device=device, run_dir=run_dir, run_name=name,
                           save_interval=f"{every}ba" if every else None, eval_fraction=0.05, **options)
    record = trainer.fit()
    return {"train_s": record.timings["train_s"], "checkpoint_s": record.timings.get("checkpoint_s", 0.0),
            "saves": batches // every if every else 0}


def measure(task: str, recipe: str, args, options: dict) -> dict:
    per_save, paired = [], []
    with tempfile.TemporaryDirectory() as run_dir:
        for repeat in range(args.repeats):
            saving = one_run(task, recipe, args.batches, args.every, run_dir, f"{recipe}-save-{repeat}",
                             args.device, options)
            plain = one_run(task, recipe, args.batches, None, run_dir, f"{recipe}-plain-{repeat}", args.device, options)
            # The final save happens in both runs; the others are what the interval adds.
            final_s = plain["checkpoint_s"]
            per_save.append(max(saving["checkpoint_s"] - final_s, 0.0) / max(saving["saves"] - 1, 1))
            paired.append((saving["train_s"] + saving["checkpoint_s"]) - (plain["train_s"] + plain["checkpoint_s"]))
    interval_s = Time.from_string(DEFAULT_SAVE_INTERVAL).value  # a wall-clock interval, in seconds
    seconds = statistics.median(per_save)
    return {"task": task, "recipe": recipe, "seconds_per_save": round(seconds, 4),
            "paired_difference_s": round(statistics.median(paired), 4),
            "default_interval": DEFAULT_SAVE_INTERVAL,
            "cost_at_default_interval_percent": round(100 * seconds / interval_s, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="save every this many batches in the saving runs")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    results = [measure(task, recipe, args, options) for task, options in TASKS.items()
               for recipe in get_task(task).recipes]  # every preset of the built-in tasks
    for r in results:
        print(f"{r['task']:<14} {r['recipe']:<10} {r['seconds_per_save']:.3f}s a save -> "
              f"{r['cost_at_default_interval_percent']:.3f}% of training at one save per {r['default_interval']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
