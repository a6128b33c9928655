"""The presets: recipe files that load, validate against the method cards and run a few steps on their task's
real data, and what they say they reached, read from the committed benchmark results."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from prerequisites import require

from speedkit.methods import build_methods
from speedkit.tasks import TASKS, get_recipe, is_baseline, make_trainer
from speedkit.tasks.recipes import PRESETS, Recipe, read_recipe_file, timing_eval_interval
from speedkit.tasks.task import BUILT_IN

ALL = [(task, name) for task in sorted(BUILT_IN) for name in TASKS[task].recipes]


@pytest.mark.parametrize("task, name", ALL, ids=[f"{t}:{n}" for t, n in ALL])
def test_recipe_validates(task, name):
    recipe = get_recipe(task, name)
    assert recipe.task == task and recipe.domain == TASKS[task].domain  # taken from the task that holds it
    assert recipe.name == name and recipe.summary
    build_methods(recipe.methods)  # every method exists and its parameters fit its card


def test_speed_up_presets_state_the_target_they_were_tuned_for_and_runs_measure_against_it(tmp_path):
    from speedkit.tasks import recipe_target
    from speedkit.tasks.recipes import Recipe

    for task in BUILT_IN:
        for name, recipe in TASKS[task].recipes.items():
            if not is_baseline(task, name):
                assert recipe.target["metric"] == TASKS[task].target_metric, (task, name)
    assert recipe_target(TASKS["pydocs"], get_recipe("pydocs", "hot").with_changes(
        target={"metric": "eval/bpb", "value": 3.5})) == 3.5  # the recipe's own, not the task's
    assert recipe_target(TASKS["pydocs"], get_recipe("pydocs", "baseline")) == TASKS["pydocs"].target_value
    wrong = get_recipe("fashion-mnist", "hot").with_changes(target={"metric": "eval/bpb", "value": 3.3})
    with pytest.raises(ValueError, match="targets eval/bpb, but task 'fashion-mnist' measures eval/accuracy"):
        recipe_target(TASKS["fashion-mnist"], wrong)
    with pytest.raises(ValueError, match="target must be"):
        Recipe(**{**get_recipe("fashion-mnist", "hot").to_dict(), "target": {"value": 0.92}})
    path = tmp_path / "hot.yaml"
    path.write_text(get_recipe("fashion-mnist", "hot").to_yaml())
    assert Recipe.from_file(path).target == {"metric": "eval/accuracy", "value": 0.92}


RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@pytest.mark.parametrize("task", sorted(BUILT_IN))
def test_what_a_preset_reached_is_what_the_committed_benchmark_measured(task):
    from speedkit.experiments.bench.profiles import task_key

    entry = json.loads((RESULTS / "summary.json").read_text())[task_key(task)]
    measured = {**entry["baselines"], **entry["recipes"]}
    for name, recipe in TASKS[task].recipes.items():
        if recipe.reached is None:  # a run the benchmark measured must not go unstated
            assert name not in measured, f"{task}:{name} was measured in summary.json: run `make readme`"
            continue
        assert name in measured, f"{task}:{name} states what it reached, but summary.json has no run of it"
        runs, n = measured[name], len(entry["seeds"])
        times = [t for t in runs["time_to_target_s"] if t is not None]
        expected = {"seeds_reached": f"{runs['reached']}/{n}", "target": entry["target"]["value"],
                    "metric": entry["target"]["metric"], "profile": entry["profile"],
                    "time_to_target_s": round(statistics.median(times), 1) if times else None,
                    "final": round(statistics.median(runs["final_metric"]), 4), "budget": recipe.duration}
        assert {k: recipe.reached[k] for k in expected} == expected, f"{task}:{name}"


def test_the_shipped_figures_are_the_ones_written_from_the_committed_results():
    """presets/reached.json is package data written by `make readme`; it must say what the results say."""
    from speedkit.experiments.report import preset_reached

    results = [json.loads((RESULTS / name).read_text()) for name in ("summary.json", "fresh_seeds.json")]
    assert json.loads((PRESETS / "reached.json").read_text()) == preset_reached(*results), "run `make readme`"
    stale = {"fashion-mnist": {"hot": {"budget": "3ep", "result": "3/3"}}}  # not the budget the benchmark ran
    with pytest.raises(ValueError, match="fashion-mnist:hot ran 3ep, but the benchmark ran 2.5ep"):
        preset_reached(results[0], stale)


def test_every_preset_file_is_a_recipe_file_holding_its_tasks_presets():
    """One file per task, in the format `--recipe FILE:NAME` reads; the task and domain are the task's."""
    assert sorted(p.stem for p in PRESETS.glob("*.yaml")) == ["fashion-mnist", "gpt2", "image-folder", "imagenet",
                                                              "pydocs"]
    for path in PRESETS.glob("*.yaml"):
        recipes = read_recipe_file(path)
        assert all(r.task is None and r.domain is None and r.reached is None for r in recipes.values()), path
        if path.stem in BUILT_IN:
            assert {n: r.to_dict() | {"reached": None} for n, r in recipes.items()} == {
                n: r.to_dict() | {"reached": None} for n, r in TASKS[path.stem].recipes.items()}


def test_every_task_has_the_four_presets():
    for task in BUILT_IN:
        assert {"baseline", "mild", "medium", "hot"} <= set(TASKS[task].recipes), task


@pytest.mark.parametrize("duration, own, timed", [
    ("10ep", "1ep", "0.25ep"),     # an epoch's evaluations would round a time up by a whole epoch
    ("8ep", "0.25ep", "0.25ep"),   # fine enough already: kept
    ("3ep", "0.1ep", "0.1ep"),
    ("600ba", "100ba", "30ba"),    # 20 evaluations in the budget
    ("550ba", "25ba", "25ba"),
    ("10ba", "5ba", "1ba"),        # at least one batch
    ("600ba", "0.5ep", "30ba"),    # another unit than the budget's: replaced
    ("90s", "1ep", "1ep"),         # a budget of wall clock has no count to divide: the recipe's own
])
def test_a_run_timed_to_a_target_evaluates_finely(duration, own, timed):
    recipe = Recipe(name="r", model="resnet9", duration=duration, batch_size=8, optimizer={"name": "sgd", "lr": 0.1},
                    eval_interval=own)
    assert timing_eval_interval(recipe) == timed


@pytest.mark.parametrize("task, name", ALL, ids=[f"{t}:{n}" for t, n in ALL])
def test_preset_file_recipe_runs_a_few_steps(tmp_path, task, name):
    """Each preset, read from its task's preset file as a user's copy of it would be, trains."""
    require("fashion-mnist" if task == "fashion-mnist" else "python-docs")
    trainer = make_trainer(task, f"{PRESETS / task}.yaml:{name}", duration="3ba", batch_size=16, data_fraction=0.02, eval_fraction=0.02,
                           device="cpu", run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed" and record.steps[-1]["batch"] == 3
    assert record.method_names == [a.name for a in trainer.state.methods]
    assert sorted(record.method_names) == sorted(get_recipe(task, name).methods)
