"""RunConfig: what the explorer's controls describe, as plain data.

A configuration starts from a recipe preset (optimizer, schedule, input pipeline) and may change
its methods, their parameters and the run's settings. It turns into a ``speedkit.tasks.RunRequest``
(what the CLI, the benchmark and the search build too, checked in one place) and through
``make_trainer`` into a Trainer, into code a user can paste, and into a recipe file.
"""
from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from speedkit.core import Event, State, Time
from speedkit.core.batch import BatchShapeError, is_dict_batch
from speedkit.core.method import check_compatibility
from speedkit.methods import REGISTRY, build_methods
from speedkit.tasks import get_task, model_fit_problem
from speedkit.tasks import Recipe, get_recipe
from speedkit.tasks.request import RunRequest
from speedkit.tasks.task import DataRequest, Task


@dataclasses.dataclass
class RunConfig:
    task: str = "fashion-mnist"
    recipe: str = "mild"  # the preset this configuration starts from
    methods: dict | None = None  # method -> params; None keeps the preset's methods
    model: str | None = None
    duration: str | None = None
    device: str = "auto"
    precision: str | None = None
    seed: int = 0
    target: float | None = None
    data_fraction: float = 1.0
    eval_fraction: float | None = None
    eval_interval: str | None = None
    name: str | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        """From a notebook parameter such as ``{"recipe": "hot", "duration": "1ep"}``; unknown keys are errors."""
        if not isinstance(data, dict):
            raise TypeError(f"a run configuration is a dict of RunConfig fields, got {data!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown configuration key(s) {unknown}; a configuration takes {sorted(fields)}")
        return cls(**data)

    # -- what it resolves to -----------------------------------------------------------------
    def base_recipe(self) -> Recipe:
        return get_recipe(self.task, self.recipe)

    def resolved_methods(self) -> dict:
        return dict(self.base_recipe().methods if self.methods is None else self.methods)

    @property
    def is_custom(self) -> bool:
        """True once the methods or their parameters differ from the preset's."""
        return self.methods is not None and _normalise(self.methods) != _normalise(self.base_recipe().methods)

    def to_recipe(self) -> Recipe:
        name = f"{self.recipe}-custom" if self.is_custom else self.recipe
        base = self.base_recipe()
        recipe = base.with_changes(name=name, methods=self.resolved_methods(), model=self.model,
                                   duration=self.duration, precision=self.precision,
                                   eval_interval=self.eval_interval)
        if recipe.to_dict() != base.to_dict():  # what the preset reached says nothing about a changed one
            recipe = dataclasses.replace(recipe, reached=None)
        return recipe

    def problems(self) -> list[str]:
        """What stops this configuration from running, in words; empty when it can run.

        Conflicts come from the engine's own check (``check_compatibility``), not a copy of it.
        """
        found = []
        try:
            spec = get_task(self.task)
            recipe = self.to_request().recipe  # the request's own checks of every setting, not a copy of them
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

    def to_request(self, **changes) -> RunRequest:
        """The RunRequest this configuration asks for; ``changes`` are more request fields or Trainer keyword
        arguments (the explorer's ``run_dir`` and ``loggers``)."""
        return RunRequest.build(self.task, self.to_recipe(), **self._run_settings(), **changes)

    def make_trainer(self, **changes):
        """The Trainer for this configuration (``changes`` as for ``to_request``)."""
        from speedkit.tasks import make_trainer

        problems = self.problems()
        if problems:
            raise ValueError("this configuration cannot run: " + "; ".join(problems))
        return make_trainer(self.to_request(**changes))

    def _run_settings(self) -> dict:
        args = {"device": self.device, "seed": self.seed, "data_fraction": self.data_fraction,
                "eval_fraction": self.eval_fraction, "target": self.target, "run_name": self.name}
        return {k: v for k, v in args.items() if v is not None}

    # -- as text -----------------------------------------------------------------------------
    def to_code(self) -> str:
        """A Python snippet that builds and runs this configuration with the Trainer."""
        recipe = self.to_recipe()
        args = [repr(self.task), repr(self.recipe)]
        changes = {"methods": recipe.methods, "model": self.model, "duration": self.duration,
                   "precision": self.precision, "eval_interval": self.eval_interval}
        args += [f"{k}={v!r}" for k, v in changes.items() if v is not None]
        args += [f"{k}={v!r}" for k, v in self._run_settings().items()]
        call = ",\n    ".join(args)
        return ("from speedkit.tasks import make_trainer\n\n"
                f"trainer = make_trainer(\n    {call},\n)\n"
                "record = trainer.fit()\n"
                "print(record.status, record.final_metrics, record.time_to_target)\n")

    def to_recipe_yaml(self) -> str:
        return self.to_recipe().to_yaml()


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

