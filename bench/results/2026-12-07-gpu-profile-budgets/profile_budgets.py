"""How long a recipe of the vision `gpu` bench profile must train to hold its target on seeds the benchmark does not
report: the profile's arithmetic (batch 512, learning rate 0.4, bf16, compiled) run on a CPU, each budget on
held-out seeds (the benchmark reports seeds 0-2). Writes one JSON line a run to OUT as it finishes.

    OMP_NUM_THREADS=1 .venv/bin/python bench/results/2026-12-07-gpu-profile-budgets/profile_budgets.py \
        --recipe hot --budgets 3ep,3.5ep --seeds 10-14 --out FILE
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from speedkit.experiments.bench.harness import run_one
from speedkit.experiments.bench.profiles import get_profile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="fashion-mnist")
    parser.add_argument("--recipe", default="hot")
    parser.add_argument("--budgets", required=True)
    parser.add_argument("--seeds", default="10-14")
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-dir", default="/tmp/gpu-profile-budgets")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    profile = get_profile(args.task, "gpu").replace(device="cpu")
    target = profile.target_value
    for budget in args.budgets.split(","):
        recipe = profile.recipe(args.recipe).with_budget(budget)
        for seed in seeds:
            started = time.perf_counter()
            record = run_one(profile, recipe, seed, f"{args.recipe}-{budget}-s{seed}", args.run_dir,
                             {"task": args.task, "profile": "gpu on cpu", "seed": seed})
            accuracies = [row["eval/accuracy"] for row in record.evals if row.get("eval/accuracy") is not None]
            row = {"task": args.task, "recipe": args.recipe, "budget": budget, "seed": seed,
                   "batch_size": recipe.batch_size, "lr": recipe.optimizer.get("lr"), "precision": recipe.precision,
                   "methods": sorted(recipe.methods), "target": target, "evals": accuracies,
                   "final": accuracies[-1], "reached": max(accuracies) >= target, "status": record.status,
                   "wall_s": round(time.perf_counter() - started, 1)}
            with Path(args.out).open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
