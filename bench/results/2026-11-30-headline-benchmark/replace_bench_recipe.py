"""Replace one recipe's runs in a task's benchmark entry by a later re-run of it, and rewrite the reports.

When a preset changes after the benchmark (it missed its target in a seed, say), re-run just that
preset beside one baseline, in the same sitting:

    speedkit bench --task fashion-mnist --recipes mild --baselines plain-bf16 --budgets bench/results/2026-11-30-headline-benchmark/vision_budgets.json \\
        --run-dir runs/bench-mild --out runs/bench-mild
    python bench/results/2026-11-30-headline-benchmark/replace_bench_recipe.py vision mild runs/bench runs/bench-mild \\
        --budgets bench/results/2026-11-30-headline-benchmark/vision_budgets.json

The entry is summarised again from the records: the other runs, the leave-one-out runs and the time
breakdown come from the main benchmark; the re-run recipe's runs come from the second folder and are
paired by seed with the main benchmark's baseline runs. The entry's ``notes`` say so.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from speedkit.experiments.bench.harness import resolve_profile, summarize
from speedkit.experiments.bench.profiles import get_profile, task_key
from speedkit.experiments.report import write_reports
from speedkit.record.runs import load_records


def main_runs(folder: str | Path) -> list:
    """Finished main runs (no leave-one-out, profiling, budget-search or sweep runs), oldest first."""
    skip = ("profiling", "budget_search", "sweep")
    return [r for r in load_records(folder) if "ablation" not in r.config and r.status != "failed"
            and not any(r.config.get("bench", {}).get(k) for k in skip)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", help="vision or language")
    parser.add_argument("recipe", help="the recipe whose runs the second folder replaces")
    parser.add_argument("main_runs", help="the main benchmark's --run-dir")
    parser.add_argument("rerun_runs", help="the re-run's --run-dir")
    parser.add_argument("--budgets", help="the <task>_budgets.json the benchmark ran the baselines with")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)

    key = task_key(args.task)
    old = json.loads((Path(args.out) / "summary.json").read_text())[key]
    first = [r for r in main_runs(args.main_runs) if r.config.get("recipe") != args.recipe]
    rerun = [r for r in main_runs(args.rerun_runs) if r.config.get("recipe") == args.recipe]
    if not rerun:
        raise SystemExit(f"no finished run of {args.recipe} in {args.rerun_runs}")
    ran = {r.config["recipe"] for r in first} | {args.recipe}
    speedups = [n for n in get_profile(key, old["profile"]).recipes if n in ran and n not in old["baselines"]]
    profile, _ = resolve_profile(key, old["profile"], seeds=len(old["seeds"]), recipes=speedups,
                                 baselines=list(old["baselines"]))
    ablations = [r for r in load_records(args.main_runs) if "ablation" in r.config]
    budgets = json.loads(Path(args.budgets).read_text()) if args.budgets else None
    entry = summarize([*first, *rerun], profile, ablations, old.get("time_breakdown"), budgets)
    note = (f"{args.recipe} was re-run after the main runs ({len(rerun)} runs, same sitting) and is paired by "
            f"seed with the main runs' baselines")
    entry["notes"] = [*[n for n in old.get("notes", []) if n != note], note]
    write_reports(args.out, key, entry, [*first, *rerun])
    print(f"{key}: {args.recipe} replaced; best recipe {entry['best_recipe']}, "
          f"speed-up {entry['speedup_median']} against {entry['strongest_baseline']}")


if __name__ == "__main__":
    main()
