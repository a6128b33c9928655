"""Tasks: a model, its data, its metric and target, and the recipes that fit it.

``task.py`` the ``Task`` object and the registry of tasks by name; ``builtin.py`` the built-in tasks, defined
with the public ``Task`` like a user's; ``recipes.py`` the presets; ``build.py`` the one resolver of a task and
``make_trainer``, where a run request (``request.py``: ``RunRequest``, a task, a recipe and what a user changes)
becomes a Trainer.
"""
from speedkit.tasks.build import (FOLDER_TASKS, fashion_mnist_torch_loader, find_task, import_attribute, make_trainer,
                                  model_fit_problem, recipe_parts, recipe_target, resolve_task)
from speedkit.tasks.request import RunRequest
from speedkit.tasks.task import TASKS, DataRequest, Task, get_task, register_task

__all__ = ["FOLDER_TASKS", "TASKS", "DataRequest", "Task", "fashion_mnist_torch_loader", "find_task", "get_task",
           "import_attribute", "make_trainer", "model_fit_problem", "recipe_parts", "recipe_target", "register_task",
           "resolve_task", "RunRequest"]
