"""The time-to-accuracy benchmark harness at a tiny scale: schema, pairing by seed, evaluation kept out
of the clock, merging tasks into one summary, and the ``speedkit bench`` command. No test asserts a speed."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest

from speedkit.bench import (BenchProfile, get_profile, merge_summary, pick_best, profile_steps, readme_table,
                            run_benchmark, summarize, summary_markdown)
from speedkit.cli import main
from speedkit.core import Callback
from speedkit.runs import RunRecord
from speedkit.trainer import Trainer

from helpers import needs_fmnist, needs_python_docs, toy_loaders, toy_model

TINY_VISION = dict(device="cpu", data_fraction=0.02, eval_fraction=0.05, eval_interval="3ba", duration="6ba",
                   target=0.15)


def tiny_profile(task: str, recipes: tuple[str, ...], batch_size: int) -> BenchProfile:
    """The task's CPU profile with small batches: a profile is data, so a test can shrink it."""
    return dataclasses.replace(get_profile(task, "cpu"), recipe_changes={r: {"batch_size": batch_size}
                                                                          for r in recipes})
RECIPE_KEYS = {"runs", "methods", "time_to_target_s", "final_metric", "train_s", "eval_s", "setup_s", "compile_s",
               "flops_fraction_of_peak", "time_to", "median_time_to_target_s", "reached", "speedup", "speedup_median"}
TASK_ENTRY_KEYS = {"task", "profile", "target", "seeds", "baseline", "recipes", "best_recipe", "speedup_median",
                   "speedup_median_at", "flops_fraction_of_peak", "leave_one_out", "machine", "date"}


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
    for recipe in [entry["baseline"], *entry["recipes"].values()]:
        assert RECIPE_KEYS <= set(recipe)
        for key in ("time_to_target_s", "final_metric", "train_s", "eval_s", "speedup"):
            assert len(recipe[key]) == n_seeds, key


# -- profiles ----------------------------------------------------------------------------------
def test_profiles_are_data_and_bad_names_get_clear_errors():
    gpu = get_profile("vision", "gpu")
    assert gpu.recipe("baseline") == get_profile("vision", "cpu").recipe("baseline")  # the hand-written one
    assert gpu.recipe("mild").batch_size == 512 and gpu.recipe("mild").precision == "bf16"
    assert "torch_compile" in gpu.recipe("mild").methods and "label_smoothing" in gpu.recipe("mild").methods
    assert "torch_compile" not in gpu.recipe("hot").methods  # progressive resizing would recompile
    assert get_profile("language").targets == (3.3, 3.5) and get_profile("vision").targets == (0.90, 0.92, 0.93)
    with pytest.raises(ValueError, match="known: .*language.*vision"):
        get_profile("speech")
    with pytest.raises(ValueError, match="known: \\['cpu', 'gpu'\\]"):
        get_profile("vision", "tpu")
    with pytest.raises(ValueError, match="unknown recipes \\['spicy'\\].*known"):
        BenchProfile(name="x", task="fashion-mnist", recipes=("baseline", "spicy"))


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
    profile = BenchProfile(name="cpu", task="fashion-mnist", device="cpu", target=0.9, report_targets=(0.8,))
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
    # hot's median with the missed seed counted as never is 5 s; mild's is 8 s
    assert entry["best_recipe"] == "hot" and entry["speedup_median"] == 3.0
    assert entry["speedup_median_at"]["0.8"] == pytest.approx(1.0)  # (5/5, 6/6, 8/2) -> median 1


def test_best_recipe_ranks_a_never_reached_seed_as_slowest():
    recipes = {"lucky": {"time_to_target_s": [1.0, None, None], "final_metric": [0.9, 0.5, 0.5]},
               "steady": {"time_to_target_s": [4.0, 5.0, 6.0], "final_metric": [0.9, 0.9, 0.9]}}
    assert pick_best(recipes, "eval/accuracy") == "steady"
    nowhere = {"a": {"time_to_target_s": [None], "final_metric": [3.1]},
               "b": {"time_to_target_s": [None], "final_metric": [2.9]}}
    assert pick_best(nowhere, "eval/bpb") == "b"  # lower bits per byte is better


def test_vision_then_language_merge_into_one_summary(tmp_path):
    vision = summarize(hand_made_vision_records(), BenchProfile(name="cpu", task="fashion-mnist", device="cpu",
                                                                target=0.9))
    language_records = [fake_record(recipe, 0, [(20, 2.5), (40, 1.9)] if recipe == "baseline" else [(10, 1.95)],
                                    target=2.0, metric="eval/bpb") for recipe in ("baseline", "hot")]
    language = summarize(language_records, BenchProfile(name="cpu", task="pydocs", device="cpu"))
    path = tmp_path / "summary.json"
    merge_summary(path, "vision", vision)
    merged = merge_summary(path, "language", language)
    on_disk = json.loads(path.read_text())
    assert set(on_disk) == set(merged) == {"vision", "language"}
    assert on_disk["language"]["recipes"]["hot"]["speedup"] == [4.0]
    assert on_disk["vision"]["best_recipe"] == "hot"
    table = readme_table(on_disk)
    assert "| vision (eval/accuracy 0.9) | hot |" in table and "| language (eval/bpb 2) | hot |" in table
    assert on_disk["vision"]["machine"]["cpu"] in table and "torch" in table
    assert "## vision" in summary_markdown(on_disk) and "## language" in summary_markdown(on_disk)
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
                           out_dir=tmp_path / "out", run_dir=tmp_path / "runs", leave_one_out=True, profile_steps=4,
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
    total_s = sum(r.timings["train_s"] + r.timings["eval_s"] + r.timings["setup_s"]
                  for r in [*result.records, *result.ablations])
    assert total_s <= elapsed  # were evaluation counted in training time, the parts would add up to more

    # leave-one-out: one run per method and per non-method part, marked for compare.leave_one_out
    loo = entry["leave_one_out"]
    assert loo["recipe"] == "mild" and loo["of"] in {"fashion-mnist-mild-s0", "fashion-mnist-mild-s1"}
    assert {"channels_last", "label_smoothing", "precision", "loader"} <= set(loo["parts"])
    assert all(r.config["ablation"]["of"] == loo["of"] for r in result.ablations)

    assert "| **mild** |" in (tmp_path / "out" / "summary.md").read_text()
    for name in ("vision_curves.html", "vision_speedup.html", "plotly.min.js"):
        assert (tmp_path / "out" / name).stat().st_size > 0  # the figures open without a network
    assert any("[4/4]" in line for line in logged)


@needs_fmnist
def test_cli_bench_runs_tiny_and_keeps_the_other_task(tmp_path, capsys):
    out = tmp_path / "out"
    language = summarize([fake_record(r, 0, [(10, 1.9)], target=2.0, metric="eval/bpb") for r in ("baseline", "hot")],
                         BenchProfile(name="cpu", task="pydocs", device="cpu"))
    merge_summary(out / "summary.json", "language", language)
    code = main(["bench", "vision", "--seeds", "1", "--recipes", "hot", "--duration", "4ba", "--eval-interval", "2ba",
                 "--data-fraction", "0.02", "--eval-fraction", "0.05", "--target", "0.2", "--device", "cpu",
                 "--out", str(out), "--run-dir", str(tmp_path / "runs"), "--no-figures"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"language", "vision"}
    assert summary["vision"]["recipes"].keys() == {"hot"} and summary["vision"]["seeds"] == [0]
    printed = capsys.readouterr().out
    assert "| recipe | reached |" in printed and "| hot |" in printed.replace("**", "")


def test_cli_bench_names_the_known_recipes(tmp_path, capsys):
    code = main(["bench", "vision", "--recipes", "mild,spicy", "--out", str(tmp_path), "--run-dir", str(tmp_path)])
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
    assert [r.config["recipe"] for r in result.records] == ["baseline", "mild"]


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

    with pytest.raises(ValueError, match="mild seed 1"):
        run_benchmark("vision", **{**common, "seeds": 2}, reuse=True)
