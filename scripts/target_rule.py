"""The benchmark's target rule for a rehearsal, fixed before its timed runs end: the worst of the three baseline
seeds' METRIC at 3/4 of the baseline's budget (the last evaluation at or before it), rounded by STEP towards the
easier side (up for a loss, down otherwise). It reads only the baseline's runs, in the bench's --run-dir.

That target is the lower one: the headline is measured at the baseline's final quality (bench/README.md, "The
target rule"), which the script prints from the same runs' finals (``compare.final_quality``).

    python scripts/target_rule.py RUNS gpt2-baseline eval/loss 0.05             # the language rehearsals
    python scripts/target_rule.py RUNS imagenet-plain-bf16 eval/accuracy 0.01   # the imagenet rehearsals
"""
import math
import sys
from pathlib import Path

from speedkit.experiments.compare import evaluation_at, final_quality
from speedkit.record.runs import RunRecord, lower_is_better


def main(runs: str, baseline: str, metric: str, step: str) -> None:
    step = float(step)
    at = {}
    for seed in (0, 1, 2):
        record = RunRecord.load(Path(runs) / f"{baseline}-s{seed}")
        batch, there = evaluation_at(record, metric, 0.75)
        at[seed] = (batch, round(there, 4), round(evaluation_at(record, metric, 1.0)[1], 4))
    print(f"{baseline} (batch at 3/4, {metric} there, final):", at)
    there = [v[1] for v in at.values()]
    if lower_is_better(metric):
        target = math.ceil(max(there) / step - 1e-9) * step
    else:
        target = math.floor(min(there) / step + 1e-9) * step
    print(f"target {target:.{max(0, -math.floor(math.log10(step)))}f}")
    quality = final_quality([v[2] for v in at.values()], metric)
    print(f"final quality (the headline's level where it asks more than the target): {quality['level']:.4f} "
          f"(median final {quality['median_final']:.4f}, tolerance {quality['tolerance']:.4f})")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
