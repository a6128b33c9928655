"""Rewrite what is generated from the cards, the presets and the committed benchmark results.

- README.md: the headline, the benchmark results (bench/results/summary.json), the held-out sets and the seed's
  rehearsals (the study folders in HELDOUT_SETS and REHEARSALS), speedkit in other trainers (HOSTS) and the
  searches' picks on fresh seeds (the fresh_seeds*.json of the searches in SEARCHES).
- docs/guide.md: the methods table (from the cards) and the recipes table (from the presets).
- bench/results/INDEX.md: the studies, from their folders.
- speedkit/tasks/presets/reached.json: what each preset reached (summary.json and bench/results/fresh_seeds.json).

Every figure the README shows comes from here: prose around the tables states no measured number.

    python scripts/update_readme.py [README.md]       # `make readme` (which also redraws the figure)
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from speedkit.core.time import scaled_duration
from speedkit.experiments.report import preset_reached
from speedkit.experiments.compare import at_or_beyond, final_quality, machine_text, stricter
from speedkit.methods import methods_table
from speedkit.tasks.build import FOLDER_PRESETS, folder_task_presets
from speedkit.tasks.recipes import PRESETS
from speedkit.tasks.task import BUILT_IN_TASKS, get_recipe

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SUMMARY, FRESH_SEEDS = RESULTS / "summary.json", RESULTS / "fresh_seeds.json"
GUIDE = ROOT / "docs" / "guide.md"
INDEX = RESULTS / "INDEX.md"

# The held-out sets, by the folder task they were run as (scripts/build_heldout_sets.py builds them).
# Data no preset was tuned on: (summary file, its task key) -> the set as the README names it, and its builder.
HELDOUT_SETS = {
    ("2026-12-05-heldout-one-machine/glyphs/summary.json", "image-folder"):
        ("glyphs: 62 letters and digits, unseen typefaces", "scripts/build_heldout_sets.py"),
    ("2026-12-05-heldout-one-machine/perldoc/summary.json", "text-folder"):
        ("perldoc: Perl's documentation", "scripts/build_heldout_sets.py"),
    ("2026-12-05-heldout-one-machine/photo-crops/summary.json", "image-folder"):
        ("photo-crops: 56 photographs, crops of unseen regions, streamed from shards", "scripts/build_photo_crops.py"),
}
# Measured again against the strongest baseline tuned first (`speedkit bench --sweep --find-budgets`): study folder
# -> (the task or set as the table names it, its task key, the recipe measured against the tuned baseline).
TUNED_TASKS = {"2026-12-06-fashion-mnist-tuned-baseline": ("fashion-mnist", "vision", "hot")}
TUNED_HELDOUT = {"2026-12-05-baseline-plan-glyphs": ("glyphs", "image-folder", "hot"),
                 "2026-12-06-tuned-baselines-heldout/perldoc": ("perldoc", "text-folder", "hot"),
                 "2026-12-06-tuned-baselines-heldout/photo-crops": ("photo-crops", "image-folder", "hot")}
# The seed's workloads rehearsed on CPU (issue 43; bench/README.md says how each was sized and measured):
# (summary file, its task key) -> the data as the README names it.
REHEARSALS = {
    ("2026-12-05-imagenet-published-sizes/photo-crops/summary.json", "imagenet"):
        "photo-crops: 56 photographs, crops of unseen regions",
    ("2026-12-05-imagenet-published-sizes/objects/summary.json", "imagenet"):
        "objects: 9 kinds of photographed things, unseen ones",
    ("2026-12-05-imagenet-published-sizes/clipart/summary.json", "imagenet"):
        "clipart: 10 kinds of drawn things, unseen designs",
    ("2026-12-04-gpt2-rehearsal-debdocs/hot240/summary.json", "gpt2"):
        "debdocs: Debian's documentation, a BPE of 4,096 trained on it",
}
REHEARSED_AS = {"imagenet": "`imagenet` (`cpu`: ResNet-18; `mild` at 64 px, `plain-bf16` at 80)",
                "gpt2": "`gpt2` (`cpu`: gpt-nano, 256 tokens)"}
# speedkit inside other trainers (bench/hosts/): file -> (host, what the two arms are).
HOSTS = {
    "2026-12-01-hosts/hosts_hf_language.json": ("Hugging Face `SpeedkitTrainer`",
                               "GPT-2 at gpt-nano's sizes on pydocs; `transformers.Trainer` with AdamW against "
                               "`hot`'s methods and budget"),
    "2026-12-01-hosts/hosts_lightning_fashion_mnist.json": ("Lightning `SpeedkitCallback`",
                                           "Fashion-MNIST as Lightning's docs write it, against `hot`'s methods, "
                                           "budget and alternating flips"),
}
# `speedkit tune`'s picks run again on seeds the search never saw (scripts/fresh_seeds.py): each search's folder
# (its report) and the fresh-seed files, under bench/results. Per seed, a pick is compared with the fastest of
# `against` on that seed.
FRESH = "2026-12-05-searches-fresh-seeds-again"
SEARCHES = [
    {"data": "fashion-mnist", "folder": "2026-11-30-recipe-searches/fashion-mnist-two-baselines",
     "files": [f"{FRESH}/fashion-mnist/fresh_seeds.json"],
     "against": {"plain-bf16": "`plain-bf16`"},
     "arms": {"tune pick": "the search's pick", "hot, timed finely": "`hot`, evaluated as often"}},
    # against a baseline tuned in rate and budget: the earlier glyphs searches' baselines kept their budgets
    {"data": "glyphs", "folder": "2026-12-06-glyphs-baseline-walked",
     "files": ["2026-12-06-glyphs-baseline-walked/fresh_seeds.json"],
     "against": {"plain-bf16": "`plain-bf16`",
                 "baseline, plan walked to 4ep": "`plain-bf16` with its rate and budget tuned"},
     "arms": {"tune pick": "the search's pick"}},
    {"data": "perldoc", "folder": "2026-11-30-recipe-searches/heldout-perldoc-plain-bf16",
     "files": [f"{FRESH}/perldoc/fresh_seeds.json"],
     "against": {"plain-bf16": "`plain-bf16`"},
     "arms": {"tune pick": "the search's pick", "hot": "`hot`, rebuilt"}},
]


def _ratio_cell(ratios: list[float]) -> str:
    if not ratios:
        return "not reached"
    text = f"{statistics.median(ratios):.2f}x"
    return text + (f" ({min(ratios):.2f}–{max(ratios):.2f}x)" if len(ratios) > 1 else "")


def _target_text(metric: str, value: float) -> str:
    if metric.endswith("accuracy"):
        return f"{value:.0%} accuracy"
    return f"evaluation loss {value:.2f}" if metric.endswith("loss") else f"{value:.2f} bits per byte"


# The built-in tasks as the headline names them.
TASK_WORDS = {"fashion-mnist": "Fashion-MNIST", "pydocs": "A byte-level GPT on the Python docs"}


def _level_text(metric: str, value: float) -> str:
    """A final-quality level in words, precise enough to tell it from a rounder target."""
    if metric.endswith("accuracy"):
        return f"{value:.1%} accuracy"
    return f"evaluation loss {value:.3f}" if metric.endswith("loss") else f"{value:.3f} bits per byte"


def headline() -> str:
    """The README's first-screen figures: per task, the best recipe's speed-up at the strongest baseline's final
    quality (bench/README.md, "The target rule"); where the committed records hold it only at a lower target, that
    speed-up said as one, beside what is known at the final quality."""
    summary = json.loads(SUMMARY.read_text())
    lines, setups = [], set()
    for entry in summary.values():
        fq, strongest = entry["final_quality"], entry["strongest_baseline"]
        weakest = next(iter(entry["baselines"]))  # weakest first
        task, n = TASK_WORDS.get(entry["task"], entry["task"]), len(entry["seeds"])
        metric, target = entry["target"]["metric"], _target_text(entry["target"]["metric"], entry["target"]["value"])
        best = fq["best_recipe"]
        if best is not None and fq["is_target"]:
            line = f"- {task} to {target}, at or beyond `{strongest}`'s final quality: `{best}` is "
            if weakest != strongest:
                ratio = entry["recipes"][best]["speedup_median_vs"][weakest]
                reached = entry["baselines"][weakest]["reached"]
                short = f" (which reached it in {reached} of {n} seeds: the ratio is of those)" if reached < n else ""
                line += f"**{ratio:.1f}x** sooner than a hand-written `{weakest}`{short}, "
            lines.append(line + f"**{fq['speedup_median']:.1f}x** sooner than `{strongest}`, the strongest.")
        elif best is not None:
            lines.append(f"- {task} to `{strongest}`'s final quality, {_level_text(metric, fq['value'])}: `{best}` is "
                         f"**{fq['speedup_median']:.1f}x** sooner than `{strongest}`, the strongest.")
        else:
            lines.append(_lower_target_line(entry, task, target))
        setups.add(f"{_run_text(entry)}, median of {n} paired seeds")
    lines.append(f"- Measured on {'; '.join(sorted(setups))} ([Results](#results)).")
    return "\n".join(lines + [f"- {line} ([Results](#results))." for line in _measured_again_headline(summary)])


def _peak_text(machine: dict) -> str:
    """The measured matmul peak, to one figure: two CPUs of one name (an "AMD EPYC" with and without AVX-512) differ
    by several times in it, and it is what moves every time on a CPU."""
    peak = machine.get("matmul_peak_flops")
    return f" with a matmul peak of about {float(f'{peak:.1g}') / 1e9:g} GFLOP/s" if peak else ""


def _run_text(entry: dict) -> str:
    """Which run a figure comes from: the machine (with its matmul peak), threads, torch and date."""
    machine = entry["machine"]
    name = machine.get("gpu") or machine.get("cpu", "unknown CPU")
    return f"{name}{_peak_text(machine)}, " + machine_text(machine, entry["date"]).split(", ", 1)[1]


def _measured_again_headline(summary: dict) -> list[str]:
    """A preset of the headline measured again (MEASURED_AGAIN) is named beside it with its own run, so that the
    headline and the line under the results table read as two runs, not two values of one figure."""
    lines = []
    for key, entry, why, _ in _measured_again_entries():
        if key not in summary:
            continue
        task = TASK_WORDS.get(entry["task"], entry["task"])
        baseline, target = entry["strongest_baseline"], entry["target"]
        for name, r in entry["recipes"].items():
            ratios = [x for x in r["speedup_vs"][baseline] if x is not None]
            lines.append(f"{task}: `{name}` measured again {why}, on {_run_text(entry)}, "
                         f"{len(entry['seeds'])} seeds: {_ratio_cell(ratios)} sooner than `{baseline}` to "
                         f"{_target_text(target['metric'], target['value'])}; not comparable with the line "
                         f"above, which is the benchmark's own run on {_run_text(summary[key])}")
    return lines


def _measured_again_entries():
    """(task key, summary entry, why it was measured again, its file) for each committed file in MEASURED_AGAIN."""
    for file, why in MEASURED_AGAIN.items():
        path = RESULTS / file
        if path.exists():
            for key, entry in json.loads(path.read_text()).items():
                yield key, entry, why, path


def _lower_target_line(entry: dict, task: str, target: str) -> str:
    """A task without a speed-up at its baseline's final quality in the committed records: which recipe ended
    there on every seed (or none), and the speed-up at the benchmark's lower target, said as such."""
    fq, strongest, n = entry["final_quality"], entry["strongest_baseline"], len(entry["seeds"])
    level = _level_text(entry["target"]["metric"], fq["value"])
    best = entry["best_recipe"]
    ended = [name for name, r in entry["recipes"].items() if r["final_quality"]["reached"] == n]
    known = (f"`{'`, `'.join(ended)}` end at or beyond `{strongest}`'s final quality ({level}) on every seed, "
             f"the time to it not in the committed records" if ended and not fq["times_recorded"] else
             f"no recipe reaches `{strongest}`'s final quality ({level}) on every seed")
    if best is None:
        return f"- {task}: {known}."
    weakest = next(iter(entry["baselines"]))
    ratios = (f"**{entry['speedup_vs'][weakest]:.1f}x** sooner than a hand-written `{weakest}`, "
              if weakest != strongest else "") + f"**{entry['speedup_vs'][strongest]:.1f}x** sooner than `{strongest}`"
    return f"- {task}: {known}; to the lower target of {target}, `{best}` is {ratios}."


def recipes_table() -> str:
    rows = ["| task | recipe | model | budget | methods | what it is |", "|---|---|---|---|---|---|"]
    for task in BUILT_IN_TASKS.values():
        for name, r in task.recipes.items():
            methods = ", ".join(f"`{m}`" for m in r.methods) or "none"
            rows.append(f"| {task.name} | `{name}` | {r.model} | {r.duration}, batch {r.batch_size}, {r.precision} | "
                        f"{methods} | {r.summary} |")
    return "\n".join(rows)


QUALITY_RULE = ("A baseline's final quality is its median final value over its seeds less one seed's spread (the "
                "range of its finals, at least 0.5% of their median); a seed that ends short of it has not reached "
                "it, nor the target where that asks for more ([bench/README.md](bench/README.md#the-target-rule)).")


def _quality_cell(entry: dict, r: dict) -> str:
    """A recipe at its benchmark's final-quality level: its median paired speed-up over the strongest baseline
    (range), with the seeds that reached it where some did not; 'not reached' where none did; where the
    committed summary has no times to that level, how many seeds ended at or beyond it."""
    q, n = r["final_quality"], len(entry["seeds"])
    if q["reached"] == 0:
        return f"not reached (0/{n})"
    if not entry["final_quality"]["times_recorded"]:
        return f"ended there {q['reached']}/{n}, time not recorded"
    cell = _ratio_cell([x for x in q["speedup"] if x is not None])
    return cell + (f", reached {q['reached']}/{n}" if q["reached"] < n else "")


def _level_sentence(entry: dict) -> str:
    """Which level a summary's final-quality column is at, and whether it is its target."""
    fq = entry["final_quality"]
    level = _level_text(entry["target"]["metric"], fq["value"])
    if fq["is_target"]:
        return (f"{entry['task']}: the target, at or beyond `{fq['baseline']}`'s final quality "
                f"({_level_text(entry['target']['metric'], fq['level'])}).")
    recorded = "" if fq["times_recorded"] else " (times to it not in the committed records)"
    return f"{entry['task']}: `{fq['baseline']}`'s final quality, {level}, stricter than the target{recorded}."


def _paired_cell(recipe: dict, baseline: str) -> str:
    """The recipe's median paired speed-up over ``baseline`` as summary.json has it, with its range."""
    ratios = [x for x in recipe["speedup_vs"].get(baseline, []) if x is not None]
    median = recipe.get("speedup_median_vs", {}).get(baseline)
    if median is None or not ratios:
        return "not reached"
    return f"{median:.2f}x ({min(ratios):.2f}–{max(ratios):.2f})"


def bench_results() -> str:
    """Both built-in tasks in one table: each recipe's median time to the target and its paired speed-up over
    the task's weakest and strongest baseline (bench/results/summary.md has every baseline and leave-one-out)."""
    if not SUMMARY.exists():
        return "No benchmark results are committed yet: `speedkit bench --task fashion-mnist` writes them."
    summary = json.loads(SUMMARY.read_text())
    rows = ["| task, target | recipe | budget | reached | time to target (s) | vs weakest baseline "
            "| vs strongest baseline | final | at the strongest's final quality |", "|---" * 9 + "|"]
    setups, levels = [], []
    for key, entry in summary.items():
        weakest, strongest, n = next(iter(entry["baselines"])), entry["strongest_baseline"], len(entry["seeds"])
        task = f"{entry['task']}, {_target_text(entry['target']['metric'], entry['target']['value'])}"
        for name, r in [*entry["baselines"].items(), *entry["recipes"].items()]:
            shown = f"**{name}**" if name == entry["final_quality"]["best_recipe"] else name  # the headline's
            shown += " (weakest)" if name == weakest else " (strongest)" if name == strongest else ""
            cells = ["1.00x" if name == b else _paired_cell(r, b) for b in (weakest, strongest)]
            time = r.get("median_time_to_target_s")
            final = statistics.median(r["final_metric"])
            rows.append(f"| {task} | {shown} | {r['budget']} | {r['reached']}/{n} | "
                        f"{'not reached' if time is None else f'{time:.1f}'} | {' | '.join(cells)} | {final:.4f} | "
                        f"{_quality_cell(entry, r)} |")
            task = ""
        levels.append(_level_sentence(entry))
        setups.append((entry["task"], f"{_run_text(entry)}, profile `{entry['profile']}`, "
                                      f"{n} seeds"))
    if len({setup for _, setup in setups}) == 1:
        setups = [("Both tasks", setups[0][1])]
    return "\n".join(rows) + _measured_again() + (
        f"\n\n{' '.join(levels)} {QUALITY_RULE}"
        "\n\nMedians over seeds; speed-ups are baseline time / recipe time, paired by seed (range in brackets). "
        "Training wall clock: a plain evaluation excluded, what evaluation-time methods add included. "
        + "; ".join(f"{task}: {setup}" for task, setup in setups) + ". Every baseline and the "
        "leave-one-out tables: [bench/results/summary.md](bench/results/summary.md).") + (
        "\n" + tuned_baseline_results(TUNED_TASKS, "task") if TUNED_TASKS else "")


# Presets measured again after a fix that changed them, beside the baseline they are compared with:
# summary file -> what changed. The table above keeps the full benchmark; these say whether a fix moved it.
# Empty while every preset's row in the table is from the current code (pydocs measured again in full, 2026-12-05).
MEASURED_AGAIN: dict[str, str] = {}


def _measured_again() -> str:
    """A sentence per preset measured again: its paired speed-up, and the machine's matmul peak beside the
    table's, since a CPU without fast bf16 (``precision: auto`` trains fp32 there) moves every figure."""
    table = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    lines = []
    for key, entry, why, path in _measured_again_entries():
        baseline, n = entry["strongest_baseline"], len(entry["seeds"])
        runs = f"{_run_text(entry)}" + (f"; the table's rows, which predate it: {_run_text(table[key])}"
                                         if key in table else "")
        for name, r in entry["recipes"].items():
            ratios = [x for x in r["speedup_vs"][baseline] if x is not None]
            seeds = ", ".join(str(s) for s in entry["seeds"])
            fq = entry["final_quality"]
            level = _level_text(entry["target"]["metric"], fq["value"])
            at = ("" if fq["is_target"] else f" at `{baseline}`'s final quality ({level}), "
                  f"{_quality_cell(entry, r)}; at the lower target "
                  f"{_target_text(entry['target']['metric'], entry['target']['value'])},")
            lines.append(f"{entry['task']} `{name}` measured again {why}, beside `{baseline}` on seeds {seeds} "
                         f"({runs}):{at} {_ratio_cell(ratios)} "
                         f"sooner, reached {r['reached']}/{n}, median final "
                         f"{statistics.median(r['final_metric']):.4f} "
                         f"([{path.relative_to(ROOT)}]({path.relative_to(ROOT)})).")
    return "".join(f"\n\n{line}" for line in lines)


def heldout_results() -> str:
    """One row per held-out set: each rebuilt rung's paired speed-up over the set's strongest baseline."""
    rungs = ["mild", "medium", "hot"]
    rows = ["| data set | target | against | " + " | ".join(f"`{r}`" for r in rungs) + " |", "|---" * 6 + "|"]
    machines, sources, builders = set(), [], []
    for (file, key), (label, builder) in HELDOUT_SETS.items():
        path = RESULTS / file
        if not path.exists():
            continue
        entry = json.loads(path.read_text())[key]
        baseline, n = entry["strongest_baseline"], len(entry["seeds"])
        base = entry["baselines"][baseline]
        cells = [_quality_cell(entry, entry["recipes"][rung]) + _lower_target_cell(entry, entry["recipes"][rung])
                 for rung in rungs]
        reached = base["final_quality"]["reached"]
        against = f"`{baseline}`" + (f" (reached {reached}/{n})" if reached < n else "")
        target = _level_column(entry)
        rows.append(f"| {label} | {target} | {against} | " + " | ".join(cells) + " |")
        machines.add(f"{machine_text(entry['machine'], entry['date'])}, {n} seeds")
        link = f"[{path.relative_to(ROOT)}]({path.relative_to(ROOT)})"
        sources += [link] if link not in sources else []
        builders += [f"`{builder}`"] if f"`{builder}`" not in builders else []
    rows += ["", f"Median speed-up over the folder task's strongest baseline at its final quality (or at the target "
                 f"where that asks for more), paired by seed (range). {QUALITY_RULE} "
                 f"{'; '.join(sorted(machines))}. Sets built by {' and '.join(builders)}; "
                 f"from {' and '.join(sources)}."]
    return "\n".join(rows + [tuned_baseline_results(TUNED_HELDOUT, "set")])


def tuned_baseline_results(studies: dict, first_column: str) -> str:
    """``studies`` measured again against their strongest baseline tuned first: a table under the one above."""
    rows = []
    for study, (label, key, recipe) in studies.items():
        folder = RESULTS / study
        entry = json.loads((folder / "summary.json").read_text())[key]
        baseline = entry["strongest_baseline"]
        pick = json.loads((folder / f"{key}_sweeps.json").read_text())[baseline]["pick"]
        budget = json.loads((folder / f"{key}_budgets.json").read_text())[baseline]["budget"]
        tuned = entry["baselines"][baseline]
        shipped = (folder_task_presets(key).recipes[baseline] if key in FOLDER_PRESETS
                   else get_recipe(entry["task"], baseline))
        shipped_budget = scaled_duration(shipped.duration, entry["profile_spec"]["duration_scale"])
        rows.append(f"| {label} | {_level_column(entry)} | "
                    f"{_training_text(shipped.optimizer['lr'], shipped.schedule, shipped_budget)} | "
                    f"`{baseline}`: {_training_text(pick['lr'], pick['schedule'], budget)}, "
                    f"{statistics.median(t for t in tuned['final_quality']['time_s'] if t is not None):.1f} s | "
                    f"{_quality_cell(entry, entry['recipes'][recipe])} | "
                    f"{machine_text(entry['machine'], entry['date'])} | "
                    f"[{study}]({(RESULTS / Path(study).parts[0]).relative_to(ROOT)}/README.md) |")
    if not rows:
        return ""
    return "\n".join(["", "The table is against each baseline as it ships. Against the baseline tuned first (`speedkit "
                      "bench --sweep --find-budgets`: its learning rate and decay swept on one seed, then its shortest "
                      "budget that reaches the target on every seed, the plan `speedkit tune` tunes its baseline "
                      "with), `hot` is measured again, paired by seed, at the tuned baseline's final quality:", "",
                      f"| {first_column} | level | baseline as it ships | tuned baseline, median time | `hot` sooner | "
                      "machine | study |", "|---|---|---|---|---|---|---|", *rows])


def _training_text(lr: float, schedule, budget: str) -> str:
    """A baseline's rate, decay and budget as the tuned-baseline tables show them."""
    if isinstance(schedule, dict):
        warmup = schedule.get("warmup")
        schedule = f"{schedule.get('name')}, warmup {warmup}" if warmup else schedule.get("name")
    return f"lr {lr:g}, {schedule}, {budget}"


def _level_column(entry: dict) -> str:
    """The level a row's speed-ups are at: the target where it asks at least the strongest baseline's final
    quality, else that final quality with the (lower) target beside it."""
    fq, metric = entry["final_quality"], entry["target"]["metric"]
    target = _target_text(metric, entry["target"]["value"])
    if fq["is_target"]:
        return target
    return f"{_level_text(metric, fq['value'])}, `{fq['baseline']}`'s final quality (target {target})"


def _lower_target_cell(entry: dict, r: dict) -> str:
    """Beside a final-quality cell whose level is above the target: the speed-up at that lower target, said as one."""
    if entry["final_quality"]["is_target"]:
        return ""
    n = len(entry["seeds"])
    ratios = [x for x in r["speedup_vs"][entry["strongest_baseline"]] if x is not None]
    return f"; at the lower target: {_ratio_cell(ratios) if r['reached'] == n else '—'}, reached {r['reached']}/{n}"


def rehearsal_results() -> str:
    """One row per rehearsal of the seed's workloads: each speed-up preset's paired speed-up over the baseline at
    the baseline's final quality, and at the rule's target where that is lower."""
    rows = ["| task | data | level | against | preset | speed-up at the level | reached it | at the target | file |",
            "|---" * 9 + "|"]
    machines = set()
    for (file, key), label in REHEARSALS.items():
        path = RESULTS / file
        if not path.exists():
            continue
        entry = json.loads(path.read_text())[key]
        baseline, n = entry["strongest_baseline"], len(entry["seeds"])
        for name, r in entry["recipes"].items():
            ratios = [x for x in r["speedup_vs"][baseline] if x is not None]
            lower = f"{_ratio_cell(ratios) if r['reached'] == n else '—'} (lower target, reached {r['reached']}/{n})"
            at_target = "the level" if entry["final_quality"]["is_target"] else lower
            rows.append(f"| {REHEARSED_AS[key]} | {label} | {_level_column(entry)} | `{baseline}` | `{name}` | "
                        f"{_quality_cell(entry, r)} | {r['final_quality']['reached']}/{n} | {at_target} | "
                        f"[summary]({path.parent.relative_to(ROOT)}/summary.md) |")
        machines.add(f"{machine_text(entry['machine'], entry['date'])}, {n} seeds")
    return "\n".join(rows) + (f"\n\nMedian speed-up paired by seed (range), where every seed reached the level; the "
                              f"level is the baseline's final quality, or the target where that asks for more. "
                              f"{QUALITY_RULE} {'; '.join(sorted(machines))}.")


def _host_final_quality(data: dict, metric: str, target: float) -> str:
    """The hosts table's judgement at the baseline arm's final quality (``compare.final_quality``), from the
    finals the file keeps; said plainly where it keeps none."""
    key = "final_bpb" if metric.endswith("bpb") else "final_accuracy"
    runs = data["runs"]
    if not all(key in run for run in runs):
        return "not judged: the file keeps each run's best, not its final"
    quality = final_quality([run[key] for run in runs if run["arm"] == "baseline"], metric)
    arm = [run for run in runs if run["arm"] != "baseline"]
    ended = sum(at_or_beyond(run[key], quality["level"], metric) for run in arm)
    level = _level_text(metric, quality["level"])
    if stricter(metric, quality["level"], target) == target:
        return f"the target, at or beyond the baseline's ({level}); ended there {ended}/{len(arm)}"
    return f"the baseline's is {level}, above the target; ended there {ended}/{len(arm)}, time not recorded"


def hosts_results() -> str:
    rows = ["| host | what ran | target | seeds | speed-up | at the baseline's final quality | file |",
            "|---|---|---|---|---|---|---|"]
    setups = set()
    for name, (host, what) in HOSTS.items():
        data = json.loads((RESULTS / name).read_text())
        study = Path(name).parent.name  # dated: the file records no date or CPU, its study's README does
        setups.add(f"{data['device'].upper()}, {data['threads']} threads, torch {data['torch']}, {study[:10]} "
                   f"([its study](bench/results/{study}/README.md) names the machine)")
        metric, value = ("eval/bpb", data["target_bpb"]) if "target_bpb" in data else ("eval/accuracy", data["target"])
        target = _target_text(metric, value)
        seeds = len(data["ratios"])
        rows.append(f"| {host} | {what} | {target} | {seeds} | {_ratio_cell(data['ratios'])} | "
                    f"{_host_final_quality(data, metric, value)} | [{Path(name).name}](bench/results/{name}) |")
    return "\n".join(rows) + (f"\n\nMedian speed-up paired by seed (range); {'; '.join(sorted(setups))}. "
                              "Each file holds its command.")


def search_results() -> str:
    """One row per search: each pick's median speed-up on fresh seeds, paired by seed with the faster of
    ``against`` on that seed."""
    rows = ["| data | against (per seed, the faster) | fresh seeds | speed-up on them | files |", "|---" * 5 + "|"]
    budgets, machines = set(), set()
    for search in SEARCHES:
        where = f"bench/results/{search['folder']}"
        files = [json.loads((RESULTS / f).read_text()) for f in search["files"]]
        seeds = [s for f in files for s in f["seeds"]]
        budgets.add(json.loads((ROOT / where / "summary.json").read_text())["budget_s"])
        machines.update(f["machine"] for f in files)  # with the date: these are runs of their own
        links = ", ".join(f"[{Path(f).stem.replace('_', ' ')}]({path})" for f, path in
                          [("report.md", f"{where}/report.md"),
                           *((f, f"bench/results/{f}") for f in search["files"])])
        cells = []
        for arm, label in search["arms"].items():
            ratios = []
            for seed in seeds:
                base = [seed[b]["time_to_target_s"] for b in search["against"] if seed[b]["time_to_target_s"]]
                if base and seed[arm]["time_to_target_s"]:
                    ratios.append(min(base) / seed[arm]["time_to_target_s"])
            cells.append(f"{label}: {_ratio_cell(ratios)}")
        numbers = [s["seed"] for s in seeds]
        rows.append(f"| {search['data']} | {' or '.join(search['against'].values())} | "
                    f"{min(numbers)}-{max(numbers)} | {'; '.join(cells)} | {links} |")
    minutes = " or ".join(f"{b / 60:g}" for b in sorted(budgets))
    return "\n".join(rows) + (f"\n\n`speedkit tune` (`[tune]`) searched {minutes} minutes for the fastest recipe; "
                              "each pick then ran with `speedkit train` as shipped, on seeds the search never saw, "
                              "every run stopped at the target, so no run shows a final quality beyond it. "
                              f"Median speed-up paired by seed (range). {'; '.join(sorted(machines))}: runs of "
                              "their own, on other seeds than the results table's.")


def reached_json() -> str:
    """presets/reached.json as it should be: what each preset reached in the committed benchmark."""
    figures = preset_reached(json.loads(SUMMARY.read_text()), json.loads(FRESH_SEEDS.read_text()))
    return json.dumps(figures, indent=1) + "\n"


# bench/results/INDEX.md: one row per study folder (DATE-NAME/, its README.md's title and its files; the searches
# and the GPU checks are studies too), and these files, which are no one study: what speedkit and the README read.
# Anything else at the top of bench/results stops `make readme`.
STANDING = {
    "summary.json": "the headline benchmark, merged across tasks (`speedkit bench` writes it): the README's headline, "
                    "results table and figure, and the presets' `reached.json`",
    "summary.md": "the same as tables, with every baseline and the leave-one-out",
    "time_to_target.png": "the README's figure (`scripts/draw_results_figure.py`)",
    "fresh_seeds.json": "the headline's presets run again on fresh seeds (`scripts/fresh_seeds.py`), read into "
                        "`reached.json`",
}
NOT_RESULTS = ("INDEX.md", "plotly.min.js", "__pycache__")  # the index itself, and what a report leaves untracked
STUDY = re.compile(r"\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9.-]*")


def _listed(folder: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
                   if p.name not in NOT_RESULTS and p.suffix != ".html" and p.name != "README.md")
    return ", ".join(f"`{name}`" for name in names)


def _title(readme: Path) -> str:
    first = readme.read_text().split("\n", 1)[0] if readme.exists() else ""
    if not first.startswith("# "):
        raise SystemExit(f"{readme.relative_to(readme.parents[2])} must start with the study's title (\"# ...\"): "
                         "a study folder holds the paragraph that explains it (bench/README.md, \"Adding a study\")")
    return first[2:].strip()


def results_index(results: Path = RESULTS) -> str:
    """bench/results/INDEX.md as it should be, generated from the folders under ``results``."""
    studies, others = [], []
    for entry in sorted(results.iterdir()):
        name = entry.name
        if name in NOT_RESULTS or entry.suffix == ".html":
            continue
        if entry.is_dir() and STUDY.fullmatch(name):
            studies.append(f"| {name[:10]} | [{_title(entry / 'README.md')}]({name}/README.md) | {_listed(entry)} |")
        elif name in STANDING:
            others.append(f"| [{name}]({name}) | {STANDING[name]} |")
        else:
            raise SystemExit(f"bench/results/{name} is not a study: move it into a dated study folder "
                             f"(bench/results/YYYY-MM-DD-NAME/, with a README.md) or name it in STANDING of "
                             f"scripts/update_readme.py")
    return "\n".join([
        "# The measurements, study by study",
        "",
        "Generated by `make readme` (`scripts/update_readme.py`) from the folders here; do not edit it by hand.",
        "Each study folder holds its command, its result files, any script written for it, and a README.md with the",
        "paragraph that explains it. How to measure, and how to add a study: [bench/README.md](../README.md).",
        "",
        "| date | study | files |",
        "|---|---|---|",
        *reversed(studies),
        "",
        "## Not one study",
        "",
        "| file or folder | what it is |",
        "|---|---|",
        *others,
    ]) + "\n"


SECTIONS = {"headline": headline, "bench-results": bench_results, "heldout-results": heldout_results,
            "rehearsal-results": rehearsal_results, "hosts-results": hosts_results, "search-results": search_results}
GUIDE_SECTIONS = {"methods-table": methods_table, "recipes-table": recipes_table}


def render(text: str, sections: dict | None = None) -> str:
    """``text`` with each generated section (README's by default) rewritten."""
    for name, make in (SECTIONS if sections is None else sections).items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise SystemExit(f"no {start} ... {end} section to rewrite")
        text = pattern.sub(lambda _: f"{start}\n{make()}\n{end}", text)
    return text


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    (PRESETS / "reached.json").write_text(reached_json())  # first: the recipes table reads the presets
    path.write_text(render(path.read_text()))
    GUIDE.write_text(render(GUIDE.read_text(), GUIDE_SECTIONS))
    INDEX.write_text(results_index())
    print(f"updated {path}, {GUIDE.relative_to(ROOT)}, {INDEX.relative_to(ROOT)} and {PRESETS / 'reached.json'}")
