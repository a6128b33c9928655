"""The target of the imagenet rehearsal on photo-crops, fixed before its runs ended: the worst of the three
`plain-bf16` seeds' top-1 at 3/4 of its budget (the last evaluation at or before it), rounded down to 0.01 (the
language rehearsals' rule, for a metric where higher is better). Reads only the baseline's runs.

    python target_rule.py RUNS    # RUNS: the bench's --run-dir
"""
import json, math, pathlib, sys

runs = pathlib.Path(sys.argv[1])
at = {}
for seed in (0, 1, 2):
    folder = runs / f"imagenet-plain-bf16-s{seed}"
    rows = [json.loads(line) for line in open(folder / "log.jsonl")]
    evals = {r["batch"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    last = max(evals)
    batch = max(b for b in evals if b <= 0.75 * last)
    at[seed] = (batch, round(evals[batch], 4), round(evals[last], 4))
print("plain-bf16 (batch at 3/4, top-1 there, final):", at)
print(f"target {math.floor(min(v[1] for v in at.values()) / 0.01 + 1e-9) * 0.01:.2f}")
