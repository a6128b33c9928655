"""Learning-rate schedules as functions of the fraction of training done.

A :class:`Schedule` maps ``t`` in ``[0, 1]`` (the fraction of the run done) to a multiplier of each
param group's base learning rate. Because it only sees the fraction, stretching or shrinking a run
(a schedule scale ratio) keeps its shape.

Durations inside a schedule (``warmup``, ``Step.every``, ``MultiStep.milestones``,
``WarmupStableDecay.decay``) are :class:`~speedkit.core.time.Time` values or strings. They are
turned into fractions of the run by a ``to_fraction`` callable. The default one only understands
``"dur"`` units; the Trainer passes one that knows the run's length, so ``"500ba"`` or ``"2ep"``
work there.

Positions and lengths are always measured on the whole run: a milestone at ``"0.5dur"`` drops the
rate half way through training whether or not there is a warmup, and ``decay="0.2dur"`` is the last
fifth of the run. ``shape(t)`` is the schedule as it would be without warmup; with a warmup of
fraction ``w`` the part after warmup is ``shape`` squeezed onto ``[w, 1]``.
"""
from __future__ import annotations

import inspect
import math
import numbers
import warnings
from typing import Any, Callable, Iterable, Mapping

from speedkit.core.time import Time, TimeUnit

__all__ = [
    "Schedule",
    "Constant",
    "Linear",
    "Cosine",
    "OneCycle",
    "Step",
    "MultiStep",
    "LinearToZero",
    "WarmupStableDecay",
    "SCHEDULES",
    "get_schedule",
    "apply_schedule",
    "dur_to_fraction",
]

ToFraction = Callable[[Time], float]

# Tolerance when comparing a position against a milestone, so that a milestone computed as e.g.
# 200/600 counts as reached at 200/600 despite rounding in the division.
_EPS = 1e-9


# -- helpers -------------------------------------------------------------------------------------
def dur_to_fraction(time: Time) -> float:
    """The default converter: only ``"dur"`` times (fractions of the run) can be converted."""
    if time.unit is TimeUnit.DURATION:
        return float(time.value)
    raise ValueError(
        f"cannot turn {time} (unit {time.unit.value!r}) into a fraction of the run without knowing the run's "
        f"length; give schedule durations in 'dur' units, or pass to_fraction (the Trainer converts other units)"
    )


def _lerp(a: float, b: float, s: float) -> float:
    """``a`` at ``s == 0``, ``b`` at ``s == 1`` (both exactly), never outside ``[a, b]``."""
    value = a * (1.0 - s) + b * s
    return min(max(value, min(a, b)), max(a, b))


def _cos_fall(s: float) -> float:
    """Half cosine from 1 at ``s == 0`` to 0 at ``s == 1``."""
    return min(1.0, max(0.0, (1.0 + math.cos(math.pi * s)) / 2.0))


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def _number(name: str, value: Any, low: float | None = None, high: float | None = None,
            low_open: bool = False, high_open: bool = False) -> float:
    """Check a numeric parameter; errors name the parameter and its accepted range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    lo_ok = low is None or (value > low if low_open else value >= low)
    hi_ok = high is None or (value < high if high_open else value <= high)
    if not math.isfinite(value) or not (lo_ok and hi_ok):
        rng = f"{'(' if low_open else '['}{'-inf' if low is None else low:g}, " \
              f"{'inf' if high is None else high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {rng}, got {value!r}")
    return value


def _time(name: str, value: Any, *, allow_zero: bool = True, below_one: bool = False) -> Time:
    """Parse a Time parameter (Time, string, or a bare number meaning a fraction of the run)."""
    try:
        time = Time.from_input(value, default_unit=TimeUnit.DURATION)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{name}: {e}") from None
    if time is None:
        raise TypeError(f"{name} must be a duration such as '0.1dur' or '500ba', got None")
    if time.unit is TimeUnit.DURATION:
        if time.value > 1 or (below_one and time.value >= 1):
            raise ValueError(f"{name} is a fraction of the run and must be {'<' if below_one else '<='} 1, got {time}")
    if not allow_zero and time.value == 0:
        raise ValueError(f"{name} must be longer than zero, got {time}")
    return time


def _choice(name: str, value: Any, choices: Mapping[str, str]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"{name} must be one of {sorted(set(choices.values()))}, got {value!r}")
    return choices[value.lower()]


# -- base class ----------------------------------------------------------------------------------
class Schedule:
    """Learning-rate multiplier as a function of the fraction of training done, t in [0, 1].

    ``warmup`` (a duration, e.g. ``"0.1dur"`` or ``"500ba"``) ramps the multiplier linearly from
    ``warmup_start * shape(0)`` to ``shape(0)``; after it the schedule's :meth:`shape` runs over the
    rest of training.
    """

    name: str = "schedule"

    def __init__(self, warmup: Time | str | None = None, warmup_start: float = 0.0):
        self.warmup: Time | None = None if warmup is None else _time("warmup", warmup, below_one=True)
        self.warmup_start = _number("warmup_start", warmup_start, 0.0, 1.0)
        self._warned_long_warmup = False

    # subclasses override one of these ------------------------------------------------------------
    def shape(self, t: float, to_fraction: ToFraction | None = None) -> float:
        """The schedule after warmup, with ``t`` rescaled to [0, 1] over the post-warmup part.

        Equivalently: the whole schedule when there is no warmup.
        """
        return self._shape(t, 0.0, to_fraction or dur_to_fraction)

    def _shape(self, u: float, w: float, to_fraction: ToFraction) -> float:
        """``shape`` at post-warmup position ``u`` when warmup takes fraction ``w`` of the run.

        Schedules with Time parameters (positions on the whole run) override this; the others
        override :meth:`shape` and ignore ``w``.
        """
        raise NotImplementedError

    def _params(self) -> dict:
        """Constructor parameters other than warmup, as JSON-friendly values."""
        return {}

    # ---------------------------------------------------------------------------------------------
    def warmup_fraction(self, to_fraction: ToFraction | None = None) -> float:
        if self.warmup is None:
            return 0.0
        w = float((to_fraction or dur_to_fraction)(self.warmup))
        if w >= 1.0 and not self._warned_long_warmup:
            self._warned_long_warmup = True
            warnings.warn(f"{self.name} schedule: warmup {self.warmup} covers the whole run; "
                          f"the multiplier only ramps up", stacklevel=3)
        return _clamp01(w)

    def __call__(self, t: float, to_fraction: ToFraction | None = None) -> float:
        if isinstance(t, bool) or not isinstance(t, numbers.Real):
            raise TypeError(f"t (fraction of training done) must be a number, got {type(t).__name__} {t!r}")
        if math.isnan(t):
            raise ValueError("t (fraction of training done) is NaN")
        t = _clamp01(float(t))
        conv = to_fraction or dur_to_fraction
        w = self.warmup_fraction(conv)
        if w > 0.0 and (t < w or w >= 1.0):
            top = self._shape(0.0, w, conv)
            if w >= 1.0 and t >= 1.0:
                return top
            return _lerp(self.warmup_start * top, top, t / w)
        u = 1.0 if t >= 1.0 else (t - w) / (1.0 - w)  # exactly 1 at the end of the run
        return self._shape(_clamp01(u), w, conv)

    # ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"name": self.name}
        d.update(self._params())
        d["warmup"] = None if self.warmup is None else str(self.warmup)
        d["warmup_start"] = self.warmup_start
        return d

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "name")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(self))


class _PlainSchedule(Schedule):
    """A schedule with no Time parameters: ``shape`` depends on ``t`` only."""

    def shape(self, t: float, to_fraction: ToFraction | None = None) -> float:
        raise NotImplementedError

    def _shape(self, u: float, w: float, to_fraction: ToFraction) -> float:
        return self.shape(u)


# -- concrete schedules --------------------------------------------------------------------------
class Constant(_PlainSchedule):
    """Multiplier 1 throughout (after any warmup)."""

    name = "constant"

    def shape(self, t, to_fraction=None):
        return 1.0


class Linear(_PlainSchedule):
    """Straight line from ``start`` to ``end``."""

    name = "linear"

    def __init__(self, start: float = 1.0, end: float = 0.0, warmup: Time | str | None = None,
                 warmup_start: float = 0.0):
        self.start = _number("start", start, 0.0, 1.0)
        self.end = _number("end", end, 0.0, 1.0)
        super().__init__(warmup, warmup_start)

    def shape(self, t, to_fraction=None):
        return _lerp(self.start, self.end, _clamp01(t))

    def _params(self):
        return {"start": self.start, "end": self.end}


class LinearToZero(_PlainSchedule):
    """Linear decay from 1 to exactly 0 at the end of the budget (the budgeted-training default)."""

    name = "linear_to_zero"

    def shape(self, t, to_fraction=None):
        return 1.0 - _clamp01(t)


class Cosine(_PlainSchedule):
    """Half cosine from 1 down to ``final``."""

    name = "cosine"

    def __init__(self, final: float = 0.0, warmup: Time | str | None = None, warmup_start: float = 0.0):
        self.final = _number("final", final, 0.0, 1.0)
        super().__init__(warmup, warmup_start)

    def shape(self, t, to_fraction=None):
        return _lerp(self.final, 1.0, _cos_fall(_clamp01(t)))

    def _params(self):
        return {"final": self.final}


_ANNEAL = {"cos": "cosine", "cosine": "cosine", "linear": "linear"}


class OneCycle(_PlainSchedule):
    """Up from ``start`` to 1 at ``peak_at``, then down to ``final`` (``anneal``: cosine or linear).

    It has its own ramp, so it needs no warmup (one can still be given).
    """

    name = "one_cycle"

    def __init__(self, peak_at: float = 0.25, start: float = 1 / 25, final: float = 1e-4,
                 anneal: str = "cosine", warmup: Time | str | None = None, warmup_start: float = 0.0):
        self.peak_at = _number("peak_at", peak_at, 0.0, 1.0, low_open=True, high_open=True)
        self.start = _number("start", start, 0.0, 1.0)
        self.final = _number("final", final, 0.0, 1.0)
        self.anneal = _choice("anneal", anneal, _ANNEAL)
        super().__init__(warmup, warmup_start)

    def _fall(self, s: float) -> float:  # 1 -> 0
        return _cos_fall(s) if self.anneal == "cosine" else 1.0 - s

    def shape(self, t, to_fraction=None):
        t = _clamp01(t)
        if t < self.peak_at:
            return _lerp(self.start, 1.0, 1.0 - self._fall(t / self.peak_at))
        s = (t - self.peak_at) / (1.0 - self.peak_at)
        return _lerp(self.final, 1.0, self._fall(_clamp01(s)))

    def _params(self):
        return {"peak_at": self.peak_at, "start": self.start, "final": self.final, "anneal": self.anneal}


class Step(Schedule):
    """Multiply by ``gamma`` every ``every`` of the run (counted from the start of the run)."""

    name = "step"

    def __init__(self, every: Time | str = "0.33dur", gamma: float = 0.1, warmup: Time | str | None = None,
                 warmup_start: float = 0.0):
        self.every = _time("every", every, allow_zero=False)
        self.gamma = _number("gamma", gamma, 0.0, 1.0)
        super().__init__(warmup, warmup_start)

    def _shape(self, u, w, to_fraction):
        every = float(to_fraction(self.every))
        if not every > 0:
            raise ValueError(f"every ({self.every}) converts to a fraction of {every!r}; it must be > 0")
        position = w + u * (1.0 - w)  # on the whole run
        return self.gamma ** math.floor(position / every + _EPS)

    def _params(self):
        return {"every": str(self.every), "gamma": self.gamma}


class MultiStep(Schedule):
    """Multiply by ``gamma`` at each milestone (positions on the whole run)."""

    name = "multistep"

    def __init__(self, milestones: Iterable[Time | str] = ("0.5dur", "0.75dur"), gamma: float = 0.1,
                 warmup: Time | str | None = None, warmup_start: float = 0.0):
        if isinstance(milestones, (str, Time)) or not isinstance(milestones, Iterable):
            raise TypeError(f"milestones must be a list of durations such as ['0.5dur', '0.75dur'], got {milestones!r}")
        self.milestones = tuple(_time(f"milestones[{i}]", m) for i, m in enumerate(milestones))
        self.gamma = _number("gamma", gamma, 0.0, 1.0)
        super().__init__(warmup, warmup_start)

    def _shape(self, u, w, to_fraction):
        position = w + u * (1.0 - w)
        passed = sum(1 for m in self.milestones if float(to_fraction(m)) <= position + _EPS)
        return self.gamma ** passed

    def _params(self):
        return {"milestones": [str(m) for m in self.milestones], "gamma": self.gamma}


_DECAY_SHAPES = {"linear": "linear", "cos": "cosine", "cosine": "cosine", "sqrt": "sqrt", "1-sqrt": "sqrt"}


class WarmupStableDecay(Schedule):
    """Warmup (if given), flat at 1, then decay to ``final`` over the last ``decay`` of the run.

    ``decay_shape``: ``"linear"``, ``"cosine"`` or ``"sqrt"`` (``1 - sqrt``, the cooldown of
    Hägele et al. 2024). If the warmup runs into the decay window, the decay starts after warmup.
    """

    name = "wsd"

    def __init__(self, decay: Time | str = "0.2dur", final: float = 0.0, decay_shape: str = "linear",
                 warmup: Time | str | None = None, warmup_start: float = 0.0):
        self.decay = _time("decay", decay, allow_zero=False)
        self.final = _number("final", final, 0.0, 1.0)
        self.decay_shape = _choice("decay_shape", decay_shape, _DECAY_SHAPES)
        super().__init__(warmup, warmup_start)

    def _fall(self, s: float) -> float:  # 1 -> 0
        if self.decay_shape == "cosine":
            return _cos_fall(s)
        if self.decay_shape == "sqrt":
            return 1.0 - math.sqrt(s)
        return 1.0 - s

    def _shape(self, u, w, to_fraction):
        d = _clamp01(float(to_fraction(self.decay)))
        position = w + u * (1.0 - w)
        decay_start = max(1.0 - d, w)
        if decay_start >= 1.0 or position < decay_start:  # no room to decay, or not there yet
            return 1.0
        s = 1.0 if u >= 1.0 else (position - decay_start) / (1.0 - decay_start)
        return _lerp(self.final, 1.0, self._fall(_clamp01(s)))

    def _params(self):
        return {"decay": str(self.decay), "final": self.final, "decay_shape": self.decay_shape}


SCHEDULES: dict[str, type[Schedule]] = {
    "constant": Constant,
    "linear": Linear,
    "cosine": Cosine,
    "one_cycle": OneCycle,
    "step": Step,
    "multistep": MultiStep,
    "linear_to_zero": LinearToZero,
    "wsd": WarmupStableDecay,
}


def _lookup(name: Any) -> type[Schedule]:
    if not isinstance(name, str):
        raise TypeError(f"schedule name must be a string, got {type(name).__name__} {name!r}")
    key = name.strip().lower().replace("-", "_")
    if key not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; known schedules: {', '.join(SCHEDULES)}")
    return SCHEDULES[key]


def get_schedule(spec: Schedule | str | Mapping[str, Any]) -> Schedule:
    """A Schedule from a Schedule, a name (``"cosine"``) or a dict (``{"name": "cosine", "warmup": "0.1dur"}``).

    The dict form is what :meth:`Schedule.to_dict` produces, so ``get_schedule(s.to_dict()) == s``.
    """
    if isinstance(spec, Schedule):
        return spec
    if isinstance(spec, str):
        return _lookup(spec)()
    if isinstance(spec, Mapping):
        if "name" not in spec:
            raise ValueError(f"schedule dict needs a 'name' (one of {', '.join(SCHEDULES)}), got {dict(spec)!r}")
        kwargs = dict(spec)
        cls = _lookup(kwargs.pop("name"))
        accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        unknown = sorted(k for k in kwargs if k not in accepted)
        if unknown:
            raise TypeError(f"{cls.name} schedule got unknown parameter(s) {', '.join(map(repr, unknown))}; "
                            f"accepted: {', '.join(accepted)}")
        return cls(**kwargs)
    raise TypeError(f"expected a Schedule, a schedule name or a dict with a 'name', got {type(spec).__name__} {spec!r}")


def apply_schedule(optimizer, schedule: Schedule | str | Mapping[str, Any], t: float,
                   to_fraction: ToFraction | None = None) -> float:
    """Set every param group's lr to ``group["initial_lr"] * schedule(t)``; return the multiplier.

    ``initial_lr`` is stored from the group's current lr the first time a group is seen (the same
    key torch's own LR schedulers use).
    """
    schedule = get_schedule(schedule)
    multiplier = schedule(t, to_fraction)
    for group in optimizer.param_groups:
        lr = group["lr"]
        if "initial_lr" not in group:
            group["initial_lr"] = float(lr) if not hasattr(lr, "item") else float(lr.item())
        new_lr = float(group["initial_lr"]) * multiplier
        if hasattr(lr, "fill_"):  # tensor lr (capturable / fused optimizers): update in place
            lr.fill_(new_lr)
        else:
            group["lr"] = new_lr
    return multiplier
