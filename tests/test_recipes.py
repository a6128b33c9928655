"""Recipes load, validate against the method cards, and run a few steps on their task's real data."""
from __future__ import annotations

import pytest

from speedkit.algorithms import build_algorithms
from speedkit.recipes import RECIPES, get_recipe
from speedkit.tasks import make_trainer

from helpers import needs_fmnist, needs_python_docs

ALL = [(task, name) for task, recipes in RECIPES.items() for name in recipes]


@pytest.mark.parametrize("task, name", ALL, ids=[f"{t}:{n}" for t, n in ALL])
def test_recipe_validates(task, name):
    recipe = get_recipe(task, name)
    assert recipe.task == task and recipe.name == name and recipe.summary
    build_algorithms(recipe.methods)  # every method exists and its parameters fit its card


def test_every_task_has_the_four_presets():
    for task, recipes in RECIPES.items():
        assert {"baseline", "mild", "medium", "hot"} <= set(recipes), task


@pytest.mark.parametrize("task, name", ALL, ids=[f"{t}:{n}" for t, n in ALL])
def test_recipe_runs_a_few_steps(tmp_path, task, name):
    marks = needs_fmnist if task == "fashion-mnist" else needs_python_docs
    if marks.args[0]:
        pytest.skip(marks.kwargs["reason"])
    trainer = make_trainer(task, name, duration="3ba", batch_size=16, data_fraction=0.02, eval_fraction=0.02,
                           device="cpu", run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed" and record.steps[-1]["batch"] == 3
    assert record.method_names == [a.name for a in trainer.state.algorithms]
    assert sorted(record.method_names) == sorted(get_recipe(task, name).methods)
