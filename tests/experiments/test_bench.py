"""The time-to-accuracy benchmark harness at a tiny scale: schema, pairing by seed, evaluation kept out
of the clock, merging tasks into one summary, and the ``speedkit bench`` command. No test asserts a speed."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest
from helpers import needs_fmnist, needs_python_docs, toy_loaders, toy_model

from speedkit.cli.main import main
from speedkit.core import Callback, Time
from speedkit.experiments.baseline_plan import EDGE_STEPS, Outcome, start_steps
from speedkit.experiments.bench import (BenchProfile, get_profile, merge_summary, pick_best, profile_steps,
                                        run_benchmark, summarize, summary_markdown)
from speedkit.experiments.bench.profiles import default_profiles
from speedkit.experiments.compare import late_gain
from speedkit.record.runs import RunRecord
from speedkit.tasks import TASKS, RunRequest, get_recipe
from speedkit.train.trainer import Trainer

TINY_VISION = dict(device="cpu", data_fraction=0.02, eval_fraction=0.05, eval_interval="3ba", duration="6ba",
                   target=0.15)


def tiny_profile(task: str, recipes: tuple[str, ...], batch_size: int) -> BenchProfile:
    """The task's CPU profile with small batches: a profile is data, so a test can shrink it."""
    return dataclasses.replace(get_profile(task, "cpu"), recipe_changes={r: {"batch_size": batch_size}
                                                                          for r in recipes})
RECIPE_KEYS = {"runs", "methods", "time_to_target_s", "final_metric", "train_s", "eval_s", "setup_s", "compile_s",
               "flops_fraction_of_peak", "time_to", "median_time_to_target_s", "reached", "speedup", "speedup_median",
               "speedup_vs", "speedup_median_vs"}
TASK_ENTRY_KEYS = {"task", "profile", "target", "seeds", "baseline", "baselines", "strongest_baseline", "recipes",
                   "best_recipe", "speedup_median", "speedup_vs", "speedup_median_at", "flops_fraction_of_peak",
                   "leave_one_out", "machine", "date"}


def fake_record(recipe: str, seed: int, evals: list[tuple[float, float]], target: float = 0.9,
                metric: str = "eval/accuracy") -> RunRecord:
    """A finished run whose evaluations were (training seconds, metric value)."""
    record = RunRecord(name=f"fake-{recipe}-s{seed}", config={"recipe": recipe, "seed": seed},
                       target={"metric": metric, "value": target}, status="completed")
    for batch, (wall_s, value) in enumerate(evals, start=1):
        record.add_eval({"batch": batch, "wall_s": wall_s}, {metric: value})
    record.final_metrics = {metric: evals[-1][1]}
    record.timings = {"train_s": evals[-1][0], "eval_s": 1.0}
    return record


def check_entry_schema(entry: dict, n_seeds: int) -> None:
    assert TASK_ENTRY_KEYS <= set(entry)
    assert set(entry["target"]) == {"metric", "value"}
    assert {"cpu", "torch_threads", "torch"} <= set(entry["machine"])
    for recipe in [*entry["baselines"].values(), *entry["recipes"].values()]:
        assert RECIPE_KEYS <= set(recipe)
        for key in ("time_to_target_s", "final_metric", "train_s", "eval_s", "speedup"):
            assert len(recipe[key]) == n_seeds, key


# -- profiles ----------------------------------------------------------------------------------
def test_profiles_are_data_and_bad_names_get_clear_errors():
    gpu = get_profile("vision", "gpu")
    assert gpu.recipe("baseline") == get_profile("vision", "cpu").recipe("baseline")  # the hand-written one
    assert gpu.recipe("mild").batch_size == 512 and gpu.recipe("mild").precision == "bf16"
    assert "torch_compile" in gpu.recipe("mild").methods and "label_smoothing" in gpu.recipe("mild").methods
    # every run compiles, the baselines a GPU engineer writes too, so that the compiler is not counted as a speed-up;
    # only the tutorial's per-image loop runs as written
    language = get_profile("language", "gpu")
    user_task = default_profiles("pydocs")  # the profiles a task of a user's gets
    for profile in (gpu, language, user_task["gpu"]):
        compiled = {name for name in profile.recipes if "torch_compile" in profile.recipe(name).methods}
        assert set(profile.recipes) - compiled == ({"baseline"} if profile is gpu else set()), profile.task
    assert "torch_compile" not in user_task["cpu"].recipe("hot").methods
    assert {language.recipe(name).precision for name in language.recipes} == {"bf16"}  # as nanoGPT's script
    assert get_profile("language", "cpu").recipe("tuned").precision == "fp32"  # on a CPU bf16 may be emulated
    # the language target holds on the evaluation share it was measured on, on either device
    assert (language.run.eval_fraction, language.target_value) == (get_profile("language", "cpu").run.eval_fraction,
                                                                   get_profile("language", "cpu").target_value)
    assert get_profile("language").targets == (3.3, 3.5) and get_profile("vision").targets == (0.90, 0.92, 0.93)
    with pytest.raises(ValueError, match="known: .*language.*vision"):
        get_profile("speech")
    with pytest.raises(ValueError, match="known: \\['cpu', 'gpu'\\]"):
        get_profile("vision", "tpu")
    # baselines are timed at a fine cadence (free for them); speed-up recipes keep their own, as they ship
    cpu = get_profile("vision", "cpu")
    assert cpu.recipe("plain-bf16").eval_interval == "0.25ep" and cpu.recipe("hot").eval_interval == "0.5ep"
    with pytest.raises(ValueError, match="unknown recipes \\['spicy'\\].*known"):
        BenchProfile(name="x", run=RunRequest(task="fashion-mnist"), recipes=("baseline", "spicy"))
    with pytest.raises(ValueError, match="unknown recipes \\['tutorial'\\].*known"):
        BenchProfile(name="x", run=RunRequest(task="fashion-mnist"), compiled=True, eager=("tutorial",))


def test_a_profile_describes_its_runs_as_one_run_request_and_owns_none_of_its_fields():
    from speedkit.experiments.bench import harness

    assert not {f.name for f in dataclasses.fields(BenchProfile)} & {f.name for f in dataclasses.fields(RunRequest)}
    profile = get_profile("language", "cpu").replace(device="cuda", data_fraction=0.5, seeds=2, duration="100ba")
    assert (profile.run.device, profile.run.data_fraction, profile.seeds) == ("cuda", 0.5, 2)
    assert profile.run.eval_interval == "25ba" and profile.run.target == 3.30  # the profile's own, kept
    request = harness.run_request(profile, harness.scheduled_recipe(profile, "tuned"), 1, "run", "runs", {})
    # the run's budget and cadence live in its recipe, so a budget search's recipe is not overridden again
    assert (request.device, request.seed, request.target, request.duration) == ("cuda", 1, 3.30, None)
    assert (request.recipe.duration, request.recipe.eval_interval) == ("100ba", "25ba")
    # what each run sets itself is refused in the profile's run, naming what means it, not silently overwritten
    for field, value, fix in (("recipe", "hot", "recipes="), ("seed", 5, "seeds="), ("run_dir", "mine", "--run-dir"),
                              ("methods", ["ema"], "speedup_changes="), ("stop_at_target", True, "whole budget")):
        with pytest.raises(TypeError, match=rf"run\.{field} is set by each run of the benchmark.*{fix}"):
            BenchProfile(name="x", run=RunRequest(task="fashion-mnist", **{field: value}))
        with pytest.raises(TypeError, match=rf"run\.{field} is set by each run"):  # and when replaced into it
            get_profile("vision").replace(**{field: value})
    with pytest.raises(TypeError, match=r"Trainer options \['save_checkpoints'\] are set by each run"):
        BenchProfile(name="x", run=RunRequest.build("fashion-mnist", save_checkpoints=True))


def test_a_scaled_budget_keeps_a_rungs_evaluations_and_its_step_floor():
    """Halving the budgets with the rungs' cadences kept left each rung three evaluations to reach its target at."""
    from speedkit.experiments.bench import harness

    profile = get_profile("vision", "cpu").replace(duration_scale=0.5)
    hot, baseline = (profile.recipe(n) for n in ("hot", "baseline"))
    scaled_hot, scaled_baseline = (harness.scheduled_recipe(profile, n) for n in ("hot", "baseline"))
    evaluations = [Time.from_input(r.duration).value / Time.from_input(r.eval_interval).value for r in (hot, scaled_hot)]
    assert scaled_hot.duration != hot.duration and evaluations[0] == pytest.approx(evaluations[1])
    assert scaled_baseline.eval_interval == baseline.eval_interval  # a baseline's timing cadence is not clocked
    # a rebuilt rung is planned on the data as `speedkit train --recipe hot` plans it, unless one budget is given
    assert harness.run_request(profile, scaled_hot, 0, "run", "runs", {}).step_floor
    assert not harness.run_request(profile.replace(duration="9ba"), scaled_hot, 0, "run", "runs", {}).step_floor


def test_a_bench_profile_scales_a_budget_as_the_search_does():
    """One scaling rule for bench and tune: a fraction of an epoch to three digits (not a float's rounding
    error such as 0.30000000000000004ep), and never below one whole batch (not a budget of 0 batches)."""
    from speedkit.experiments.bench import harness
    from speedkit.core.time import scaled_duration

    vision = get_profile("vision", "cpu").replace(recipes=("baseline", "medium"), duration_scale=0.1)
    assert vision.recipe("medium").duration == "3ep"
    assert harness.scheduled_recipe(vision, "medium").duration == scaled_duration("3ep", 0.1) == "0.3ep"
    language = get_profile("language", "cpu").replace(recipes=("baseline", "hot"), duration_scale=0.001)
    assert language.recipe("hot").duration == "250ba"
    assert harness.scheduled_recipe(language, "hot").duration == scaled_duration("250ba", 0.001) == "1ba"


# -- pairing and medians, from records made by hand ---------------------------------------------
def hand_made_vision_records() -> list[RunRecord]:
    baseline = [fake_record("baseline", 0, [(5, 0.8), (10, 0.91)]), fake_record("baseline", 1, [(6, 0.8), (12, 0.9)]),
                fake_record("baseline", 2, [(8, 0.95)])]
    # out of seed order on purpose: pairing goes by seed, not by position
    hot = [fake_record("hot", 2, [(2, 0.93)]), fake_record("hot", 0, [(5, 0.9)]),
           fake_record("hot", 1, [(3, 0.7), (6, 0.85)])]  # seed 1 never reaches 0.9
    mild = [fake_record("mild", s, [(t, 0.9)]) for s, t in ((0, 8), (1, 9), (2, 7))]
    return baseline + hot + mild


def test_speedups_are_paired_by_seed_and_a_missed_target_drops_its_pair():
    profile = BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", device="cpu", target=0.9),
                           report_targets=(0.8,))
    entry = summarize(hand_made_vision_records(), profile)
    check_entry_schema(entry, 3)
    hot = entry["recipes"]["hot"]
    assert entry["seeds"] == [0, 1, 2]
    assert hot["time_to_target_s"] == [5, None, 2]
    assert hot["speedup"] == [2.0, None, 4.0]  # 10/5, no pair, 8/2
    assert hot["speedup_median"] == 3.0 and hot["reached"] == 2
    assert hot["median_time_to_target_s"] == 3.5
    assert entry["baseline"]["time_to"]["0.8"] == [5, 6, 8]
    assert hot["final_metric"] == [0.9, 0.85, 0.93]
    # hot would be fastest (median 5 s with the missed seed counted as never, mild's is 8 s), but the best
    # recipe must reach the target in every seed and end at or above it: mild does, hot does not
    assert entry["best_recipe"] == "mild" and entry["speedup_median"] == pytest.approx(1.25)  # 10/8, 12/9, 8/7
    assert entry["speedup_median_at"]["0.8"] == pytest.approx(6 / 9)  # mild first shows 0.8 at 8, 9 and 7 s


def test_best_recipe_ranks_a_never_reached_seed_as_slowest():
    recipes = {"lucky": {"time_to_target_s": [1.0, None, None], "final_metric": [0.9, 0.5, 0.5]},
               "steady": {"time_to_target_s": [4.0, 5.0, 6.0], "final_metric": [0.9, 0.9, 0.9]}}
    assert pick_best(recipes, "eval/accuracy") == "steady"
    nowhere = {"a": {"time_to_target_s": [None], "final_metric": [3.1]},
               "b": {"time_to_target_s": [None], "final_metric": [2.9]}}
    assert pick_best(nowhere, "eval/bpb") == "b"  # lower bits per byte is better


def test_bench_and_tune_judge_the_strongest_baseline_by_one_tie_rule():
    """Equal median times (a missed seed counting as infinitely slow): more seeds reached wins, then the better
    final metric. The old rules split here: the benchmark went straight to the final metric, the search took
    more seeds but then the first given; now both judge through speedkit.experiments.summary.judge."""
    from speedkit.experiments.compare import fastest
    from speedkit.experiments.summary import judge

    more_seeds = {"baseline": ([10.0, 10.0, None], [0.95] * 3), "plain": ([10.0, 10.0, 10.0], [0.93] * 3)}
    better_final = {"baseline": ([10.0, 12.0], [0.92] * 2), "plain": ([12.0, 10.0], [0.94] * 2)}
    profile = BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", device="cpu", target=0.9),
                           recipes=("baseline", "plain"))
    for runs in (more_seeds, better_final):
        assert fastest(runs, "eval/accuracy") == "plain"
        entries = {name: {"time_to_target_s": times, "final_metric": finals} for name, (times, finals) in runs.items()}
        seeds = list(range(len(runs["plain"][0])))  # what the confirmation measures against:
        assert judge(entries, {}, seeds, "eval/accuracy", 0.9)["strongest_baseline"] == "plain"
        records = []
        for name, (times, finals) in runs.items():
            for seed, (t, final) in enumerate(zip(times, finals)):
                records.append(fake_record(name, seed, [(t, 0.9)] if t is not None else [(20.0, 0.5)]))
                records[-1].final_metrics = {"eval/accuracy": final}
        assert summarize(records, profile)["strongest_baseline"] == "plain"


def test_every_recipe_is_measured_against_every_baseline_and_the_headline_against_the_strongest():
    records = [fake_record("baseline", s, [(40, 0.93)]) for s in (0, 1)]
    records += [fake_record("plain", 0, [(20, 0.93)]), fake_record("plain", 1, [(30, 0.91)])]  # never reaches in seed 1
    records += [fake_record("plain-bf16", s, [(t, 0.92)]) for s, t in ((0, 12), (1, 16))]
    records += [fake_record("mild", s, [(t, 0.925)]) for s, t in ((0, 4), (1, 8))]
    for record in records:
        budget = {"baseline": "10ep", "plain": "8ep", "plain-bf16": "7ep", "mild": "3ep"}[record.config["recipe"]]
        record.config.update(task="fashion-mnist", recipe_spec={"duration": budget})
        record.target["value"] = 0.92
    entry = summarize(records, BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", device="cpu",
                                                                       target=0.92)))
    check_entry_schema(entry, 2)
    assert set(entry["baselines"]) == {"baseline", "plain", "plain-bf16"}
    assert entry["strongest_baseline"] == "plain-bf16"  # plain is faster in seed 0 but never got there in seed 1
    assert entry["baseline"] is entry["baselines"]["baseline"]  # the old field keeps the tutorial baseline
    mild = entry["recipes"]["mild"]
    assert mild["speedup_vs"] == {"baseline": [10.0, 5.0], "plain": [5.0, None], "plain-bf16": [3.0, 2.0]}
    assert mild["speedup"] == [3.0, 2.0] and entry["speedup_median"] == 2.5
    assert entry["speedup_vs"] == {"baseline": 7.5, "plain": 5.0, "plain-bf16": 2.5}
    assert entry["baselines"]["plain-bf16"]["budget"] == "7ep" and mild["budget"] == "3ep"
    markdown = summary_markdown({"vision": entry})
    assert "| speed-up vs baseline | speed-up vs plain | speed-up vs plain-bf16 |" in markdown
    assert "| plain-bf16 (strongest baseline) | 7ep | 2/2 |" in markdown and "2.50x faster" in markdown


def test_a_summary_says_which_runs_came_later_and_what_the_sweep_tried():
    records = [fake_record(name, s, [(t, 3.2)], target=3.3, metric="eval/bpb")
               for s in (0, 1) for name, t in (("baseline", 40), ("hot", 8))]
    records += [fake_record("tuned", s, [(20, 3.2)], target=3.3, metric="eval/bpb") for s in (0, 1)]
    for record in records:
        later = record.config["recipe"] == "tuned"
        record.config["bench"] = {"session": "20261130-140000" if later else "20261130-130000"}
    pick = {"lr": 4e-3, "schedule": {"name": "linear_to_zero"}}
    sweeps = {"tuned": {"pick": pick, "tried": [{"lr": 1e-3, "schedule": {"name": "cosine"}, "batches_to_target": 475},
                                                {**pick, "batches_to_target": 300}]}}
    profile = BenchProfile(name="cpu", run=RunRequest(task="pydocs", device="cpu", target=3.3))
    entry = summarize(records, profile, sweeps=sweeps)
    assert entry["sessions"] == {"20261130-130000": ["baseline", "hot"], "20261130-140000": ["tuned"]}
    assert entry["strongest_baseline"] == "tuned" and entry["speedup_median"] == 2.5
    markdown = summary_markdown({"language": entry})
    assert ("baseline, hot interleaved by seed (started 20261130-130000); then tuned (started 20261130-140000), "
            "paired by seed") in markdown
    assert "lr 0.001 cosine: 475; lr 0.004 linear_to_zero: 300 -> lr 0.004 linear_to_zero" in markdown
    one_sitting = summarize(records[:4], profile)
    assert "baselines and recipes interleaved by seed" in summary_markdown({"language": one_sitting})


def test_a_summary_needs_a_baseline_and_a_recipe_that_ends_below_its_target_is_not_best():
    with pytest.raises(ValueError, match="needs runs of a baseline \\(baseline, plain, plain-bf16\\)"):
        summarize([fake_record("mild", 0, [(4, 0.93)])],
                  BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist")))
    touched = [fake_record("baseline", 0, [(9, 0.93)], target=0.92),
               fake_record("mild", 0, [(3, 0.921), (4, 0.915)], target=0.92)]
    entry = summarize(touched, BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", target=0.92)))
    assert entry["recipes"]["mild"]["time_to_target_s"] == [3]  # it touched the target once ...
    assert entry["best_recipe"] is None and entry["speedup_median"] is None  # ... and ended below it
    assert "no speed-up recipe reached" in summary_markdown({"vision": entry})


def test_a_summary_says_how_much_each_baseline_still_gained_in_the_last_quarter_of_its_budget():
    rising = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]  # batches 1-8: 3/4 of the budget is batch 6, at 0.7
    records = [fake_record("plain-bf16", 0, [(10 * b, v) for b, v in enumerate(rising, 1)], target=0.6),
               fake_record("plain-bf16", 1, [(10 * b, v) for b, v in enumerate([*rising[:6], 0.7, 0.72], 1)],
                           target=0.6),
               *[fake_record("mild", s, [(5, 0.65), (8, 0.7)], target=0.6) for s in (0, 1)]]
    for record in records:
        record.config["task"] = "fashion-mnist"
    entry = summarize(records, BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", target=0.6)))
    assert entry["baselines"]["plain-bf16"]["late_gain"] == pytest.approx([0.2, 0.02])
    assert entry["recipes"]["mild"]["late_gain"] == pytest.approx([0.05, 0.05])  # batch 1 is at or before 3/4 of 2
    assert ("over the last quarter of their budgets (median, min–max over seeds): plain-bf16 +0.110 "
            "(0.020–0.200)") in summary_markdown({"vision": entry})

    loss = fake_record("baseline", 0, [(1, 4.0), (2, 3.5), (3, 3.4), (4, 3.1)], target=3.3, metric="eval/loss")
    assert late_gain(loss) == pytest.approx(0.3)  # a falling loss is a gain: 3.4 at batch 3 (3/4 of 4), then 3.1
    assert late_gain(fake_record("baseline", 0, [(1, 0.5)])) is None


# -- the baseline's final quality (issue 57) -----------------------------------------------------------------------
ISSUE_57 = BenchProfile(name="cpu", recipes=("plain-bf16", "mild", "medium"),
                        run=RunRequest(task="fashion-mnist", device="cpu", target=0.25))


def climbing_baseline_records() -> list[RunRecord]:
    """Issue 57's case: plain-bf16 still climbing when its budget ends (finals 0.370, 0.317, 0.343); mild meets the
    rule's lower target (0.25) sooner and plateaus at 0.269, below where the baseline ends; medium ends beyond the
    baseline's final quality on seeds 0 and 1, and on seed 2 passes it and falls back below by its end."""
    records = [fake_record("plain-bf16", seed, [(300, 0.25), (577, 0.26), (771, 0.29), (1000, final)], target=0.25)
               for seed, final in ((0, 0.37), (1, 0.317), (2, 0.343))]
    records += [fake_record("mild", seed, [(100, 0.25), (400, 0.269)], target=0.25) for seed in (0, 1, 2)]
    records += [fake_record("medium", 0, [(150, 0.25), (200, 0.3), (500, 0.33)], target=0.25),
                fake_record("medium", 1, [(150, 0.25), (250, 0.295), (500, 0.31)], target=0.25),
                fake_record("medium", 2, [(150, 0.25), (220, 0.3), (500, 0.28)], target=0.25)]
    return records


def load_update_readme():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "update_readme.py"
    spec = importlib.util.spec_from_file_location("update_readme_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recipe_sooner_to_the_lower_target_but_ending_below_the_baselines_final_is_shown_not_reaching_it(
        tmp_path, monkeypatch):
    from speedkit.experiments.bench import write_reports

    entry = summarize(climbing_baseline_records(), ISSUE_57)
    assert entry["best_recipe"] == "mild" and entry["speedup_median"] > 2  # the lower target alone would say this
    fq = entry["final_quality"]
    assert fq["value"] == pytest.approx(0.29) and not fq["is_target"] and fq["best_recipe"] is None
    summary, paths = write_reports(tmp_path, "vision", entry)
    on_disk = json.loads(paths["summary_json"].read_text())["vision"]
    mild = on_disk["recipes"]["mild"]["final_quality"]
    assert mild["reached"] == 0 and mild["time_s"] == [None] * 3 and mild["speedup_median"] is None
    assert on_disk["final_quality"]["best_recipe"] is None

    markdown = paths["summary_md"].read_text()
    row = "| mild | — | 3/3 | 100.0 (100.0–100.0) | 3.00x (3.00–3.00) | 0.2690 | 0/3 | not reached | not reached |"
    assert row in markdown
    lines = markdown.splitlines()
    headline = next(line for line in lines if line.startswith("vision: "))
    assert headline.startswith("vision: no speed-up recipe reached eval/accuracy 0.29 (plain-bf16's final quality")
    # the lower target's speed-up is there, said to be at a lower target, beside the final quality's, never alone
    assert all("lower target" in line and "final quality" in line for line in lines if "3.00x faster" in line)
    assert "mild reached plain-bf16's final quality on 0/3 seeds" in headline

    readme = load_update_readme()
    monkeypatch.setattr(readme, "SUMMARY", paths["summary_json"])
    monkeypatch.setattr(readme, "MEASURED_AGAIN", {})
    rows = readme.bench_results().splitlines()
    assert next(row for row in rows if "| mild |" in row).endswith("| 0.2690 | not reached (0/3) |")
    assert next(row for row in rows if "| medium |" in row).endswith("| 0.3100 | 3.47x (3.08–3.85x), reached 2/3 |")
    line = readme.headline().splitlines()[0]
    assert "no recipe reaches `plain-bf16`'s final quality (29.0% accuracy) on every seed" in line
    assert "to the lower target of 25% accuracy, `mild` is **3.0x** sooner" in line


def test_the_final_quality_is_the_baselines_median_final_less_one_seeds_spread_with_a_floor():
    from speedkit.experiments.compare import FINAL_QUALITY_FLOOR, at_or_beyond, final_quality

    spread = final_quality([0.37, 0.317, 0.343], "eval/accuracy")
    assert spread == pytest.approx({"median_final": 0.343, "tolerance": 0.053, "level": 0.29})
    agreeing = final_quality([0.92, 0.921, None], "eval/accuracy")  # a missing seed is left out
    assert agreeing["tolerance"] == pytest.approx(FINAL_QUALITY_FLOOR * 0.9205) == pytest.approx(0.0046025)
    assert final_quality([0.9], "eval/accuracy")["level"] == pytest.approx(0.9 * (1 - FINAL_QUALITY_FLOOR))
    loss = final_quality([3.2, 3.3, 3.25], "eval/bpb")  # lower is better: the tolerance is added
    assert loss["level"] == pytest.approx(3.35) and loss["tolerance"] == pytest.approx(0.1)
    assert final_quality([None, None], "eval/accuracy") is None
    for finals, metric in (([0.37, 0.317, 0.343], "eval/accuracy"), ([0.5, 0.9], "eval/accuracy"),
                           ([0.1, 0.9, 0.9], "eval/accuracy"), ([2.0, 2.5, 5.0], "eval/loss")):
        level = final_quality(finals, metric)["level"]  # every seed of the baseline ends at or beyond its own
        assert all(at_or_beyond(f, level, metric) for f in finals)


def test_seeds_that_reached_the_final_quality_are_counted_from_each_seeds_curve_and_end():
    from speedkit.experiments.summary import add_final_quality

    entry = summarize(climbing_baseline_records(), ISSUE_57)
    medium, baseline = entry["recipes"]["medium"]["final_quality"], entry["baselines"]["plain-bf16"]["final_quality"]
    assert baseline["reached"] == 3 and baseline["time_s"] == [771, 771, 771]
    # seed 2 passed 0.29 at 220 s and ended at 0.28: not reached
    assert medium["reached"] == 2 and medium["time_s"] == [200, 250, None]
    assert medium["speedup"] == pytest.approx([771 / 200, 771 / 250, None])
    assert medium["speedup_median"] == pytest.approx((771 / 200 + 771 / 250) / 2)
    # read back from summary.json alone, each run's curve gives the same answer as the records did
    again = json.loads(json.dumps(entry))
    for r in [*again["baselines"].values(), *again["recipes"].values()]:
        del r["final_quality"]
    assert add_final_quality(again)["recipes"] == entry["recipes"] and again["final_quality"] == entry["final_quality"]
    # a summary from before curves were kept: who ended there is known from the finals, the times are not
    for r in [*again["baselines"].values(), *again["recipes"].values()]:
        del r["final_quality"], r["curve"]
    old = add_final_quality(again)
    assert not old["final_quality"]["times_recorded"] and old["recipes"]["medium"]["final_quality"]["reached"] == 2
    assert old["recipes"]["medium"]["final_quality"]["time_s"] == [None] * 3


def test_where_the_target_asks_more_than_the_baselines_final_a_seed_ending_between_the_two_still_counts():
    records = [fake_record("plain-bf16", s, [(100, 0.92), (150, final)], target=0.92)
               for s, final in ((0, 0.9218), (1, 0.922), (2, 0.9216))]
    records += [fake_record("mild", 0, [(40, 0.921), (60, 0.919)], target=0.92),  # ends above 0.9172: counts
                fake_record("mild", 1, [(50, 0.925)], target=0.92),
                fake_record("mild", 2, [(45, 0.921), (60, 0.91)], target=0.92)]  # ends below it: does not
    entry = summarize(records, BenchProfile(name="cpu", recipes=("plain-bf16", "mild"),
                                            run=RunRequest(task="fashion-mnist", device="cpu", target=0.92)))
    fq = entry["final_quality"]
    assert fq["is_target"] and fq["value"] == 0.92 and fq["level"] == pytest.approx(0.9218 * 0.995)
    assert entry["recipes"]["mild"]["final_quality"]["time_s"] == [40, 50, None]


def test_a_bench_summary_records_the_data_folder_and_fraction_it_ran_on(tmp_path):
    from speedkit.experiments.bench import run_benchmark

    folder = tmp_path / "pictures"
    (folder / "cat").mkdir(parents=True)
    (folder / "cat" / "a.jpg").write_bytes(b"x" * 10)
    entry = summarize(climbing_baseline_records(), ISSUE_57, data=folder)
    assert entry["data"]["folder"]["path"] == str(folder.resolve()) and entry["data"]["folder"]["files"] == 1
    assert entry["profile_spec"]["run"]["data"] == str(folder)
    # --reuse: the runs' own fraction, written into summary.json and said in summary.md
    run_dir = tmp_path / "runs"
    for record in climbing_baseline_records():
        record.config.update(bench={"task": "vision", "profile": "cpu", "session": "s"}, data_fraction=0.2,
                             eval_fraction=0.5)
        record.save(run_dir / f"{record.name}.json")
    result = run_benchmark("fashion-mnist", "cpu", seeds=3, recipes="mild,medium", baselines="plain-bf16",
                           out_dir=tmp_path / "out", run_dir=run_dir, reuse=True, figures=False, log=lambda _: None)
    assert json.loads(result.paths["summary_json"].read_text())["vision"]["data"] == {
        "folder": None, "data_fraction": 0.2, "eval_fraction": 0.5}
    said = "Data: the task's own data, training on 0.2 of it, evaluating on 0.5."
    assert said in result.paths["summary_md"].read_text()


def test_vision_then_language_merge_into_one_summary(tmp_path):
    vision = summarize(hand_made_vision_records(),
                       BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", device="cpu", target=0.9)))
    language_records = [fake_record(recipe, 0, [(20, 2.5), (40, 1.9)] if recipe == "baseline" else [(10, 1.95)],
                                    target=2.0, metric="eval/bpb") for recipe in ("baseline", "hot")]
    language = summarize(language_records, BenchProfile(name="cpu", run=RunRequest(task="pydocs", device="cpu")))
    path = tmp_path / "summary.json"
    merge_summary(path, "vision", vision)
    merged = merge_summary(path, "language", language)
    on_disk = json.loads(path.read_text())
    assert set(on_disk) == set(merged) == {"vision", "language"}
    assert on_disk["language"]["recipes"]["hot"]["speedup"] == [4.0]
    assert on_disk["vision"]["best_recipe"] == "mild"
    table = summary_markdown(on_disk)
    assert "| **mild** | — | 3/3 | 8.0 (7.0–9.0) | 1.25x (1.14–1.33) | 0.9000 |" in table  # fake records: no budget
    # the language task's hot reaches the target sooner but ends short of the baseline's final quality: not bold
    assert "| hot | — | 1/1 | 10.0 | 4.00x | 1.9500 | 0/1 | not reached | not reached |" in table
    assert "vision: **mild** reaches eval/accuracy 0.9 1.25x faster" in table
    assert on_disk["vision"]["machine"]["cpu"] in table and "torch" in table
    assert "## vision" in table and "## language" in table
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        merge_summary(path, "vision", vision)


# -- the phase profile -------------------------------------------------------------------------
def test_profile_steps_splits_a_run_into_the_trainer_phases(tmp_path):
    train, test = toy_loaders()

    def factory(duration, callbacks):
        return Trainer(toy_model(), train, eval_dataloader=test, max_duration=duration, callbacks=callbacks,
                       eval_interval="3ba", run_dir=tmp_path, save_checkpoints=False)

    breakdown = profile_steps(factory, steps=5)
    assert breakdown["steps"] == 5
    phases = breakdown["phases"]
    assert set(phases) == {"data", "forward", "loss", "backward", "optimizer", "evaluation", "other"}
    assert all(phases[p]["s"] > 0 for p in ("data", "forward", "backward", "optimizer", "evaluation"))
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0, abs=1e-3)
    assert breakdown["top_operators"] and breakdown["under_torch_profiler"]


# -- the harness end to end, tiny ---------------------------------------------------------------
class SlowEvaluation(Callback):
    """Makes every evaluation take at least ``seconds`` longer, so leaking it into training time shows."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def eval_start(self, state, logger):
        time.sleep(self.seconds)


@needs_fmnist
def test_tiny_vision_benchmark(tmp_path):
    logged: list[str] = []
    started = time.perf_counter()
    result = run_benchmark("vision", tiny_profile("vision", ("baseline", "mild"), 32), seeds=2, recipes="mild",
                           baselines="baseline", out_dir=tmp_path / "out", run_dir=tmp_path / "runs", leave_one_out=True, profile_steps=4,
                           log=logged.append,
                           trainer_kwargs={"callbacks": [SlowEvaluation(0.1)], "log_interval": 2}, **TINY_VISION)
    elapsed = time.perf_counter() - started

    # interleaved by seed: A B A B
    assert [r.name for r in result.records] == ["fashion-mnist-baseline-s0", "fashion-mnist-mild-s0",
                                                "fashion-mnist-baseline-s1", "fashion-mnist-mild-s1"]
    assert [r.config["bench"]["seed"] for r in result.records] == [0, 0, 1, 1]

    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    entry = summary["vision"]
    check_entry_schema(entry, 2)
    assert entry["target"] == {"metric": "eval/accuracy", "value": 0.15}
    assert entry["best_recipe"] == "mild"
    assert entry["time_breakdown"]["recipe"] == "mild" and entry["time_breakdown"]["steps"] == 4
    assert entry["baseline"]["runs"] == ["fashion-mnist-baseline-s0", "fashion-mnist-baseline-s1"]
    assert entry["machine"]["torch_threads"] == 1

    # evaluation is kept out of the clock: every time to target is a training-clock reading taken at an
    # evaluation, and the slowed-down evaluations do not show up in the training time
    for record in [*result.records, *result.ablations]:
        assert record.timings["eval_s"] >= 0.1 * len(record.evals)
        if record.time_to_target is not None:
            assert record.time_to_target in [row["wall_s"] for row in record.evals]
            assert record.time_to_target <= record.timings["train_s"]
    # (what evaluation-time methods add, mild's test-time augmentation, is inside both train_s and eval_s)
    total_s = sum(r.timings["train_s"] - r.timings.get("eval_methods_s", 0.0) + r.timings["eval_s"]
                  + r.timings["setup_s"] for r in [*result.records, *result.ablations])
    assert total_s <= elapsed  # were evaluation counted in training time, the parts would add up to more

    # leave-one-out: one run per method and per non-method part, marked for compare.leave_one_out
    loo = entry["leave_one_out"]
    assert loo["recipe"] == "mild" and loo["of"] in {"fashion-mnist-mild-s0", "fashion-mnist-mild-s1"}
    # precision is a part only where mild's "auto" picks another precision than the baseline's fp32 on this CPU
    precisions = {r.config["precision_resolved"] for r in result.records}
    expected = {"channels_last", "label_smoothing", "loader"} | ({"precision"} if len(precisions) > 1 else set())
    assert expected <= set(loo["parts"]) and ("precision" in loo["parts"]) == (len(precisions) > 1)
    assert all(r.config["ablation"]["of"] == loo["of"] for r in result.ablations)

    assert "| **mild** |" in (tmp_path / "out" / "summary.md").read_text()
    for name in ("vision_curves.html", "vision_speedup.html", "plotly.min.js"):
        assert (tmp_path / "out" / name).stat().st_size > 0  # the figures open without a network
    assert any("[4/4]" in line for line in logged)


@needs_fmnist
def test_cli_bench_runs_tiny_and_keeps_the_other_task(tmp_path, capsys):
    out = tmp_path / "out"
    language = summarize([fake_record(r, 0, [(10, 1.9)], target=2.0, metric="eval/bpb") for r in ("baseline", "hot")],
                         BenchProfile(name="cpu", run=RunRequest(task="pydocs", device="cpu")))
    merge_summary(out / "summary.json", "language", language)
    code = main(["bench", "--task", "vision", "--seeds", "1", "--recipes", "hot", "--baselines", "plain,plain-bf16",
                 "--duration", "4ba", "--eval-interval", "2ba",
                 "--data-fraction", "0.02", "--eval-fraction", "0.05", "--target", "0.2", "--device", "cpu",
                 "--out", str(out), "--run-dir", str(tmp_path / "runs"), "--no-figures"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"language", "vision"}
    assert summary["vision"]["recipes"].keys() == {"hot"} and summary["vision"]["seeds"] == [0]
    assert summary["vision"]["baselines"].keys() == {"plain", "plain-bf16"}
    printed = capsys.readouterr().out
    assert "| recipe | budget | reached | time to target (s) | speed-up vs plain | speed-up vs plain-bf16 |" in printed
    assert "| hot | 4ba |" in printed.replace("**", "")


def test_the_budget_search_finds_the_shortest_whole_epoch_budget_every_seed_reaches(monkeypatch, tmp_path):
    """run_one is replaced by a model of a baseline that needs 5 epochs in seed 0 and 4 in seed 1."""
    from speedkit.experiments.bench import harness

    needs = {0: 5, 1: 4}
    ran = []

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        epochs = int(recipe.duration.removesuffix("ep"))
        ran.append((epochs, seed))
        assert bench_info["budget_search"] is True
        return fake_record(recipe.name, seed, [(epochs, 0.93 if epochs >= needs[seed] else 0.91)], target=0.92)

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    profile = get_profile("vision", "cpu")
    def find_budget(profile, seeds):
        return harness.tune_baseline(profile, "plain", seeds, tmp_path, "s", log=lambda line: None, sweep=False,
                                     find_budget=True)["budget"]

    found = find_budget(profile, [0, 1])
    assert found == {"budget": "5ep", "tried": {"8ep": 2, "7ep": 2, "6ep": 2, "5ep": 2, "4ep": 0}}
    assert ran[-1] == (4, 0)  # a budget is rejected at its first seed that falls short
    upward = dataclasses.replace(profile, recipe_changes={"plain": {"duration": "3ep"}})
    assert find_budget(upward, [0, 1])["budget"] == "5ep"
    never = dataclasses.replace(profile, recipe_changes={"plain": {"duration": "2ep"}})
    with pytest.raises(ValueError, match="within 4ep"):
        find_budget(never, [0, 1])
    in_batches = dataclasses.replace(profile, budget_step="50ba")
    with pytest.raises(ValueError, match="plain's budget in whole steps of it, got '8ep'"):
        find_budget(in_batches, [0])


def test_a_budget_search_in_batches_starts_where_the_sweep_reached_the_target(monkeypatch, tmp_path):
    """A language baseline needs 380 batches in seed 0 and 420 in seed 1; the search moves 50 at a time."""
    from speedkit.experiments.bench import harness

    needs, ran = {0: 380, 1: 420}, []

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        batches = int(recipe.duration.removesuffix("ba"))
        ran.append((batches, seed))
        assert kwargs["stop_at_target"] is True  # reaching is all a budget search needs to see
        return fake_record(recipe.name, seed, [(1.0, 3.2 if batches >= needs[seed] else 3.4)], target=3.3,
                           metric="eval/bpb")

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    profile = get_profile("language", "cpu")
    pick = {"lr": 2e-3, "schedule": {"name": "cosine", "warmup": "0.05dur"}}
    swept = {"pick": pick, "tried": [{**pick, "batches_to_target": 475}, {"lr": 1e-3, "schedule": pick["schedule"],
                                                                         "batches_to_target": 200}]}
    found = harness.tune_baseline(profile, "tuned", [0, 1], tmp_path, "s", log=lambda line: None, sweep=False,
                                  find_budget=True, earlier=swept)["budget"]
    assert found == {"budget": "450ba", "tried": {"500ba": 2, "450ba": 2, "400ba": 1}}
    assert ran[0] == (500, 0) and ran[-1] == (400, 1)  # from the pick's 475 batches, rounded up to the step
    plan = harness.baseline_plan(profile, "tuned", [0], sweep=False, find_budget=True)
    missed = Outcome(plan.grid()[0], None, 3.4)
    own = int(profile.recipe("tuned").duration.removesuffix("ba")) // 50
    assert start_steps(plan, [missed]) == own  # a pick that missed: from the recipe's own budget
    in_epochs = dataclasses.replace(plan, budget_step="1ep", start_steps=8)
    assert start_steps(in_epochs, [Outcome(plan.grid()[0], 475, 3.2)]) == 8  # epochs: no batch count to start from


def test_the_sweep_runs_the_grid_on_one_seed_and_picks_the_fastest(monkeypatch, tmp_path):
    from speedkit.experiments.bench import harness

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        assert bench_info["sweep"] is True and seed == 3
        assert recipe.duration == "600ba"  # the grid's budget, not the shorter one tuned ships with
        lr, shape = recipe.optimizer["lr"], recipe.schedule["name"]
        seconds = {1e-3: 50, 2e-3: 30, 4e-3: None}[lr] if shape == "cosine" else {1e-3: 45, 2e-3: 20, 4e-3: None}[lr]
        # one evaluation every 10 s (so at batches 1, 2, ...), reaching 3.3 bpb at ``seconds``
        evals = [(60, 3.4)] if seconds is None else [(t, 3.4) for t in range(10, seconds - 9, 10)] + [(seconds, 3.2)]
        record = fake_record(recipe.name, seed, evals, target=3.3, metric="eval/bpb")
        record.config["recipe_spec"] = dataclasses.asdict(recipe)  # as make_trainer records it
        return record

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    found = harness.tune_baseline(get_profile("language"), "tuned", [3], tmp_path, "s", log=lambda line: None)["sweep"]
    assert len(found["tried"]) == 6  # three learning rates x two schedules, the rates first
    assert found["pick"] == {"lr": 2e-3, "schedule": {"name": "linear_to_zero", "warmup": "0.05dur"}}
    assert [t["time_to_target_s"] for t in found["tried"]] == [50, 30, None, 45, 20, None]
    assert [t["batches_to_target"] for t in found["tried"]] == [5, 3, None, 4, 2, None]
    with pytest.raises(ValueError, match="no sweep for 'plain'"):
        harness.tune_baseline(get_profile("vision"), "plain", [0], tmp_path, "s")


def test_the_language_budget_search_covers_tuned_only_and_starts_from_the_sweep(monkeypatch, tmp_path):
    """`--sweeps F --find-budgets`: tuned's budget is searched from the pick's batches; `baseline` stays as it is."""
    from speedkit.experiments.bench import harness

    searched, main = [], {}

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        batches = int(recipe.duration.removesuffix("ba"))
        if bench_info.get("budget_search"):
            searched.append((recipe.name, batches, seed))
        else:
            main[recipe.name] = recipe.duration
        return fake_record(recipe.name, seed, [(1.0, 3.2 if batches >= 500 else 3.4)], target=3.3, metric="eval/bpb")

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    pick = {"lr": 1e-3, "schedule": {"name": "linear_to_zero", "warmup": "0.05dur"}}
    sweeps = {"tuned": {"pick": pick, "tried": [{**pick, "batches_to_target": 430}]}}
    result = harness.run_benchmark("language", seeds=1, recipes="", out_dir=tmp_path, run_dir=tmp_path,
                                   figures=False, log=lambda line: None, sweeps=sweeps, find_budgets=True)
    assert {name for name, _, _ in searched} == {"tuned"}
    assert [batches for _, batches, _ in searched] == [450, 500]  # up from the hint to the first that holds
    assert main == {"baseline": "600ba", "tuned": "500ba"}
    saved = json.loads((tmp_path / "language_budgets.json").read_text())
    conditions = {"task": "language", "data": None, "data_fraction": 1.0, "target": 3.3, "duration": None,
                  "duration_scale": 1.0}  # what a later --budgets checks it is run under
    assert saved == {"tuned": {"budget": "500ba", "tried": {"450ba": 0, "500ba": 1}, "conditions": conditions}}
    assert result.entry["baselines"]["tuned"]["budget_search"] == saved["tuned"]


def test_an_earlier_sweep_sets_the_swept_baseline_and_nothing_else(monkeypatch, tmp_path):
    """`--sweeps FILE` runs the swept baseline with the file's pick, as `--sweep` would have."""
    from speedkit.experiments.bench import harness

    ran = {}

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        ran[recipe.name] = recipe
        return fake_record(recipe.name, seed, [(10.0, 3.2)], target=3.3, metric="eval/bpb")

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    pick = {"lr": 4e-3, "schedule": {"name": "linear_to_zero", "warmup": "0.05dur"}}
    sweeps = {"tuned": {"pick": pick, "tried": []}}
    result = harness.run_benchmark("language", seeds=1, recipes="", out_dir=tmp_path, run_dir=tmp_path,
                                   figures=False, log=lambda line: None, sweeps=sweeps)
    assert ran["tuned"].optimizer["lr"] == 4e-3 and ran["tuned"].schedule == pick["schedule"]
    assert ran["baseline"].optimizer == get_profile("language").recipe("baseline").optimizer
    assert result.entry["baselines"]["tuned"]["sweep"] == sweeps["tuned"]
    with pytest.raises(ValueError, match=r"sweeps for \['mild'\], which this profile has no sweeps for"):
        harness.run_benchmark("vision", seeds=1, recipes="", out_dir=tmp_path, run_dir=tmp_path, figures=False,
                              log=lambda line: None, sweeps={"mild": {"pick": pick, "tried": []}})


def test_a_profile_that_names_no_sweep_sweeps_each_baselines_own_rate_halved_and_doubled(monkeypatch, tmp_path):
    """`--sweep` on a task whose profile names no sweep (a user's, the seed tasks') tunes its baselines, not
    nothing: each baseline's learning rate x1, x0.5, x2 with both decays (the grid tune's baseline plan tries too),
    then the main run takes the pick."""
    from speedkit.experiments.bench import harness

    swept, main = [], {}
    given = get_profile("vision").recipe("plain-bf16")

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        if bench_info.get("sweep"):
            assert recipe.duration == given.duration  # the baseline's own budget
            swept.append((recipe.optimizer["lr"], recipe.schedule["name"]))
            winner = (recipe.optimizer["lr"], recipe.schedule["name"]) == (given.optimizer["lr"] * 2, "linear_to_zero")
            evals = [(20.0, 0.95)] if winner else [(20.0, 0.5), (40.0, 0.95)]  # the winner reaches it a batch sooner
        else:
            main[recipe.name] = recipe
            evals = [(30.0, 0.95)]
        record = fake_record(recipe.name, seed, evals)
        record.config["recipe_spec"] = dataclasses.asdict(recipe)
        return record

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    result = harness.run_benchmark("vision", seeds=1, recipes="", baselines="plain-bf16", out_dir=tmp_path,
                                   run_dir=tmp_path, figures=False, log=lambda line: None, sweep=True)
    lr = given.optimizer["lr"]
    grid = [(lr * f, shape) for shape in ("cosine", "linear_to_zero") for f in (1.0, 0.5, 2.0)]  # the rates first
    # the pick is the grid's top rate, so the sweep tries one step past it (x4, the pick's decay), which loses
    assert swept == [*grid, (lr * 4, "linear_to_zero")]
    assert main["plain-bf16"].optimizer["lr"] == lr * 2 and main["plain-bf16"].schedule["name"] == "linear_to_zero"
    assert result.entry["baselines"]["plain-bf16"]["sweep"]["pick"]["lr"] == lr * 2


def test_a_sweep_whose_edge_keeps_winning_goes_past_it_a_bounded_number_of_steps(monkeypatch, tmp_path):
    """The lowest rate of the grid wins, and each lower one wins again: the sweep tries EDGE_STEPS rates past the
    edge (each a grid step further, with the pick's decay) and picks the last; it never runs on without end."""
    from speedkit.experiments.bench import harness

    given = get_profile("vision").recipe("plain-bf16")
    lr, swept = given.optimizer["lr"], []

    def fake_run_one(profile, recipe, seed, run_name, run_dir, bench_info, **kwargs):
        swept.append((recipe.optimizer["lr"], recipe.schedule["name"]))
        seconds = 10 * round(100 * recipe.optimizer["lr"] / lr) + (5 if recipe.schedule["name"] == "cosine" else 0)
        record = fake_record(recipe.name, seed, [(t, 0.5) for t in range(10, seconds, 10)] + [(seconds, 0.95)])
        record.config["recipe_spec"] = dataclasses.asdict(recipe)
        return record

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    profile = harness.with_default_sweeps(harness.resolve_profile("vision", "cpu", 1, "", "plain-bf16")[0])
    # the baseline's own schedule and a linear decay after its warmup: where the sweep keeps the rate and the
    # schedule, the tuned baseline is the shipped one
    shipped = get_recipe("fashion-mnist", "plain-bf16").schedule
    linear = {"name": "linear_to_zero", "warmup": shipped["warmup"]}
    assert profile.sweeps["plain-bf16"]["schedule"] == (shipped, linear)
    said = []
    found = harness.tune_baseline(profile, "plain-bf16", [0], tmp_path, "s", log=said.append, find_budget=True)
    assert swept[6:8] == [(lr * 0.25, "linear_to_zero"), (lr * 0.125, "linear_to_zero")]
    # then the budget walk at the pick (every budget reaches here), which is no step past the edge
    assert found["budget"]["budget"] == "1ep" and set(swept[8:]) == {(lr * 0.125, "linear_to_zero")}
    assert sum("is the edge of the rates tried" in line for line in said) == EDGE_STEPS
    found = found["sweep"]
    assert len(found["tried"]) == 6 + EDGE_STEPS
    assert found["pick"]["lr"] == lr * 0.125 and found["pick"]["schedule"]["name"] == "linear_to_zero"


def test_leave_one_out_covers_the_whole_difference_from_the_baseline():
    from speedkit.experiments.ablation import ablation_changes
    from speedkit.tasks import get_recipe

    plain_bf16, hot = get_recipe("fashion-mnist", "plain-bf16"), get_recipe("fashion-mnist", "hot")
    changes = ablation_changes(hot, plain_bf16)
    assert "channels_last" not in changes  # the baseline has it too, as it is
    assert set(hot.methods) - {"channels_last"} <= set(changes)
    assert changes["budget"] == {"duration": plain_bf16.duration}
    assert changes["learning_rate"]["optimizer"] == {**hot.optimizer, "lr": plain_bf16.optimizer["lr"]}
    assert changes["batch_size"] == {"batch_size": plain_bf16.batch_size}
    assert changes["schedule"] == {"schedule": plain_bf16.schedule}
    assert changes["augment"] == {"augment": plain_bf16.augment}
    assert "optimizer" not in changes and "loader" not in changes  # same momentum, weight decay and loader
    # giving back every part at once turns the recipe into the baseline
    data = dataclasses.asdict(hot)
    for part, change in changes.items():
        data.update(change if part in ("learning_rate", "optimizer") else change)
    data["methods"] = dict(plain_bf16.methods)
    for field in ("duration", "batch_size", "schedule", "augment", "precision", "loader"):
        assert data[field] == getattr(plain_bf16, field), field
    assert data["optimizer"]["lr"] == plain_bf16.optimizer["lr"]


def test_cli_bench_names_the_known_recipes(tmp_path, capsys):
    code = main(["bench", "--task", "vision", "--recipes", "mild,spicy", "--out", str(tmp_path), "--run-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "spicy" in err and "hot" in err and "medium" in err


@pytest.mark.slow
@needs_python_docs
def test_tiny_language_benchmark(tmp_path):
    result = run_benchmark("language", tiny_profile("language", ("baseline", "mild"), 2), seeds=1, recipes="mild",
                           out_dir=tmp_path, run_dir=tmp_path / "runs", device="cpu", data_fraction=0.05,
                           eval_fraction=0.02, eval_interval="2ba", duration="4ba", target=8.0, figures=False,
                           log=lambda line: None)
    entry = json.loads((tmp_path / "summary.json").read_text())["language"]
    check_entry_schema(entry, 1)
    assert entry["target"] == {"metric": "eval/bpb", "value": 8.0}
    assert [r.config["recipe"] for r in result.records] == ["baseline", "tuned", "mild"]  # every baseline by default
    assert set(entry["recipes"]["mild"]["speedup_vs"]) == {"baseline", "tuned"}


@needs_fmnist
def test_reuse_takes_the_main_runs_and_the_leave_one_out_reruns_its_reference(tmp_path):
    common = dict(seeds=1, recipes="mild", out_dir=tmp_path / "out", run_dir=tmp_path / "runs", figures=False,
                  log=lambda line: None, **TINY_VISION)
    first = run_benchmark("vision", **common)
    again = run_benchmark("vision", leave_one_out=True, reuse=True, **common)

    assert [(r.run_id, r.created) for r in again.records] == [(r.run_id, r.created) for r in first.records]
    reference, *left_out = again.ablations
    assert reference.name.startswith("fashion-mnist-mild-s0-reference-") and reference.run_id != first.records[1].run_id
    assert {r.config["ablation"]["of"] for r in left_out} == {reference.name}
    loo = again.entry["leave_one_out"]
    assert loo["of"] == reference.name and loo["reference_rerun"] is True
    assert set(loo["parts"]) == {r.config["ablation"]["left_out"] for r in left_out}
    # a later summary of the same runs keeps that leave-one-out without running it again
    summarised = run_benchmark("vision", reuse=True, **common)
    assert sorted(r.run_id for r in summarised.ablations) == sorted(r.run_id for r in again.ablations)
    assert summarised.entry["leave_one_out"]["of"] == reference.name

    with pytest.raises(ValueError, match="mild seed 1"):
        run_benchmark("vision", **{**common, "seeds": 2}, reuse=True)
    # runs made with another budget, data fraction or cadence are another measurement: named, not taken; another
    # target alone judges the same runs at it
    made_otherwise = r"the runs of baseline seed 0, plain seed 0, plain-bf16 seed 0, mild seed 0 there were made with"
    for changed in ({"duration": "9ba"}, {"data_fraction": 0.03}, {"eval_interval": "2ba"}):
        with pytest.raises(ValueError, match=made_otherwise + " other settings"):
            run_benchmark("vision", **{**common, **changed}, reuse=True)
    assert run_benchmark("vision", **{**common, "target": 0.2}, reuse=True).entry["target"]["value"] == 0.2
    # --only without --target: the runs it keeps (made to 0.15) are judged at the task's target, as the new run is
    only = run_benchmark("vision", **{**common, "target": None}, only="mild")
    default = TASKS["fashion-mnist"].target_value
    assert only.entry["target"]["value"] == default and {r.target["value"] for r in only.records} == {default}
    # runs of the same names made afresh with other settings, then summarised: the earlier leave-one-out took apart
    # other runs (by run id), so it is not theirs
    run_benchmark("vision", **{**common, "data_fraction": 0.03})
    again_elsewhere = run_benchmark("vision", **{**common, "data_fraction": 0.03}, reuse=True)
    assert again_elsewhere.ablations == [] and again_elsewhere.entry["leave_one_out"] is None
