"""The search space of ``speedkit tune``, read from the method cards and the base recipe: which methods may be
tried (and why the others are left out), and how one Optuna trial becomes a Recipe. Methods are drawn in a
fixed order, and one the engine's own check refuses beside those already on is not offered at all.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import tempfile
from typing import Any, Sequence

from speedkit.core.method import HParam, IncompatibleMethodsError, check_compatibility
from speedkit.core.time import scaled_duration
from speedkit.experiments.measure import budget_scale

# Hyperparameters that are switches of the method's error handling or facts about the task, not settings.
NOT_SEARCHED = {"allow_empty", "num_classes"}

# Schedules a trial may pick besides the baseline recipe's own (their shapes stretch with the budget).
SCHEDULE_CHOICES = {
    "one_cycle": {"name": "one_cycle", "peak_at": 0.2},
    "linear_to_zero": {"name": "linear_to_zero", "warmup": "0.05dur"},
}


class TuneInputError(ValueError):
    """Bad input to ``speedkit.experiments.tune``: the message names the argument and how to fix it."""


def default_left_out(device_type: str) -> dict[str, str]:
    """Methods not tried unless asked for by name, with the reason."""
    left_out = {"autocast": "the search tunes the recipe's precision field, which sets the same autocast"}
    if device_type == "cpu":
        left_out["torch_compile"] = ("its first batch compiles, which a timed search would "
                                     "count against it; name it in searched_methods= to try it anyway")
    return left_out


def resolve_methods(methods: Sequence[str] | str | None) -> list[str] | None:
    """The allowed method names, checked against the registry (None: every method)."""
    from speedkit.methods import REGISTRY

    if methods is None:
        return None
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    names = list(dict.fromkeys(methods))
    unknown = [m for m in names if m not in REGISTRY]
    if unknown:
        hints = [f"{m!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(m, list(REGISTRY), n=1))
                 else repr(m) for m in unknown]
        raise TuneInputError(f"methods: unknown method {', '.join(hints)}; known methods: {', '.join(REGISTRY)}")
    return names


def candidate_methods(task_domain: str, allowed: list[str] | None, device_type: str,
                      flips_keep_labels: bool = True) -> tuple[list[str], dict]:
    """(methods the search may turn on, {method left out: why}) by domain, by whether a flip keeps the task's
    labels, and the default exclusions."""
    from speedkit.methods import REGISTRY
    from speedkit.tasks.recipes import FLIPPING_METHODS

    named = allowed is not None
    left_out: dict[str, str] = {}
    candidates = []
    for name in (allowed if named else list(REGISTRY)):
        card = REGISTRY[name].CARD
        if card.domain not in (task_domain, "any"):
            left_out[name] = f"a {card.domain} method; this task is {task_domain}"
        elif not flips_keep_labels and name in FLIPPING_METHODS:
            left_out[name] = "it mirrors images, and a horizontal flip changes this task's labels"
        elif not named and name in default_left_out(device_type):
            left_out[name] = default_left_out(device_type)[name]
        else:
            candidates.append(name)
    return candidates, left_out


def surgery_refusal(spec, recipe, name: str, params: dict, device: str, run_dir: str) -> str | None:
    """Why method ``name`` at ``params`` cannot act on a fresh model of the task (``spec``), or None where it
    acts: a Trainer without data runs INIT only, so a surgery that finds nothing (``NothingToChangeError``) or a
    refused requirement shows here (a hundred of these take seconds, where building the task's data each time
    would take minutes)."""
    import torch

    from speedkit.methods import get_method
    from speedkit.train.trainer import Trainer

    torch.manual_seed(0)
    try:
        Trainer(spec.model(recipe.model), methods=[get_method(name, **params)], device=device,
                precision=recipe.precision, run_dir=run_dir, save_checkpoints=False)
    except (ValueError, TypeError, RuntimeError) as e:  # NothingToChangeError is a ValueError
        return f"{type(e).__name__}: {e}"
    return None


def probe_surgery(task: str, recipe, methods: list[str], device: str) -> dict[str, str]:
    """{method: why it is left out} for the methods acting at INIT that cannot act on the task's model with
    their card's defaults (``surgery_refusal``, the probe ``fit_hparams_to_model`` also narrows their ranges
    with): the search would only waste trials on them."""
    from speedkit.core.event import Event
    from speedkit.methods import REGISTRY
    from speedkit.tasks import resolve_task

    spec = resolve_task(task)
    with tempfile.TemporaryDirectory() as run_dir:
        refusals = {name: surgery_refusal(spec, recipe, name, {}, device, run_dir) for name in methods
                    if Event.INIT in REGISTRY[name].CARD.events}
    return {name: why for name, why in refusals.items() if why is not None}


def fit_hparams_to_model(task: str, recipe, methods: list[str], device: str) -> dict:
    """{"method.hparam": {"low", "high"} or {"choices"}}: the card ranges narrowed to what acts on this model
    (docs/guide.md, "Search space from the cards"). Each hyperparameter of a surgery method is tried alone at
    its range's ends, an end that finds nothing is moved in by bisection, and a choice that finds nothing is not
    offered; interactions between two hyperparameters are not probed (a trial that meets one is refused).
    """
    from speedkit.core.event import Event
    from speedkit.methods import REGISTRY
    from speedkit.tasks import resolve_task

    spec = resolve_task(task)
    limits: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        def acts(name: str, params: dict) -> bool:
            return surgery_refusal(spec, recipe, name, params, device, run_dir) is None

        for name in methods:
            if Event.INIT not in REGISTRY[name].CARD.events or not acts(name, {}):
                continue  # not a surgery, or one that finds nothing even at its defaults (probe_surgery says why)
            for hp in REGISTRY[name].CARD.hparams:
                limit = _fit_hparam(hp, lambda value: acts(name, {hp.name: value}))
                if limit is not None:
                    limits[f"{name}.{hp.name}"] = limit
    return limits


def _fit_hparam(hp: HParam, acts) -> dict | None:
    """The part of one hyperparameter's range where ``acts(value)`` holds, or None where that is all of it."""
    if not is_searched(hp):
        return None
    choices = search_choices(hp)
    if choices is not None:
        kept = [c for c in choices if c == hp.default or acts(c)]
        return {"choices": kept} if len(kept) < len(choices) else None
    low = hp.low if acts(hp.low) else _last_acting(hp, hp.default, hp.low, acts)
    high = hp.high if acts(hp.high) else _last_acting(hp, hp.default, hp.high, acts)
    return None if (low, high) == (hp.low, hp.high) else {"low": low, "high": high}


def describe_limit(limit: dict) -> str:
    """A narrowed range in words: ``in [1, 128]`` or ``as True``."""
    if "choices" in limit:
        return "as " + " or ".join(map(str, limit["choices"]))
    return f"in [{limit['low']:.4g}, {limit['high']:.4g}]"


def _last_acting(hp: HParam, good, bad, acts, steps: int = 10):
    """Bisect between a value that acts (``good``) and one that does not (``bad``): the last that acts."""
    for _ in range(64 if hp.type is int else steps):
        if hp.type is int and abs(bad - good) <= 1:
            break
        middle = (good + bad) // 2 if hp.type is int else (good + bad) / 2
        good, bad = (middle, bad) if acts(middle) else (good, middle)
    return good


# -- the space ---------------------------------------------------------------------------------
@dataclasses.dataclass
class SearchSpace:
    """What a trial may change in the base recipe. Empty tuples (or None ranges) keep the base's value."""

    methods: tuple[str, ...] = ()  # tried on/off in this order
    tune_hparams: bool = True  # each method's card hyperparameters too, not only on/off
    lr_factor: float | None = 10.0  # lr in [base / f, base * f], log scale
    duration_scale_range: tuple[float, float] | None = (0.1, 1.0)  # a trial's budget over the base's, log scale
    batch_sizes: tuple[int, ...] = ()
    schedules: tuple[str, ...] = ()  # "base" and names in SCHEDULE_CHOICES
    precisions: tuple[str, ...] = ()
    loaders: tuple[str, ...] = ()
    crop_pads: tuple[int, ...] = ()
    flips: tuple[str, ...] = ()  # "random", "alternating", "none"
    hparam_limits: dict = dataclasses.field(default_factory=dict)  # "method.hparam": fit_hparams_to_model's ranges

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def full_space(base, methods: Sequence[str], device_type: str, tune_hparams: bool = True,
               duration_scale_range=(0.1, 1.0), lr_factor: float = 10.0, hparam_limits: dict | None = None,
               flips_keep_labels: bool = True) -> SearchSpace:
    """Methods plus every recipe field that fits the task's domain and device (flips only where they keep the
    labels)."""
    vision = base.domain == "vision"
    precisions = ("fp32", "bf16", "fp16") if device_type == "cuda" else ("fp32", "bf16")
    return SearchSpace(
        methods=tuple(methods), tune_hparams=tune_hparams, lr_factor=lr_factor,
        duration_scale_range=duration_scale_range,
        batch_sizes=tuple(sorted({max(1, base.batch_size // 2), base.batch_size, base.batch_size * 2,
                                  base.batch_size * 4})),
        schedules=("base", *SCHEDULE_CHOICES), precisions=precisions,
        loaders=("memory", "torch") if vision else (),
        crop_pads=(0, 1, 2) if vision else (),
        flips=("random", "alternating", "none") if vision and flips_keep_labels else (),
        hparam_limits=dict(hparam_limits or {}))


# -- the recipe fields a trial picks from a list -------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Field:
    """One recipe field the search picks from a list of choices: how a trial draws it (``suggest_recipe``), how a
    known recipe is read back as a trial's parameters (``recipe_params``) and how a move changes it (``moves``)."""

    name: str  # the trial parameter; stored studies name it so, never rename
    space_attr: str  # the SearchSpace attribute with its choices (empty: the field is not searched)
    move_weight: float | None  # how likely a move to another choice is, beside a method move's 1 (None: no moves)
    in_augment: bool = False  # a key of the recipe's augment dict, not a Recipe field
    default: Any = None  # an augment key's value where the recipe does not set it
    kept_from_base: bool = True  # a space that does not search it holds only recipes with the base's value
    neighbours: bool = False  # an ordered scale: a move goes one choice up or down

    def value(self, recipe):
        """The recipe's value of this field."""
        return (recipe.augment or {}).get(self.name, self.default) if self.in_augment else getattr(recipe, self.name)

    def to_value(self, choice, base):
        """The value a choice stands for (``"base"`` for the base's schedule, ``"none"`` for no flip)."""
        if self.name == "schedule":
            return base.schedule if choice == "base" else dict(SCHEDULE_CHOICES[choice])
        return None if self.name == "flip" and choice == "none" else choice

    def choice_of(self, recipe, base):
        """The choice that stands for the recipe's value (None where none does)."""
        value = self.value(recipe)
        if self.name == "schedule":
            return "base" if value == base.schedule else next((n for n, s in SCHEDULE_CHOICES.items() if s == value),
                                                              None)
        return (value or "none") if self.name == "flip" else value

    def changes(self, value, recipe, changes: dict | None = None) -> dict:
        """``changes`` (Recipe.with_changes keywords on ``recipe``) with this field set to ``value``."""
        changes = dict(changes or {})
        if self.in_augment:
            changes["augment"] = {**(changes.get("augment", recipe.augment) or {}), self.name: value}
        else:
            changes[self.name] = value
        return changes


# In the order a trial draws them (the sampler's draws follow it).
FIELDS = (Field("batch_size", "batch_sizes", 0.5, neighbours=True), Field("schedule", "schedules", 0.5),
          Field("precision", "precisions", None), Field("loader", "loaders", None),
          Field("crop_pad", "crop_pads", 0.25, in_augment=True, default=0, kept_from_base=False),
          Field("flip", "flips", 0.25, in_augment=True, kept_from_base=False))


# -- one trial -> one recipe -------------------------------------------------------------------------
def suggest_recipe(trial, base, space: SearchSpace, name: str, refused=frozenset()):
    """The Recipe this trial proposes (base recipe fields changed by what the sampler picked); methods in
    ``refused`` (found nothing in this model) are never offered."""
    changes: dict[str, Any] = {"name": name, "summary": f"found by speedkit tune ({name})"}
    optimizer = dict(base.optimizer)
    if space.lr_factor:
        lr = base.optimizer["lr"]
        optimizer["lr"] = trial.suggest_float("lr", lr / space.lr_factor, lr * space.lr_factor, log=True)
    changes["optimizer"] = optimizer
    if space.duration_scale_range:
        scale = trial.suggest_float("duration_scale", *space.duration_scale_range, log=True)
        changes["duration"] = scaled_duration(base.duration, scale)
    for field in FIELDS:
        if getattr(space, field.space_attr):
            choice = trial.suggest_categorical(field.name, getattr(space, field.space_attr))
            changes = field.changes(field.to_value(choice, base), base, changes)
    if space.methods:  # the trial's methods replace the base's (checked against the cards); no methods: the base's stay
        changes["methods"] = suggest_methods(trial, space, refused)
    return base.with_changes(**changes)


def suggest_methods(trial, space: SearchSpace, refused=frozenset()) -> dict:
    """Methods on/off in a fixed order; one that conflicts with those already on, or that found nothing in
    this model in an earlier trial (``refused``), is not offered."""
    from speedkit.methods import get_method

    chosen: dict[str, dict] = {}
    methods = []
    for name in space.methods:
        if name in refused:
            continue
        candidate = get_method(name)
        try:
            check_compatibility([*methods, candidate])
        except IncompatibleMethodsError:
            continue  # never proposed beside a method it conflicts with (the engine would refuse the pair)
        if not trial.suggest_categorical(f"use:{name}", (False, True)):
            continue
        params = suggest_hparams(trial, name, space.hparam_limits) if space.tune_hparams else {}
        chosen[name] = params
        methods.append(candidate)
    return chosen


def suggest_hparams(trial, method: str, limits: dict | None = None) -> dict:
    """The method's searchable hyperparameters, each within its card's range (log scale where it says),
    narrowed to ``limits`` where this model needs it (``fit_hparams_to_model``)."""
    from speedkit.methods import REGISTRY

    params = {}
    for hp in REGISTRY[method].CARD.hparams:
        hp = limited_hparam(method, hp, limits, params)
        if is_searched(hp):  # else its default stays (e.g. ema's half_life string)
            params[hp.name] = _suggest_hparam(trial, f"{method}.{hp.name}", hp)
    return params


def limited_hparam(method: str, hp: HParam, limits: dict | None, chosen: dict) -> HParam:
    """``hp`` with its range narrowed to what acts on this model (``limits``) and to its card constraint: a
    hyperparameter that may not exceed another (``at_most``) is drawn no higher than the value ``chosen`` for
    that one (or its default), so no trial is lost to settings the method would refuse."""
    from speedkit.methods import REGISTRY

    limit = (limits or {}).get(f"{method}.{hp.name}")
    if limit is not None:
        hp = dataclasses.replace(hp, **({"choices": tuple(limit["choices"])} if "choices" in limit
                                         else {"low": limit["low"], "high": limit["high"]}))
    if hp.at_most is not None and hp.high is not None:
        bound = chosen.get(hp.at_most, REGISTRY[method].CARD.hparam(hp.at_most).default)
        hp = dataclasses.replace(hp, high=max(hp.low, min(hp.high, bound)), default=min(hp.default, bound))
    return hp


def search_choices(hp: HParam) -> tuple | None:
    """The values the search picks this hyperparameter from, if it is a choice (a bool is one)."""
    return hp.choices if hp.choices is not None else ((False, True) if hp.type is bool else None)


def is_searched(hp: HParam) -> bool:
    """Whether the search sets this hyperparameter: plain choices, or a number with a range; else its default stays."""
    if hp.name in NOT_SEARCHED:
        return False
    choices = search_choices(hp)
    if choices is not None:
        return all(isinstance(c, (str, int, float, bool)) for c in choices)  # what Optuna stores (not dynamic=None)
    return hp.type in (int, float) and hp.low is not None and hp.high is not None and hp.low < hp.high


def _suggest_hparam(trial, key: str, hp: HParam):
    """One searched hyperparameter (``is_searched``): one of its choices, or a number in [low, high]."""
    if search_choices(hp) is not None:
        return trial.suggest_categorical(key, search_choices(hp))
    log = hp.log and hp.low > 0
    if hp.type is int:
        on_grid = hp.step and not log and (hp.high - hp.low) % hp.step == 0 and (hp.default - hp.low) % hp.step == 0
        step = int(hp.step) if on_grid else 1  # a grid that misses the default could not start from the presets
        return trial.suggest_int(key, int(hp.low), int(hp.high), step=step, log=log)
    return trial.suggest_float(key, float(hp.low), float(hp.high), log=log)


# -- a known recipe as a starting point ------------------------------------------------------------
def recipe_params(recipe, base, space: SearchSpace) -> dict | None:
    """The trial parameters that reproduce ``recipe`` in ``space`` (to enqueue it), or None if it does not fit.

    Only the fields and methods the space searches can be set; a recipe that needs anything else
    (another model, a method left out, a value outside a range) is not a point of this space.
    """
    if recipe.model != base.model:
        return None
    if not set(recipe.methods) <= set(space.methods) and not (not space.methods and recipe.methods == base.methods):
        return None
    params: dict[str, Any] = {}
    if space.lr_factor:
        params["lr"] = recipe.optimizer.get("lr", base.optimizer["lr"])
        if not base.optimizer["lr"] / space.lr_factor <= params["lr"] <= base.optimizer["lr"] * space.lr_factor:
            return None
    elif recipe.optimizer != base.optimizer:
        return None
    if space.duration_scale_range:
        scale = budget_scale(recipe, base)
        if scale is None or not space.duration_scale_range[0] <= scale <= space.duration_scale_range[1]:
            return None
        params["duration_scale"] = scale
    elif recipe.duration != base.duration:
        return None
    for field in FIELDS:
        choices = getattr(space, field.space_attr)
        if choices:
            params[field.name] = field.choice_of(recipe, base)
            if params[field.name] not in choices:
                return None
        elif field.kept_from_base and field.value(recipe) != field.value(base):
            return None  # a field the space does not search must stay the base's
    return params | _method_params(recipe.methods, space)


def _method_params(methods: dict, space: SearchSpace) -> dict:
    """``use:`` switches for every method in the space, and the given methods' hyperparameters."""
    from speedkit.methods import REGISTRY

    params: dict[str, Any] = {f"use:{name}": name in methods for name in space.methods}
    if space.tune_hparams:
        for name, given in methods.items():
            for hp in REGISTRY[name].CARD.hparams:
                if hp.name not in NOT_SEARCHED:
                    params[f"{name}.{hp.name}"] = (given or {}).get(hp.name, hp.default)
    return params


def describe_change(recipe, base) -> str:
    """A short line of what a recipe changes from the base: methods and the fields that differ."""
    parts = [f"+{m}" for m in recipe.methods]
    for field in ("batch_size", "precision", "loader", "duration"):
        if getattr(recipe, field) != getattr(base, field):
            parts.append(f"{field}={getattr(recipe, field)}")
    lr = recipe.optimizer.get("lr")
    if lr is not None and not math.isclose(lr, base.optimizer.get("lr", lr)):
        parts.append(f"lr={lr:.3g}")
    if recipe.schedule != base.schedule:
        parts.append(f"schedule={(recipe.schedule or {}).get('name')}")
    if recipe.augment != base.augment:
        parts.append(f"augment={recipe.augment}")
    return " ".join(parts) or "as the base"
