"""Tasks: a model, its data, its metric and target, and the recipes that fit it.

``task.py`` the ``Task`` object and the registry of tasks by name; ``builtin/`` the built-in tasks, one module
each, defined with the public ``Task`` like a user's; ``recipes.py`` the presets; ``build.py`` the one resolver of a task and
``make_trainer``, where a task and a recipe become a Trainer.
"""
from speedkit.tasks.build import (FOLDER_TASKS, fashion_mnist_torch_loader, find_task, import_attribute, make_trainer,
                                  model_fit_problem, recipe_parts, recipe_target, resolve_task)
from speedkit.tasks.task import TASKS, DataRequest, Task, get_task, register_task

__all__ = ["FOLDER_TASKS", "TASKS", "DataRequest", "Task", "fashion_mnist_torch_loader", "find_task", "get_task",
           "import_attribute", "make_trainer", "model_fit_problem", "recipe_parts", "recipe_target", "register_task",
           "resolve_task"]
