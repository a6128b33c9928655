"""The explorer's run description is a ``speedkit.tasks.RunRequest``: the one the CLI, the benchmark and the
search build too, checked in one place.

Its controls set the request's fields directly (``task``, ``recipe``: the preset the grid starts from,
``methods``, ``model``, ``duration``, ``precision``, ``device``, ``seed``, ``target``), and the explorer holds
``data_fraction``, ``eval_fraction`` and ``eval_interval``. A headless configuration is a dict of those fields.
This module checks such a request (``request_problems``), resolves the recipe it runs (``run_recipe``: named
``<preset>-custom`` once its methods differ from the preset's), and writes it as code and a recipe file.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping

import torch

from speedkit.core import Event, State, Time
from speedkit.core.batch import BatchShapeError, is_dict_batch
from speedkit.core.method import check_compatibility
from speedkit.methods import REGISTRY, build_methods
from speedkit.tasks import get_task, model_fit_problem
from speedkit.tasks.build import planned_on_data
from speedkit.tasks import Recipe, get_recipe
from speedkit.tasks.request import RECIPE_OVERRIDES, RunRequest
from speedkit.tasks.task import DataRequest, Task

# The RunRequest fields the explorer sets: its controls' and the three it holds. The rest (where runs go,
# loggers, stopping at the target) come from the explorer itself.
EXPLORER_FIELDS = ("task", "recipe", "methods", "model", "duration", "precision", "device", "seed", "target",
                   "data_fraction", "eval_fraction", "eval_interval")


def explorer_request(settings: Mapping | RunRequest) -> RunRequest:
    """The RunRequest of a configuration: a dict of ``EXPLORER_FIELDS`` (``{"recipe": "hot", "duration": "1ep"}``),
    or a RunRequest that sets no other field. Another key is refused, naming those taken; a bad value with the
    request's own message."""
    if isinstance(settings, RunRequest):
        unheld = sorted(f.name for f in dataclasses.fields(RunRequest)
                        if f.name not in EXPLORER_FIELDS and getattr(settings, f.name) != _default(f))
        if unheld:
            raise ValueError(f"the explorer does not set {unheld}; a configuration takes {list(EXPLORER_FIELDS)}")
        return settings
    if not isinstance(settings, Mapping):
        raise TypeError(f"a run configuration is a dict of RunRequest fields {list(EXPLORER_FIELDS)}, "
                        f"got {settings!r}")
    unknown = sorted(set(settings) - set(EXPLORER_FIELDS))
    if unknown:
        raise ValueError(f"unknown configuration key(s) {unknown}; a configuration takes {list(EXPLORER_FIELDS)}")
    if "recipe" not in settings:  # where the explorer opens the task, not RunRequest's default
        settings = {**settings, "recipe": default_preset(settings.get("task", "fashion-mnist"))}
    return RunRequest(**settings)


def default_preset(task: str) -> str:
    """The preset the explorer opens a task on: its ``mild``, else its first."""
    recipes = get_task(task).recipes
    return "mild" if "mild" in recipes else next(iter(recipes))


def _default(field: dataclasses.Field):
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


# -- what it resolves to ---------------------------------------------------------------------
def base_recipe(request: RunRequest) -> Recipe:
    """The preset (or recipe file) the request starts from."""
    return get_recipe(request.task, request.recipe)


def is_custom(request: RunRequest) -> bool:
    """True once the methods or their parameters differ from the preset's."""
    return methods_differ(request.methods, base_recipe(request).methods)


def methods_differ(methods: dict | None, preset: dict) -> bool:
    """Whether ``methods`` (None: the preset's own) differ from ``preset``'s, a card default counting as given."""
    return methods is not None and _normalise(methods) != _normalise(preset)


def run_recipe(request: RunRequest) -> Recipe:
    """The recipe the request runs: its preset with the overrides folded in, named ``<preset>-custom`` once its
    methods differ, and claiming nothing the preset reached once anything differs."""
    base = base_recipe(request)
    name = f"{base.name}-custom" if is_custom(request) else base.name
    recipe = base.with_changes(name=name, **{field: getattr(request, field) for field in RECIPE_OVERRIDES})
    if recipe.to_dict() != base.to_dict():  # what the preset reached says nothing about a changed one
        recipe = dataclasses.replace(recipe, reached=None)
    return recipe


def trainer_request(request: RunRequest, **changes) -> RunRequest:
    """The request ``make_trainer`` gets: the resolved recipe in place of the preset and its overrides;
    ``changes`` are more request fields or Trainer keyword arguments (the explorer's ``run_dir``, ``loggers``).
    A rung picked by name is planned on the data as ``speedkit train --recipe hot`` plans it."""
    return request.replace(recipe=run_recipe(request), step_floor=planned_on_data(request),
                           **{field: None for field in RECIPE_OVERRIDES}, **changes)


def request_problems(settings: Mapping | RunRequest) -> list[str]:
    """What stops this configuration (a RunRequest, or a dict of its fields as the controls hold them) from
    running, in words; empty when it can run. The request's own checks and the engine's conflict check
    (``check_compatibility``) say it, not a copy of them."""
    found = []
    try:
        request = explorer_request(settings)
        spec = get_task(request.task)
        recipe = run_recipe(request)
    except (ValueError, TypeError, FileNotFoundError) as e:
        return [str(e)]
    problem = model_fit_problem(spec, recipe.model)  # the check make_trainer runs, not a copy of it
    if problem:
        found.append(problem)
    misfits = method_misfits(spec, recipe.model) if not problem else {}
    for name in recipe.methods:
        reason = unsuitable_reason(name, spec.domain) or misfits.get(name)
        if reason:
            found.append(reason)
    try:
        check_compatibility(build_methods(recipe.methods))
    except (ValueError, TypeError) as e:
        found.append(str(e))
    return found


# -- as text -------------------------------------------------------------------------------
def request_code(request: RunRequest) -> str:
    """A Python snippet that builds and runs this request with the Trainer."""
    args = [repr(request.task), repr(request.recipe), f"methods={run_recipe(request).methods!r}"]
    defaults = {f.name: _default(f) for f in dataclasses.fields(RunRequest)}
    args += [f"{field}={getattr(request, field)!r}" for field in EXPLORER_FIELDS[3:]
             if getattr(request, field) is not None and getattr(request, field) != defaults[field]]
    call = ",\n    ".join(args)
    return ("from speedkit.tasks import make_trainer\n\n"
            f"trainer = make_trainer(\n    {call},\n)\n"
            "record = trainer.fit()\n"
            "print(record.status, record.final_metrics, record.time_to_target)\n")


def unsuitable_reason(method: str, domain: str) -> str | None:
    """Why ``method`` cannot apply to a task of ``domain``, or None when it can."""
    if method not in REGISTRY:
        return f"unknown method {method!r}"
    card_domain = REGISTRY[method].CARD.domain
    if card_domain not in ("any", domain):
        return f"{method} is for {card_domain} models; this task is {domain}"
    return None


def method_misfits(task: Task, model: str) -> dict[str, str]:
    """Methods that cannot act on ``task`` with its model ``model``, with each one's own reason: every INIT
    method of the task's domain is applied, with its card's defaults, to a copy of the model (surgery that
    finds nothing says so); where the task's batches are dicts, each batch method is applied to one of them
    (those that need ``(inputs, targets)`` say so)."""
    return {**dict(_surgery_misfits(task.name, id(task), model)), **dict(_batch_misfits(task.name, id(task), model))}


@functools.lru_cache(maxsize=16)
def _surgery_misfits(task_name: str, task_id: int, model_name: str) -> tuple[tuple[str, str], ...]:
    task = get_task(task_name)
    with torch.random.fork_rng():
        model = task.model(model_name)
    found = []
    for name, cls in REGISTRY.items():
        if Event.INIT not in cls.CARD.events or unsuitable_reason(name, task.domain):
            continue
        state = State(model=copy.deepcopy(model), loss_fn=None, max_duration=Time.from_input("1ep"),
                      device=torch.device("cpu"), precision="fp32", seed=0)
        try:
            cls().apply(Event.INIT, state, None)
        except (ValueError, TypeError, RuntimeError) as e:  # NothingToChangeError is a ValueError
            found.append((name, str(e)))
    return tuple(found)


BATCH_EVENTS = (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.EVAL_AFTER_FORWARD)


@functools.lru_cache(maxsize=16)
def _batch_misfits(task_name: str, task_id: int, model_name: str) -> tuple[tuple[str, str], ...]:
    task = get_task(task_name)
    with torch.random.fork_rng():
        model = task.model(model_name)
        request = DataRequest(batch_size=8, device=torch.device("cpu"), model=model, eval_fraction=0.01,
                              recipe=task.recipes["baseline"])
        batch = next(iter(task.eval_data(request)), None)
    if not is_dict_batch(batch):  # (inputs, targets, ...) batches: every method reads them
        return ()
    found = []
    for name, cls in REGISTRY.items():
        for event in (e for e in BATCH_EVENTS if e in cls.CARD.events and not unsuitable_reason(name, task.domain)):
            state = State(model=model, loss_fn=None, max_duration=Time.from_input("1ep"),
                          device=torch.device("cpu"), precision="fp32", seed=0)
            state.batch = batch
            try:
                with torch.random.fork_rng(), torch.no_grad():
                    cls().apply(event, state, None)
            except BatchShapeError as e:  # the method's own refusal of this batch shape
                found.append((name, str(e)))
                break
            except Exception:  # noqa: BLE001  what a half-made state lacks is not the batch's fault
                continue
    return tuple(found)


def _normalise(methods: dict) -> dict:
    """Methods with every parameter filled in from the card, so defaults compare equal to omissions."""
    return {name: {**{hp.name: hp.default for hp in REGISTRY[name].CARD.hparams}, **(params or {})}
            for name, params in methods.items() if name in REGISTRY}

