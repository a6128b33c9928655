"""RunRequest: one run asked for, as data: a task, a recipe, and what the user changes about them.

Every front end builds one: ``speedkit train`` from its flags, the explorer from its controls, the
benchmark from a profile, the search from its settings; ``make_trainer`` takes it. Its fields are checked
once, here, when it is made, and a refusal names the field and what it takes. What a request does not
name (callbacks, checkpointing, progress bar, ...) goes to the Trainer as ``trainer_options``, whose names
are read from the Trainer's own signature, so neither its arguments nor their defaults are restated here.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
from collections.abc import Mapping
from typing import Any

from speedkit.core.method import show
from speedkit.tasks.recipes import Recipe
from speedkit.tasks.task import Task
from speedkit.train.checks import (check_device, check_duration, check_loggers, check_precision, check_run_name,
                                   check_whole)

# The Trainer arguments a run request fills itself (from the task, the recipe and its own fields).
_FILLED_BY_THE_REQUEST = frozenset({
    "model", "train_dataloader", "eval_dataloader", "evaluators", "max_duration", "optimizers", "schedulers",
    "methods", "precision", "eval_interval", "stop_at", "loss_fn", "device", "seed", "config", "loggers",
    "run_name", "run_dir"})
# The fields that change the recipe (None: the recipe's own).
RECIPE_OVERRIDES = ("model", "methods", "duration", "precision", "batch_size", "eval_interval")


@functools.cache
def trainer_options() -> tuple[str, ...]:
    """The Trainer keyword arguments a request passes on as they are: every one of ``Trainer.__init__``'s
    that the request does not fill itself."""
    from speedkit.train.trainer import Trainer

    names = list(inspect.signature(Trainer.__init__).parameters)[1:]  # without self
    return tuple(n for n in names if n not in _FILLED_BY_THE_REQUEST)


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """One run: ``task`` (a name, a Task, ``"pkg.mod:attr"``, a function; ``data`` and ``task_options`` for a
    folder task or a task function), ``recipe`` (a name, a recipe file, a Recipe), the recipe's fields a
    user overrides (``model``, ``methods``, ``duration``, ``precision``, ``batch_size``, ``eval_interval``;
    None keeps the recipe's), and the run's own settings. ``methods`` is a dict of method -> parameters, a
    list of names or ``"a,b"``, and replaces the recipe's. ``run_dir`` None is the Trainer's default.
    A ladder rung named by the task is never planned shorter than the ladder's step floor (``tasks.ladder``);
    ``step_floor`` applies that to a rung given as a Recipe (the benchmark's, with its budget scaled).
    ``extra_config`` is stored in the RunRecord's config beside the task and recipe. ``trainer_options``
    holds any other Trainer keyword argument (``callbacks``, ``save_checkpoints``, ``autoresume``, ...).
    ``RunRequest.build(task, recipe, **overrides)`` sorts keyword arguments into fields and options;
    ``speedkit.tasks.build.resolved_request`` folds the overrides into the recipe."""

    task: Any = "fashion-mnist"
    recipe: str | Recipe = "baseline"
    data: str | os.PathLike | None = None
    task_options: Mapping[str, Any] | None = None
    model: str | None = None
    methods: Mapping[str, dict] | None = None
    duration: str | None = None
    precision: str | None = None
    batch_size: int | None = None
    eval_interval: str | None = None
    device: str = "auto"
    seed: int = 0
    data_fraction: float = 1.0
    eval_fraction: float | None = None
    target: float | None = None
    stop_at_target: bool = False
    step_floor: bool = False  # a rebuilt rung given as a Recipe is lengthened to the ladder's step floor too
    download: bool = False
    num_workers: int | None = None  # None: picked for the device (core.devices.loader_workers)
    run_name: str | None = None
    run_dir: str | os.PathLike | None = None
    loggers: list | None = None
    extra_config: Mapping[str, Any] | None = None
    trainer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _check_task(self.task)
        if not isinstance(self.recipe, (str, Recipe)):
            raise TypeError(f"recipe must be a recipe's name such as 'mild', a recipe file (.yaml, .json) or a "
                            f"speedkit Recipe, got {_kind(self.recipe)}")
        if self.data is not None and not isinstance(self.data, (str, os.PathLike)):
            raise TypeError(f"data must be a folder (a path) or None, got {_kind(self.data)}")
        self._set("task_options", _mapping("task_options", self.task_options))
        self._set("methods", _methods_dict(self.methods))
        self._check_recipe_overrides()
        check_device(self.device)
        check_whole("seed", self.seed, low=0, high=2**32 - 1)
        _check_fraction("data_fraction", self.data_fraction, optional=False)
        _check_fraction("eval_fraction", self.eval_fraction, optional=True)
        if self.target is not None and (not _is_number(self.target) or not math.isfinite(self.target)):
            raise TypeError(f"target must be a finite number (a value of the task's metric) or None, "
                            f"got {_kind(self.target)}")
        for name in ("stop_at_target", "step_floor", "download"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {_kind(getattr(self, name))}")
        if self.num_workers is not None:
            check_whole("num_workers", self.num_workers, low=0)
        check_run_name(self.run_name)
        if self.run_dir is not None and not isinstance(self.run_dir, (str, os.PathLike)):
            raise TypeError(f"run_dir must be a path (str or os.PathLike) or None, got {_kind(self.run_dir)}")
        if self.loggers is not None:
            check_loggers(self.loggers)
            self._set("loggers", list(self.loggers))
        self._set("extra_config", _mapping("extra_config", self.extra_config))
        self._set("trainer_options", _check_trainer_options(self.trainer_options))

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # a frozen dataclass, normalised once when made

    def _check_recipe_overrides(self) -> None:
        if self.model is not None and not isinstance(self.model, str):
            raise TypeError(f"model must be a model's name (see speedkit.models.list_models()) or None, "
                            f"got {_kind(self.model)}")
        check_duration("duration", self.duration, optional=True, fraction_ok=False)
        check_duration("eval_interval", self.eval_interval, optional=True, fraction_ok=True)
        check_precision("precision", self.precision, optional=True)
        if self.batch_size is not None:
            check_whole("batch_size", self.batch_size)

    # -- making one ---------------------------------------------------------------------------
    @classmethod
    def build(cls, task: Any = "fashion-mnist", recipe: str | Recipe = "baseline", **overrides) -> "RunRequest":
        """A request from keyword arguments: each is a field, or a Trainer keyword argument (which goes to
        ``trainer_options``); any other name is refused, naming both lists."""
        fields, options = _sort_settings(overrides)
        given = fields.pop("trainer_options", None) or {}
        return cls(task=task, recipe=recipe, **fields, trainer_options={**given, **options})

    def replace(self, **changes) -> "RunRequest":
        """A copy with some fields or Trainer keyword arguments changed (as for ``build``), checked again."""
        fields, options = _sort_settings(changes)
        if options:
            fields["trainer_options"] = {**fields.get("trainer_options", self.trainer_options), **options}
        return dataclasses.replace(self, **fields)


def _sort_settings(settings: dict) -> tuple[dict, dict]:
    """(request fields, Trainer keyword arguments) of ``settings``; a name that is neither is refused."""
    fields = {f.name for f in dataclasses.fields(RunRequest)}
    unknown = sorted(set(settings) - fields - set(trainer_options()))
    if unknown:
        taken = sorted(fields - {"trainer_options"})
        raise TypeError(f"unknown run setting(s) {unknown}: a run request takes {taken}, "
                        f"and the Trainer's own keyword arguments {sorted(trainer_options())}")
    return ({k: v for k, v in settings.items() if k in fields},
            {k: v for k, v in settings.items() if k not in fields})


# -- checks of single fields --------------------------------------------------------------------
def _kind(value: Any) -> str:
    return f"{type(value).__name__} {show(value)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_task(task: Any) -> None:
    if not (isinstance(task, (str, Task)) or callable(task)):
        raise TypeError(f"task must be a task's name such as 'fashion-mnist', a speedkit Task, "
                        f"'package.module:attr' naming one, or a function returning one; got {_kind(task)}")


def _check_fraction(name: str, value: Any, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not _is_number(value):
        raise TypeError(f"{name} must be a number in (0, 1]{' or None' if optional else ''}, got {_kind(value)}")
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {show(value)}")


def _mapping(name: str, value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict or None, got {_kind(value)}")
    return dict(value)


def _methods_dict(methods: Any) -> dict | None:
    """``methods`` as method -> parameters: from a dict, a list of names, or ``"a,b"`` ("" for none)."""
    if methods is None:
        return None
    if isinstance(methods, Mapping):
        return {name: dict(params or {}) for name, params in methods.items()}
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    if not isinstance(methods, (list, tuple)) or not all(isinstance(m, str) for m in methods):
        raise TypeError(f"methods must be a dict of method -> parameters, a list of names or 'a,b', "
                        f"got {_kind(methods)}")
    return {name: {} for name in methods}


def _check_trainer_options(options: Any) -> dict:
    options = _mapping("trainer_options", options) or {}
    filled = sorted(set(options) & _FILLED_BY_THE_REQUEST)
    if filled:
        raise TypeError(f"trainer_options {filled}: a run request fills these itself; set them as its fields "
                        f"(or in the recipe) instead")
    unknown = sorted(set(options) - set(trainer_options()))
    if unknown:
        raise TypeError(f"trainer_options {unknown} are not Trainer keyword arguments; it takes "
                        f"{sorted(trainer_options())}")
    return options
