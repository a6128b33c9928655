"""The target rule of the language rehearsals, fixed before their timed runs: the worst of the three baseline seeds'
evaluation loss at 3/4 of the baseline's budget (batch 525 of 700), rounded up to 0.05. Reads only the baseline's
runs, in the bench's --run-dir. This one ran on /work/data/lang-full/RUNS; the rehearsals on shuffled shards
(lang-rehearsal-debdocs-mixed, and lang-rehearsal-debdocs-hot240) on theirs.

    python target_rule.py RUNS
"""
import json, math, pathlib, sys
runs = pathlib.Path(sys.argv[1])
at = {}
for seed in (0, 1, 2):
    rows = [json.loads(l) for l in open(runs / f"gpt2-baseline-s{seed}" / "log.jsonl")]
    evals = {r["batch"]: r["eval/loss"] for r in rows if "eval/loss" in r}
    batch = max(b for b in evals if b <= 525)
    at[seed] = (batch, round(evals[batch], 4), round(evals[max(evals)], 4))
print(at)
worst = max(v[1] for v in at.values())
print("target", math.ceil(worst / 0.05 - 1e-9) * 0.05)
