"""Recipes load, validate against the method cards, and run a few steps on their task's real data."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from prerequisites import require

from speedkit.methods import build_methods
from speedkit.tasks import make_trainer
from speedkit.tasks.recipes import RECIPES, get_recipe

ALL = [(task, name) for task, recipes in RECIPES.items() for name in recipes]


@pytest.mark.parametrize("task, name", ALL, ids=[f"{t}:{n}" for t, n in ALL])
def test_recipe_validates(task, name):
    recipe = get_recipe(task, name)
    assert recipe.task == task and recipe.name == name and recipe.summary
    build_methods(recipe.methods)  # every method exists and its parameters fit its card


def test_speed_up_presets_state_the_target_they_were_tuned_for_and_runs_measure_against_it(tmp_path):
    from speedkit.tasks import TASKS, recipe_target
    from speedkit.tasks.recipes import BASELINES, Recipe

    for task, recipes in RECIPES.items():
        for name, recipe in recipes.items():
            if name not in BASELINES[task]:
                assert recipe.target["metric"] == TASKS[task].target_metric, (task, name)
    assert recipe_target(TASKS["pydocs"], get_recipe("pydocs", "hot")) == 3.30  # not the task's 2.0
    assert recipe_target(TASKS["pydocs"], get_recipe("pydocs", "baseline")) == TASKS["pydocs"].target_value
    wrong = get_recipe("fashion-mnist", "hot").with_changes(target={"metric": "eval/bpb", "value": 3.3})
    with pytest.raises(ValueError, match="targets eval/bpb, but task 'fashion-mnist' measures eval/accuracy"):
        recipe_target(TASKS["fashion-mnist"], wrong)
    with pytest.raises(ValueError, match="target must be"):
        Recipe(**{**get_recipe("fashion-mnist", "hot").to_dict(), "target": {"value": 0.92}})
    path = tmp_path / "hot.yaml"
    path.write_text(get_recipe("fashion-mnist", "hot").to_yaml())
    assert Recipe.from_file(path).target == {"metric": "eval/accuracy", "value": 0.92}


SUMMARY = Path(__file__).resolve().parents[2] / "bench" / "results" / "summary.json"


@pytest.mark.parametrize("task", sorted(RECIPES))
def test_what_a_recipe_says_it_reached_is_what_the_committed_benchmark_measured(task):
    from speedkit.experiments.bench.profiles import task_key

    entry = json.loads(SUMMARY.read_text())[task_key(task)]
    measured = {**entry.get("baselines", {"baseline": entry["baseline"]}), **entry["recipes"]}
    for name, recipe in RECIPES[task].items():
        if recipe.reached is None:  # a run the benchmark measured must not go unstated
            assert name not in measured, f"{task}:{name} was measured in {SUMMARY.name}: fill in its reached"
            continue
        assert name in measured, f"{task}:{name} states what it reached, but {SUMMARY.name} has no run of it"
        runs, n = measured[name], len(entry["seeds"])
        times = [t for t in runs["time_to_target_s"] if t is not None]
        expected = {"seeds_reached": f"{runs['reached']}/{n}", "target": entry["target"]["value"],
                    "metric": entry["target"]["metric"], "profile": entry["profile"],
                    "time_to_target_s": round(statistics.median(times), 1) if times else None,
                    "final": round(statistics.median(runs["final_metric"]), 4)}
        assert {k: recipe.reached[k] for k in expected} == expected, f"{task}:{name}"


def test_every_task_has_the_four_presets():
    for task, recipes in RECIPES.items():
        assert {"baseline", "mild", "medium", "hot"} <= set(recipes), task


@pytest.mark.parametrize("task, name", ALL, ids=[f"{t}:{n}" for t, n in ALL])
def test_recipe_runs_a_few_steps(tmp_path, task, name):
    require("fashion-mnist" if task == "fashion-mnist" else "python-docs")
    trainer = make_trainer(task, name, duration="3ba", batch_size=16, data_fraction=0.02, eval_fraction=0.02,
                           device="cpu", run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed" and record.steps[-1]["batch"] == 3
    assert record.method_names == [a.name for a in trainer.state.methods]
    assert sorted(record.method_names) == sorted(get_recipe(task, name).methods)
