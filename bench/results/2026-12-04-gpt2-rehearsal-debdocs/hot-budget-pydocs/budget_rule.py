"""Choosing the gpt2 rehearsal's `hot` budget on other data than it is measured on (pydocs BPE, not debdocs).
The rule was written before the runs ended. The target: the lang-rehearsal rule (the worst of the three baseline
seeds' evaluation loss at 3/4 of its 700 batches, rounded up to 0.05), from the baseline's runs only. The budget:
the smallest one tried at which every seed ends at least 0.05 nats below that target (about the spread of `hot`'s
finals over seeds on debdocs), so that it holds on data it was not chosen on.

    python budget_rule.py    # reads eval_curves.json beside it: each run's evaluation loss against batches
"""
import json, math, pathlib

runs = json.loads((pathlib.Path(__file__).parent / "eval_curves.json").read_text())["runs"]
curves = {name: dict(map(tuple, points)) for name, points in runs.items()}

at = {s: curves[f"gpt2-baseline-s{s}"][max(b for b in curves[f"gpt2-baseline-s{s}"] if b <= 525)] for s in (0, 1, 2)}
target = math.ceil(max(at.values()) / 0.05 - 1e-9) * 0.05
print("baseline at batch 525:", at, "final:", {s: curves[f"gpt2-baseline-s{s}"][700] for s in at})
print(f"target {target:.2f}")
finals = {}
for name, curve in curves.items():
    if "hot" not in name:
        continue
    budget = 160 if name.startswith("gpt2-hot") else int(name.split("-")[1][:-2])  # the bench's hot: the scaled 160
    if max(curve) == budget:  # finished: evaluated at its last batch
        finals.setdefault(budget, {})[int(name.rsplit("-s", 1)[1])] = curve[budget]
for budget in sorted(finals):
    print(budget, "batches:", finals[budget])
held = [b for b in sorted(finals) if len(finals[b]) == 3 and max(finals[b].values()) <= target - 0.05]
print("chosen:", held[0] if held else None)
