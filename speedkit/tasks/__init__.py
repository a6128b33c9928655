"""Tasks: a model, its data, its metric and target, and the recipes that fit it.

``task.py`` the ``Task`` object, the one registry of tasks by name (the built-in ones known by name, imported
when first used) and ``get_recipe``, the one recipe resolver; ``builtin/`` the built-in tasks, one module each,
defined with the public ``Task`` like a user's; ``recipes.py`` the ``Recipe`` and its file format;
``presets/`` the built-in tasks' recipe files and what they reached; ``build.py`` the one resolver of a task
and ``make_trainer``, where a run request (``request.py``: ``RunRequest``, a task, a recipe and what a user
changes) becomes a Trainer.
"""
from speedkit.tasks.build import (find_task, make_trainer, model_fit_problem, recipe_parts, recipe_target,
                                  resolve_task)
from speedkit.tasks.recipes import Recipe
from speedkit.tasks.request import RunRequest
from speedkit.tasks.task import (FOLDER_TASKS, TASKS, DataRequest, Task, get_recipe, get_task, import_attribute,
                                 is_baseline, register_task)

__all__ = ["FOLDER_TASKS", "TASKS", "DataRequest", "Recipe", "Task", "find_task", "get_recipe", "get_task",
           "import_attribute", "is_baseline", "make_trainer", "model_fit_problem", "recipe_parts", "recipe_target",
           "register_task", "resolve_task", "RunRequest"]
