"""Tasks into runs: the one resolver of a task (a name, a ``Task``, ``"pkg.mod:attr"``, a function, a folder),
and where recipes become Trainer arguments. ``Task``, the registry and the recipe resolver ``get_recipe`` are in
``speedkit.tasks.task``, the built-in tasks in ``speedkit.tasks.builtin``.

The CLI, the demo, the notebooks and the benchmark all build their runs through ``make_trainer``,
so a configuration means the same thing everywhere. A hand-built Trainer takes a recipe's parts from
``recipe_parts``: the Trainer itself takes parts, never recipes, so a recipe is resolved here only.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from speedkit.core.batch import call_model, to_device
from speedkit.core.devices import resolve_device
from speedkit.methods import build_methods
from speedkit.optim.factory import make_optimizer_factory
from speedkit.record.metrics import Evaluator
from speedkit.tasks.recipes import Recipe
from speedkit.tasks.task import FOLDER_TASKS, TASKS, DataRequest, Task, get_recipe, import_attribute, register_task
from speedkit.train.checks import check_first_outputs, describe
from speedkit.train.trainer import Trainer


# -- tasks: one resolver for every entry point --------------------------------------------------
def resolve_task(task, data=None, **options) -> Task:
    """The Task that ``task`` names (see ``find_task``), registered so that its name works everywhere afterwards."""
    return register_task(find_task(task, data, **options), replace=True)


def find_task(task, data=None, **options) -> Task:
    """The Task that ``task`` names, not registered (``make_trainer`` registers it once the run is built).

    ``task`` is a Task, a registered name (``"fashion-mnist"``), a folder task's name with ``data`` (the
    folder: ``"image-folder"``, ``"text-folder"``), ``"package.module:attr"`` naming a Task or a function
    returning one, or such a function itself (called with ``data=`` when ``data`` is given). ``options`` go
    to a folder task's function (``image_size=64``) or the user's.
    """
    if isinstance(task, Task):
        _refuse_data(data, options, f"task object {task.name!r}")
        return task
    if isinstance(task, str) and task in FOLDER_TASKS:
        if data is None:
            raise ValueError(f"task {task!r} trains on your files: give the folder (--data DIR, or data=DIR)")
        return FOLDER_TASKS[task](data, **options)
    if isinstance(task, str) and task in TASKS:
        _refuse_data(data, options, f"task {task!r}")
        return TASKS[task]
    if isinstance(task, str) and ":" in task:
        return find_task(import_attribute(task), data, **options)
    if callable(task):
        made = task(data=data, **options) if data is not None else task(**options)
        if not isinstance(made, Task):
            raise TypeError(f"task function {getattr(task, '__qualname__', task)!r} returned {type(made).__name__}, "
                            f"not a speedkit.Task")
        return made
    raise ValueError(f"unknown task {task!r}; give one of {sorted({*TASKS, *FOLDER_TASKS})}, a speedkit.Task, "
                     f"'package.module:attr' naming one, or a function returning one")


def _refuse_data(data, options: dict, what: str) -> None:
    if options:
        raise ValueError(f"{what} is made already, so the options {sorted(options)} would be ignored; they are for "
                         f"{sorted(FOLDER_TASKS)} and for task functions")
    if data is not None:
        raise ValueError(f"{what} loads its own data, so data={str(data)!r} would be ignored; --data DIR is for "
                         f"{sorted(FOLDER_TASKS)} and for task functions that take data=")


def model_fit_problem(task: Task, model: str) -> str | None:
    """Why ``model`` does not fit the task's data (channels, classes, vocabulary), or None when it does."""
    return task.model_fit_problem(model)


# -- recipes into Trainer arguments -------------------------------------------------------------
def recipe_parts(recipe: str | Recipe, model: torch.nn.Module | None = None, *,
                 max_duration: str | None = None, optimizers=None, schedulers=None, methods=None,
                 precision: str | None = None, loggers=None, config: dict | None = None) -> dict:
    """The Trainer arguments a recipe supplies, with the ones given here winning over the recipe's.

    ``recipe`` is a Recipe, ``"task:name"`` or a bare name picked by ``model``'s domain (vision or
    language): ``Trainer(model, data, **recipe_parts("mild", model, max_duration="2ep"))``.
    """
    recipe = get_recipe(None, recipe, model=model)
    return {"max_duration": max_duration or recipe.duration,
            "optimizers": optimizers or make_optimizer_factory(recipe.optimizer),
            "schedulers": recipe.schedule if schedulers is None else schedulers,
            "methods": build_methods(recipe.methods) if methods is None else methods,
            "precision": precision or recipe.precision,
            "loggers": list(recipe.loggers) if loggers is None else loggers,
            "config": {"recipe": recipe.name, "recipe_spec": recipe.to_dict(), **(config or {})}}


# -- the one way to build a run -----------------------------------------------------------------
def make_trainer(task: str | Task = "fashion-mnist", recipe: str | Recipe = "baseline", *, data=None,
                 task_options: dict | None = None,
                 model: str | None = None, duration: str | None = None, methods: Any = None,
                 precision: str | None = None, batch_size: int | None = None, eval_interval: str | None = None,
                 device: str = "auto", seed: int = 0, data_fraction: float = 1.0,
                 eval_fraction: float | None = None, target: float | None = None, stop_at_target: bool = False,
                 download: bool = False, num_workers: int = 0, extra_config: dict | None = None,
                 **trainer_kwargs) -> Trainer:
    """A Trainer for ``task`` configured by ``recipe``; keyword arguments override the recipe's fields.

    ``task`` is anything ``resolve_task`` takes (a name, a Task, ``"pkg.mod:attr"``, a function); ``data``
    is the folder of a folder task, ``task_options`` its options (``{"image_size": 64}``). ``extra_config`` is stored in the RunRecord's config beside the task and
    recipe (the benchmark marks seeds and leave-one-out runs this way).
    """
    if not 0 < data_fraction <= 1:
        raise ValueError(f"data_fraction must be in (0, 1], got {data_fraction}")
    spec = find_task(task, data, **(task_options or {}))
    recipe = get_recipe(spec, recipe).with_changes(model=model, duration=duration, precision=precision,
                                                        batch_size=batch_size, eval_interval=eval_interval)
    if methods is not None:
        recipe = recipe.with_changes(methods=_methods_dict(methods))
    problem = model_fit_problem(spec, recipe.model)
    if problem:
        raise ValueError(problem)
    device = resolve_device(device)
    torch.manual_seed(seed)  # the same initial weights for every recipe with the same seed
    net = spec.model(recipe.model)
    request = DataRequest(batch_size=recipe.batch_size, device=device, seed=seed, data_fraction=data_fraction,
                          eval_fraction=eval_fraction, recipe=recipe, model=net, download=download,
                          num_workers=num_workers)
    train = spec.train_data(request)
    evaluators = [Evaluator(spec.eval_data(request), dict(spec.metrics()))]
    check_model_fits_data(spec, net, evaluators[0].dataloader)
    target_value = target if target is not None else recipe_target(spec, recipe)
    config = {"task": spec.name, "data_fraction": data_fraction,
              "target": {"metric": spec.target_metric, "value": target_value}, **(extra_config or {})}
    trainer = Trainer(
        net, train, evaluators=evaluators, device=device, seed=seed,
        **recipe_parts(recipe, net, config=config, loggers=trainer_kwargs.pop("loggers", None)),
        eval_interval=recipe.eval_interval, stop_at=(spec.target_metric, target_value) if stop_at_target else None,
        loss_fn=spec.loss, **trainer_kwargs)
    trainer.record.target = {"metric": spec.target_metric, "value": target_value}
    register_task(spec, replace=True)  # built: its name and recipes now work everywhere (not before: a refused
    return trainer                     # task stays out of the explorer's list)


def check_model_fits_data(task: Task, model: torch.nn.Module, eval_data) -> None:
    """One evaluation batch through the fresh model, so that a model whose outputs do not fit the task's
    labels is refused when the run is built, naming both, rather than when it starts training."""
    device = next(model.parameters(), torch.empty(0)).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # training's draws stay put
        batch = next(iter(eval_data), None)
        if batch is None:
            raise ValueError(f"task {task.name!r}: its evaluation data yielded no batches; eval_data(request) "
                             f"must return at least one batch")
        batch = to_device(batch, device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                outputs = call_model(model, batch)
        except Exception as e:
            raise ValueError(f"task {task.name!r}: its model {type(model).__name__} cannot take its data: it raised "
                             f"{type(e).__name__} on the batch {describe(batch)}: {e}") from e
        finally:
            model.train(was_training)
    default_loss = task.loss is None and not callable(getattr(model, "loss", None))  # the Trainer's cross-entropy
    try:
        check_first_outputs(SimpleNamespace(batch=batch, outputs=outputs, model=model), default_loss=default_loss)
    except (ValueError, TypeError) as e:
        raise type(e)(f"task {task.name!r}: {e}") from e


def recipe_target(spec: Task, recipe: Recipe) -> float:
    """The target a run of ``recipe`` is measured against: the one it was tuned for, else the task's."""
    if recipe.target is None:
        return spec.target_value
    if recipe.target["metric"] != spec.target_metric:
        raise ValueError(f"recipe {recipe.name!r} targets {recipe.target['metric']}, but task {spec.name!r} "
                         f"measures {spec.target_metric}; set the recipe's target metric to {spec.target_metric!r}")
    return recipe.target["value"]


def _methods_dict(methods) -> dict:
    if isinstance(methods, dict):
        return methods
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    return {name: {} for name in methods}
