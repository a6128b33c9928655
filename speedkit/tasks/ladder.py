"""A domain's speed ladder for a task that brings only its baselines (the folder tasks, a registered Task).

The ladders were found by hand on one task per domain (vision on Fashion-MNIST, language on the Python docs).
Copied as they stand, their budgets are that task's epochs or batches: on a harder data set three epochs
are not three epochs' worth of the work its own baseline needs. So each rung is rebuilt on the new task's
baseline: the rung's methods, optimizer, schedule and batch size, the new baseline's model, and a budget
that is the same fraction of the new baseline's budget as the rung's is of its reference baseline's
(counted in samples, so a larger batch does not buy more data). What a rung reached on its reference task
says nothing about the new one, so nothing of it is carried; ``measure_hint`` says how to find out.

Beside the rungs, such a task gets the baseline a skeptic measures speed-ups against: ``plain-bf16``, its own
baseline with bf16 autocast where it is fast here (``precision: auto``) and the reference's plain-bf16 methods
(channels_last for vision). Without it, a rung's bf16 would be counted as a speed-up of its methods.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math

from speedkit.core.time import Time, TimeUnit
from speedkit.tasks.recipes import Recipe, load_presets

RUNGS = ("mild", "medium", "hot")  # the speed presets of a ladder, slowest first
STRONG_BASELINE = "plain-bf16"  # the rebuilt baseline: the task's own with the lines a competent user adds
# Per domain: the task whose presets are the ladder, and the recipe its budgets are fractions of.
REFERENCES = {"vision": ("fashion-mnist", "baseline"), "language": ("pydocs", "baseline")}


def budget_fraction(rung: Recipe, reference: Recipe) -> float:
    """The rung's training budget as a share of its reference baseline's, in samples seen."""
    rung_time, reference_time = Time.from_input(rung.duration), Time.from_input(reference.duration)
    if rung_time.unit != reference_time.unit:
        raise ValueError(f"ladder rung {rung.name!r} lasts {rung.duration} and its baseline {reference.duration}: "
                         f"give both in the same unit")
    fraction = rung_time.value / reference_time.value
    if rung_time.unit == TimeUnit.BATCH:
        fraction *= rung.batch_size / reference.batch_size
    return fraction


def scaled_budget(baseline: Recipe, fraction: float, batch_size: int) -> str:
    """``fraction`` of ``baseline``'s budget, for runs of ``batch_size``: epochs to the half epoch, batches
    and samples whole (never below one unit)."""
    time = Time.from_input(baseline.duration)
    if time.unit == TimeUnit.EPOCH:
        return f"{max(0.5, math.ceil(2 * time.value * fraction) / 2):g}ep"
    if time.unit == TimeUnit.BATCH:
        return f"{max(1, round(time.value * fraction * baseline.batch_size / batch_size))}ba"
    if time.unit in (TimeUnit.SAMPLE, TimeUnit.TOKEN):
        return f"{max(1, round(time.value * fraction))}{time.unit.value}"
    raise ValueError(f"recipe {baseline.name!r} lasts {baseline.duration}; a ladder scales budgets in ep, ba, sp "
                     f"or tok, not wall-clock time")


def domain_ladder(domain: str, baseline: Recipe) -> dict[str, Recipe]:
    """The domain's rungs (mild, medium, hot) rebuilt on ``baseline``: {} for a domain without a ladder."""
    if domain not in REFERENCES:
        return {}
    task, reference_name = REFERENCES[domain]
    presets = _reference_presets(task)
    reference = presets[reference_name]
    ladder = {}
    for name in RUNGS:
        rung = copy.deepcopy(presets[name])  # the cached preset stays as read, whatever a caller does to its rung
        fraction = budget_fraction(rung, reference)
        duration = scaled_budget(baseline, fraction, rung.batch_size)
        ladder[name] = dataclasses.replace(
            rung, model=baseline.model, duration=duration, eval_interval=_as_many_evaluations(rung, duration),
            task=None, domain=None, target=None, reached=None, adopted_from=f"{task}:{name}",
            summary=f"{task}'s {name} ({rung.summary}) in {fraction:.2f} of this task's baseline budget")
    return ladder


def strong_baseline(domain: str, baseline: Recipe) -> Recipe | None:
    """``baseline`` with bf16 autocast where it is fast and the reference plain-bf16's methods, or None where
    the domain has no reference or the baseline already trains in lower precision (nothing to add)."""
    if domain not in REFERENCES or baseline.precision != "fp32":
        return None
    reference = _reference_presets(REFERENCES[domain][0]).get(STRONG_BASELINE)
    added = copy.deepcopy(reference.methods) if reference else {}
    return dataclasses.replace(
        baseline, name=STRONG_BASELINE, methods={**baseline.methods, **added}, precision="auto", target=None,
        reached=None, adopted_from=f"{REFERENCES[domain][0]}:{STRONG_BASELINE}" if reference else None,
        summary="the baseline with bf16 autocast where it is fast here" + "".join(f" and {m}" for m in added))


@functools.lru_cache(maxsize=None)
def _reference_presets(task: str) -> dict[str, Recipe]:
    """The reference task's presets, read once per process: every Task without rungs builds its ladder from
    them when it is made, and a search or a benchmark makes many."""
    return load_presets(task)


def reference_leave_one_out(domain: str) -> dict[str, float | None]:
    """What each part of the domain's reference preset is worth, from the committed benchmark's leave-one-out:
    part -> time to target without it over time with it (None: the target was not reached without it); {}
    for a domain without a reference or one never ablated. ``speedkit tune`` weighs its moves by it."""
    if domain not in REFERENCES:
        return {}
    for recipe in _reference_presets(REFERENCES[domain][0]).values():
        if (recipe.reached or {}).get("leave_one_out"):
            return dict(recipe.reached["leave_one_out"])
    return {}


def _as_many_evaluations(rung: Recipe, duration: str) -> str:
    """The rung's evaluation interval stretched with its budget, so that it evaluates as often per run."""
    interval, old, new = (Time.from_input(v) for v in (rung.eval_interval, rung.duration, duration))
    if interval is None or not (interval.unit == old.unit == new.unit):
        return rung.eval_interval  # a fraction of the run ("0.1dur"), or units that do not scale together
    value = interval.value * new.value / old.value
    return f"{value:.3g}ep" if interval.unit == TimeUnit.EPOCH else f"{max(1, round(value))}{interval.unit.value}"


def with_ladder(domain: str, recipes: dict[str, Recipe]) -> dict[str, Recipe]:
    """``recipes`` with the domain's ladder on their ``baseline`` added, where they hold none of its rungs
    (a task that ships any rung of its own keeps its own), and its ``plain-bf16`` baseline where it has none."""
    if any(name in recipes for name in RUNGS) or "baseline" not in recipes:
        return dict(recipes)
    strong = None if STRONG_BASELINE in recipes else strong_baseline(domain, recipes["baseline"])
    return {**recipes, **({STRONG_BASELINE: strong} if strong else {}), **domain_ladder(domain, recipes["baseline"])}


def task_flags(task: str, data=None, task_options: dict | None = None) -> str:
    """The command-line flags that name ``task`` again: ``--task``, and a folder's ``--data`` and options."""
    flags = [f"--task {task}"] + ([f"--data {data}"] if data is not None else [])
    options = task_options or {}
    if "image_size" in options:
        flags.append(f"--image-size {options['image_size']}")
    if options.get("skip_unreadable"):
        flags.append("--skip-unreadable")
    if options.get("flips_keep_labels") is False:
        flags.append("--no-flips")
    if options.get("stream"):
        flags.append("--stream")
    return " ".join(flags)


def measure_hint(task: str, recipe: str, data=None, task_options: dict | None = None,
                 baseline: str = "baseline") -> str:
    """The command that measures ``recipe`` against the task's strongest ``baseline`` on one seed: what a run
    of a rung nobody has measured on this task tells the user to run before trusting its speed-up."""
    return f"speedkit bench {task_flags(task, data, task_options)} --recipes {recipe} --baselines {baseline} --seeds 1"


__all__ = ["REFERENCES", "RUNGS", "STRONG_BASELINE", "budget_fraction", "domain_ladder", "measure_hint",
           "reference_leave_one_out", "scaled_budget", "strong_baseline", "task_flags", "with_ladder"]
