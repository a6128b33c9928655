"""Recipes run as a user runs them (`speedkit train ... --stop-at-target`), side by side on seeds that no
search or confirmation ran, interleaved seed by seed; each one's speed-up over a named baseline, paired by seed.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/fresh_seeds.py --seeds 4,5,6 \
        --common "--task image-folder --data data/heldout/glyphs --no-flips" \
        --run "plain-bf16: --recipe plain-bf16 --eval-interval 0.25ep" \
        --run "tuned baseline: --recipe runs/tune/baseline.yaml" \
        --run "tune pick: --recipe runs/tune/recipe.yaml" \
        --baseline "tuned baseline" --out bench/results/2026-11-30-recipe-searches/NAME/fresh_seeds.json

A baseline evaluates as finely as the search timed it (a time to target is read at an evaluation, so a
coarser cadence would round the baseline's time up). Time on a quiet machine only.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from speedkit.experiments.compare import machine_text
from speedkit.record.runs import RunRecord, cpu_name


def parse_run(text: str) -> tuple[str, list[str]]:
    label, sep, flags = text.partition(":")
    if not sep or not label.strip() or "--recipe" not in flags:
        raise SystemExit(f"--run {text!r}: write it as 'LABEL: --recipe R [more speedkit train flags]'")
    return label.strip(), shlex.split(flags)


def train(common: list[str], flags: list[str], seed: int, run_dir: Path, name: str) -> dict:
    command = [sys.executable, "-m", "speedkit.cli.main", "train", *common, *flags, "--seed", str(seed),
               "--stop-at-target", "--no-progress", "--run-dir", str(run_dir), "--run-name", name, "--overwrite"]
    print("$", shlex.join(command[3:]), flush=True)
    subprocess.run(command, check=True)
    record = RunRecord.load(run_dir / name / "record.json")
    metric = record.target["metric"]
    return {"time_to_target_s": record.time_to_target, "best": record.best(metric),
            "final": record.final_metrics.get(metric)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--seeds", default="4,5,6", help="comma-separated seeds (default 4,5,6)")
    parser.add_argument("--common", default="", help="speedkit train flags every run shares (task, data)")
    parser.add_argument("--run", action="append", required=True, help="'LABEL: --recipe R [flags]'; repeatable")
    parser.add_argument("--baseline", required=True, help="the LABEL speed-ups are measured against")
    parser.add_argument("--run-dir", default="runs/fresh-seeds", help="where the runs' folders go")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    runs = dict(parse_run(text) for text in args.run)
    if args.baseline not in runs:
        raise SystemExit(f"--baseline {args.baseline!r} is none of the --run labels {list(runs)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    common = shlex.split(args.common)
    rows = []
    for seed in seeds:
        row = {"seed": seed}
        for label, flags in runs.items():
            row[label] = train(common, flags, seed, Path(args.run_dir), f"{label.replace(' ', '-')}-s{seed}")
        base = row[args.baseline]["time_to_target_s"]
        row["speedup"] = {label: (None if base is None or row[label]["time_to_target_s"] is None
                                  else base / row[label]["time_to_target_s"]) for label in runs if label != args.baseline}
        rows.append(row)
    medians = {}
    for label in runs:
        if label == args.baseline:
            continue
        present = [r["speedup"][label] for r in rows if r["speedup"][label] is not None]
        medians[label] = {"speedup_median": statistics.median(present) if present else None,
                          "seeds_reached": f"{sum(r[label]['time_to_target_s'] is not None for r in rows)}/{len(rows)}"}
    import torch

    result = {"what": f"recipes run as `speedkit train --stop-at-target` runs them, against {args.baseline!r}, "
                      f"on seeds {seeds}, interleaved seed by seed",
              "command": shlex.join(["scripts/fresh_seeds.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": machine_text({"cpu": cpu_name(), "torch_threads": torch.get_num_threads(),
                                       "torch": torch.__version__}, datetime.date.today().isoformat()),
              "baseline": args.baseline, "runs": {label: shlex.join(flags) for label, flags in runs.items()},
              "seeds": rows, "summary": medians}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(medians, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
