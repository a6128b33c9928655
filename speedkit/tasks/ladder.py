"""A domain's speed ladder for a task that brings only its baselines (the folder tasks, a registered Task).

The ladders were found by hand on one task per domain (vision on Fashion-MNIST, language on the Python docs).
Copied as they stand, their budgets are that task's epochs or batches: on a harder data set three epochs
are not three epochs' worth of the work its own baseline needs. So each rung is rebuilt on the new task's
baseline: the rung's methods and schedule; the new baseline's model and optimizer (see :func:`rung_optimizer`
for its lr and the batch size); and a budget that is the same fraction of the new baseline's budget as the
rung's is of its reference baseline's (counted in samples, so a larger batch does not buy more data). What a
rung reached on its reference task says nothing about the new one, so nothing of it is carried;
``measure_hint`` says how to find out.

The user's optimizer is kept because it is what their baseline was tuned with: the reference rungs' SGD 0.2 at
batch 256 made a task whose baseline trains AdamW 2e-3 at batch 64 end at chance. Where the user's optimizer is
the reference's kind, the rung's change of batch size and of lr per sample carry over, scaled from the user's
batch and lr; where it is not, the user's batch size stays too. The rung keeps the baseline's random crop.
Each rung's summary says what it kept and what it changed. A rung is never planned shorter than ``MIN_RUNG_STEPS`` optimizer steps (or its baseline's, if
shorter): :func:`with_enough_steps` lengthens it, with a warning, where the data set turns out small.

Beside the rungs, such a task gets the baseline a skeptic measures speed-ups against: ``plain-bf16``, its own
baseline with bf16 autocast where it is fast here (``precision: auto``) and the reference's plain-bf16 methods
(channels_last for vision). Without it, a rung's bf16 would be counted as a speed-up of its methods.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import warnings

from speedkit.core.time import Time, TimeUnit
from speedkit.tasks.recipes import Recipe, load_presets

RUNGS = ("mild", "medium", "hot")  # the speed presets of a ladder, slowest first
STRONG_BASELINE = "plain-bf16"  # the rebuilt baseline: the task's own with the lines a competent user adds
MIN_RUNG_STEPS = 100  # a rung shorter than this many steps measures its warmup, not its methods
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
        optimizer, batch_size, how = rung_optimizer(rung, reference, baseline)
        duration = scaled_budget(baseline, fraction, batch_size)
        ladder[name] = dataclasses.replace(
            rung.with_budget(duration), model=baseline.model, batch_size=batch_size, optimizer=optimizer,
            augment=_with_baselines_crop(rung.augment, baseline.augment),
            task=None, domain=None, target=None, reached=None, adopted_from=f"{task}:{name}",
            summary=f"{task}'s {name} ({rung.summary}) in {fraction:.2f} of this task's baseline budget, with {how}")
    return ladder


def rung_optimizer(rung: Recipe, reference: Recipe, baseline: Recipe) -> tuple[dict, int, str]:
    """The optimizer and batch size of a rung rebuilt on ``baseline``, and a line saying what was kept and why.

    Where the baseline's optimizer is of the reference's kind, the rung's batch is the same multiple of the
    baseline's batch as the reference rung's is of its own baseline's (a user's batch of 64 was chosen for their
    data and memory: the rung doubles it as the reference rung doubled 128, rather than jumping to 256 and
    training a quarter of the steps), and the baseline's lr is scaled with the batch (the linear scaling rule)
    and by the rung's own change of lr per sample against its reference baseline; the rest of the optimizer is
    the baseline's. Otherwise the reference rung's lr and
    batch were tuned for another optimizer and say nothing here: the baseline's optimizer and batch are kept.
    """
    optimizer = copy.deepcopy(baseline.optimizer)
    kind = str(optimizer.get("name", "")).lower()
    same_kind = kind == str(reference.optimizer.get("name", "")).lower() == str(rung.optimizer.get("name", "")).lower()
    lrs = (optimizer.get("lr"), reference.optimizer.get("lr"), rung.optimizer.get("lr"))
    if not (same_kind and all(isinstance(lr, (int, float)) and lr > 0 for lr in lrs)):
        lr = optimizer.get("lr")
        return optimizer, baseline.batch_size, (
            f"this task's {kind or 'optimizer'}" + (f" at lr {lr:g}" if lr else "") + f" and batch size "
            f"{baseline.batch_size}, kept: the reference rung's {rung.optimizer.get('name')} at lr "
            f"{rung.optimizer.get('lr')} and batch {rung.batch_size} was tuned for another optimizer")
    per_sample = (rung.optimizer["lr"] / rung.batch_size) / (reference.optimizer["lr"] / reference.batch_size)
    batch_size = max(1, round(baseline.batch_size * rung.batch_size / reference.batch_size))
    optimizer["lr"] = float(f"{optimizer['lr'] * batch_size / baseline.batch_size * per_sample:.6g}")
    return optimizer, batch_size, (
        f"this task's {kind} at lr {optimizer['lr']:g} and batch size {batch_size} (its baseline: lr "
        f"{baseline.optimizer['lr']:g} at batch {baseline.batch_size}; batch and lr scale as the reference "
        f"rung's did from its baseline's)")


def with_enough_steps(recipe: Recipe, baseline: Recipe, batches_per_epoch: int | None) -> Recipe:
    """``recipe`` (a rebuilt rung) lengthened to at least ``MIN_RUNG_STEPS`` optimizer steps, or its baseline's
    length where that is shorter, with a warning saying so; as it is where it is long enough or the length of
    an epoch is unknown."""
    steps = _steps(recipe.duration, recipe.batch_size, batches_per_epoch)
    floor = _steps(baseline.duration, baseline.batch_size, batches_per_epoch)
    if steps is None or floor is None:
        return recipe
    floor = min(MIN_RUNG_STEPS, floor)
    if steps >= floor:
        return recipe
    why = (f"this task's baseline itself trains only {floor} steps, so no rung can be shorter and still say "
           "something" if floor < MIN_RUNG_STEPS else "a shorter run measures its warmup, not its methods")
    warnings.warn(f"recipe {recipe.name!r} ({recipe.adopted_from} rebuilt on this task) would train {steps} "
                  f"step(s) on this data; it trains {floor} instead: {why}", stacklevel=3)
    return recipe.with_budget(f"{floor}ba")


def _steps(duration: str, batch_size: int, batches_per_epoch: int | None) -> int | None:
    time = Time.from_input(duration)
    if time.unit == TimeUnit.BATCH:
        return int(time.value)
    if time.unit == TimeUnit.EPOCH and batches_per_epoch:
        return int(math.ceil(time.value * batches_per_epoch))
    if time.unit == TimeUnit.SAMPLE:
        return int(math.ceil(time.value / batch_size))
    return None


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


def _with_baselines_crop(rung_augment: dict | None, baseline_augment: dict | None) -> dict | None:
    """The rung's augmentation with the baseline's random crop: the reference rungs drop the crop because
    Fashion-MNIST's objects sit centred in the frame, a fact about that data set, while the crop a user's
    baseline takes is what they know of theirs (on crops of photographs it is part of what generalises)."""
    if rung_augment is None or not baseline_augment or "crop_pad" not in baseline_augment:
        return copy.deepcopy(rung_augment)
    return {**rung_augment, "crop_pad": baseline_augment["crop_pad"]}


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


__all__ = ["MIN_RUNG_STEPS", "REFERENCES", "RUNGS", "STRONG_BASELINE", "budget_fraction", "domain_ladder",
           "measure_hint", "reference_leave_one_out", "rung_optimizer", "scaled_budget", "strong_baseline",
           "task_flags", "with_enough_steps", "with_ladder"]
