"""The one registry of tasks: the built-in tasks known by name without an import side effect, a registered task
bringing its recipes and baselines with it and touching nothing else, and ``get_recipe``, the one recipe resolver."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import speedkit
from speedkit.record.metrics import Accuracy
from speedkit.tasks import TASKS, Recipe, get_recipe, get_task, is_baseline, register_task
from speedkit.tasks.recipes import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def tiny_task(name: str) -> speedkit.Task:
    """A task that is never trained here: its recipes and baselines are what the registry is asked about."""
    baseline = Recipe(name="baseline", model="linear", duration="1ba", batch_size=4, optimizer={"name": "sgd"})
    quick = baseline.with_changes(name="quick", methods={"label_smoothing": {"smoothing": 0.1}})
    return speedkit.Task(name=name, domain="vision", model=lambda _: torch.nn.Linear(2, 2),
                         train_data=lambda request: [], eval_data=lambda request: [],
                         metrics=lambda: {"accuracy": Accuracy()}, target_metric="eval/accuracy", target_value=0.5,
                         recipes={"baseline": baseline, "quick": quick}, baselines=("baseline", "quick"))


def module_state() -> dict:
    """Every module-level dict, list and set in speedkit, by module and name: what a registration could edit."""
    return {(name, attr): sorted(map(repr, value)) for name, module in list(sys.modules.items())
            if name.startswith("speedkit") and module is not None
            for attr, value in vars(module).items() if type(value) in (dict, list, set)}


def test_registering_a_task_touches_nothing_but_the_registry():
    before = module_state()
    task = register_task(tiny_task("registered-here"))
    assert module_state() == before  # no other module's dicts (recipes, baselines) were edited
    assert get_task("registered-here") is task and list(TASKS)[-1] == "registered-here"
    assert get_recipe("registered-here", "quick").task == "registered-here"  # its recipes come with it
    assert is_baseline("registered-here", "quick") and not is_baseline("fashion-mnist", "quick")
    with pytest.raises(ValueError, match="'pydocs' is built in; give your task another name"):
        register_task(tiny_task("pydocs"))


def test_the_built_in_tasks_are_known_in_a_fresh_interpreter_before_any_is_imported():
    """Nothing has to be imported to fill the registry: it knows the built-in tasks by name, and imports one's
    module where it is first asked for."""
    code = "\n".join([
        "import sys",
        "from speedkit.tasks.task import TASKS, get_recipe",
        "assert not any(m.startswith('speedkit.tasks.builtin') for m in sys.modules), 'imported on import'",
        "assert {'fashion-mnist', 'pydocs'} <= set(TASKS), list(TASKS)",
        "assert 'speedkit.tasks.builtin.pydocs' not in sys.modules, 'listing the names imported the tasks'",
        "print(TASKS['pydocs'].baselines, get_recipe('fashion-mnist', 'hot').duration)",
    ])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["('baseline',", "'tuned')", "2.5ep"]


def test_a_recipe_file_holds_one_recipe_or_several_named_ones(tmp_path):
    preset_file = PRESETS / "fashion-mnist.yaml"
    with pytest.raises(ValueError, match=r"holds the recipes \['baseline', .*'hot'\]; name one as '.*:baseline'"):
        get_recipe("fashion-mnist", str(preset_file))
    hot = get_recipe("fashion-mnist", f"{preset_file}:hot")
    assert hot.to_dict() == get_recipe("fashion-mnist", "hot").to_dict() | {"reached": None}
    with pytest.raises(ValueError, match=r"has no recipe 'warm'; it holds \['baseline'"):
        get_recipe("fashion-mnist", f"{preset_file}:warm")
    vision_only = tmp_path / "vision.yaml"
    vision_only.write_text(hot.to_yaml().replace("task: fashion-mnist\n", ""))
    with pytest.raises(ValueError, match="recipe file .* is for vision tasks, but 'pydocs' is a language task"):
        get_recipe("pydocs", str(vision_only))
    one = tmp_path / "mine.yaml"
    one.write_text(hot.to_yaml())  # what to_yaml writes is a file of one recipe, saying whose it is
    assert Recipe.from_file(one).to_dict() == hot.to_dict()
    with pytest.raises(ValueError, match="is for task 'fashion-mnist', not 'pydocs'"):
        get_recipe("pydocs", str(one))
    two = tmp_path / "two.yaml"
    two.write_text(hot.to_yaml() + "---\n" + hot.to_yaml())
    with pytest.raises(ValueError, match="recipe 2: a second recipe named 'hot'"):
        get_recipe("fashion-mnist", f"{two}:hot")


def test_one_resolver_for_names_task_names_and_models():
    from speedkit.models import get_model

    assert get_recipe(None, "hot", model=get_model("resnet8")).task == "fashion-mnist"  # picked by the domain
    assert get_recipe(None, "hot", model=get_model("gpt-nano")).task == "pydocs"
    assert get_recipe(None, "pydocs:tuned").name == "tuned"
    with pytest.raises(ValueError, match="is for language models, but SmallResNet is a vision model"):
        get_recipe(None, "pydocs:hot", model=get_model("resnet8"))
    with pytest.raises(ValueError, match="more than one  recipe named 'baseline'"):
        get_recipe(None, "baseline")
    with pytest.raises(ValueError, match="recipe 'pydocs:hot' is task 'pydocs''s, not 'fashion-mnist''s"):
        get_recipe("fashion-mnist", "pydocs:hot")
    with pytest.raises(ValueError, match=r"unknown recipe 'warm' for fashion-mnist; known: \['baseline'"):
        get_recipe("fashion-mnist", "warm")
    with pytest.raises(ValueError, match="unknown task 'cifar'"):
        get_recipe("cifar", "hot")
