"""Task: a model, its data, its metrics and target, and the recipes that fit it, as one public object.

The built-in tasks (``speedkit.tasks.builtin``) are defined with it and take no special path, so a
user's task runs wherever theirs do: ``make_trainer(task, recipe)``, ``speedkit train --task``,
``speedkit bench``, the explorer, ``speedkit tune`` and the notebooks. ``register_task`` makes a task
known by name (and its recipes by ``get_recipe(task.name, ...)``).
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Callable, Iterable, Mapping

import torch

from speedkit.core.method import check_free_name, show
from speedkit.record.metrics import Metric
from speedkit.tasks.recipes import BASELINES, DOMAINS, RECIPES, Recipe


@dataclasses.dataclass(frozen=True)
class DataRequest:
    """What a task's data factories are asked for. ``model`` is the run's model, built before the data
    (a language task reads its context length); ``recipe`` carries the input pipeline (augmentation, loader)."""

    batch_size: int
    device: torch.device
    seed: int = 0
    data_fraction: float = 1.0  # train on this class-balanced or leading share of the training data
    eval_fraction: float | None = None  # None: the whole evaluation set
    recipe: Recipe | None = None
    model: torch.nn.Module | None = None
    download: bool = False
    num_workers: int = 0


@dataclasses.dataclass(frozen=True)
class Task:
    """A training problem the toolkit can run, measure and tune.

    ``model(name)`` builds the model a recipe names (``recipe.model``); ``models`` lists the names it
    accepts, shell patterns allowed (``"torchvision:*"``), the first being the default. ``train_data`` and
    ``eval_data`` take a :class:`DataRequest` and return an iterable of batches (a DataLoader, a list, ...)
    in any shape ``speedkit.core.batch`` reads: ``(inputs, targets)``, ``(inputs, targets, extra...)`` or a
    dict. ``metrics()`` returns fresh metrics by name; ``target_metric`` is ``"eval/<one of them>"``.
    ``loss(outputs, targets)`` is optional: by default the model's own ``loss`` or cross-entropy.
    ``recipes`` must hold a ``"baseline"`` whose ``task`` is this task's name.
    """

    name: str
    domain: str  # "vision" or "language": which methods and preset recipes suit it
    model: Callable[[str], torch.nn.Module]
    train_data: Callable[[DataRequest], Iterable]
    eval_data: Callable[[DataRequest], Iterable]
    metrics: Callable[[], Mapping[str, Metric]]
    target_metric: str
    target_value: float
    recipes: Mapping[str, Recipe]
    loss: Callable | None = None
    summary: str = ""
    models: tuple[str, ...] = ()  # empty: the models its recipes name
    baselines: tuple[str, ...] = ("baseline",)  # the recipes speed-ups are measured against, weakest first

    def __post_init__(self):
        where = f"task {show(self.name)}"
        if not isinstance(self.name, str) or not self.name.strip() or ":" in self.name:
            raise ValueError(f"{where}: name must be a non-empty string without ':' (that marks 'module:attr')")
        if self.domain not in DOMAINS:
            raise ValueError(f"{where}: domain must be one of {DOMAINS}, got {show(self.domain)}")
        for field in ("model", "train_data", "eval_data", "metrics"):
            if not callable(getattr(self, field)):
                raise TypeError(f"{where}: {field} must be a function, got {show(getattr(self, field))}")
        if self.loss is not None and not callable(self.loss):
            raise TypeError(f"{where}: loss must be a function loss(outputs, targets) or None, got {show(self.loss)}")
        self._check_target(where)
        self._check_recipes(where)
        if not self.models:
            object.__setattr__(self, "models", tuple(dict.fromkeys(r.model for r in self.recipes.values())))

    def _check_target(self, where: str) -> None:
        metrics = self.metrics()
        if not isinstance(metrics, Mapping) or not metrics:
            raise TypeError(f"{where}: metrics() must return a dict {{name: Metric}}, got {show(metrics)}")
        allowed = [f"eval/{name}" for name in metrics]
        if self.target_metric not in allowed:
            raise ValueError(f"{where}: target_metric {show(self.target_metric)} is not one of its metrics "
                             f"{allowed}; name one of them")
        if isinstance(self.target_value, bool) or not isinstance(self.target_value, (int, float)):
            raise TypeError(f"{where}: target_value must be a number, got {show(self.target_value)}")

    def _check_recipes(self, where: str) -> None:
        if not isinstance(self.recipes, Mapping) or "baseline" not in self.recipes:
            raise ValueError(f"{where}: recipes must be a dict holding a 'baseline' Recipe, got {show(self.recipes)}")
        for key, recipe in self.recipes.items():
            if not isinstance(recipe, Recipe):
                raise TypeError(f"{where}: recipes[{key!r}] must be a speedkit.tasks.recipes.Recipe, got {show(recipe)}")
            if recipe.task != self.name or recipe.domain != self.domain or recipe.name != key:
                raise ValueError(f"{where}: recipes[{key!r}] says name={recipe.name!r}, task={recipe.task!r}, "
                                 f"domain={recipe.domain!r}; it must say name={key!r}, task={self.name!r}, "
                                 f"domain={self.domain!r}")
        missing = [b for b in self.baselines if b not in self.recipes]
        if missing:
            raise ValueError(f"{where}: baselines {missing} are not among its recipes {sorted(self.recipes)}")

    # -- what menus show and what make_trainer checks ------------------------------------------
    @property
    def model_names(self) -> list[str]:
        """The models to offer by name (patterns such as ``"torchvision:*"`` left out)."""
        return [m for m in self.models if not _is_pattern(m)]

    def model_fit_problem(self, model: str) -> str | None:
        """Why the model named ``model`` does not fit this task's data, or None when it does."""
        if any(fnmatch.fnmatchcase(model, accepted) for accepted in self.models):
            return None
        return f"model {model!r} does not fit task {self.name!r}; use one of {list(self.models)}"


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


# -- the registry: name -> Task ------------------------------------------------------------------
TASKS: dict[str, Task] = {}
BUILT_IN: set[str] = set()  # names a user's task may not take over


def register_task(task: Task, *, replace: bool = False, built_in: bool = False) -> Task:
    """Make ``task`` known by its name everywhere a task name is accepted; returns it.

    A different task under a taken name is refused unless ``replace=True``; built-in names are never replaced.
    """
    if not isinstance(task, Task):
        raise TypeError(f"register_task takes a speedkit.Task, got {show(task)}")
    check_free_name("task", task.name, TASKS.get(task.name), task, BUILT_IN, replace, rename="your task")
    TASKS[task.name] = task
    # The task's own dict where it is one, so RECIPES[name] and task.recipes stay the same object (a recipe
    # added to either is seen by both; the built-in tasks' recipes are RECIPES' own dicts).
    RECIPES[task.name] = task.recipes if isinstance(task.recipes, dict) else dict(task.recipes)
    BASELINES[task.name] = tuple(task.baselines)
    if built_in:
        BUILT_IN.add(task.name)
    return task


def get_task(name: str) -> Task:
    """A registered task by name (``speedkit.tasks.resolve_task`` also takes objects, modules and folders)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    return TASKS[name]
