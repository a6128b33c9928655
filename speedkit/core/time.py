"""Training time: durations such as ``"10ep"``, ``"500ba"``, ``"2Mtok"``, ``"0.25dur"``, ``"90s"``.

A :class:`Time` is a value with a unit. A :class:`Timestamp` is where a run is now, counted in
every unit at once, so any duration can be compared against it.
"""
from __future__ import annotations

import dataclasses
import math
import re
from enum import Enum
from typing import Union


class TimeUnit(str, Enum):
    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"  # a fraction of the whole run
    SECOND = "s"      # training wall clock (evaluation excluded)


# Units whose values count whole things; epochs and wall clock may be fractional.
_WHOLE_UNITS = {TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN}
# Wall-clock spellings that are normalised to seconds.
_CLOCK_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_MULTIPLIERS = {"": 1, "k": 1_000, "K": 1_000, "M": 1_000_000, "B": 1_000_000_000, "G": 1_000_000_000}
_UNIT_NAMES = {u.value: u for u in TimeUnit}
# The Timestamp field that counts each unit (a fraction of the run is the State's to know).
_TIMESTAMP_FIELDS = {TimeUnit.EPOCH: "epoch", TimeUnit.BATCH: "batch", TimeUnit.SAMPLE: "sample",
                     TimeUnit.TOKEN: "token", TimeUnit.SECOND: "wall_s"}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMBG]?)\s*([a-z]+)\s*$")
ACCEPTED_UNITS = "ep, ba, sp, tok, dur, s, m, h (with an optional k/M/B multiplier, e.g. '2Mtok')"

TimeLike = Union["Time", str]


@dataclasses.dataclass(frozen=True)
class Time:
    """A duration or a point in training: ``Time(10, TimeUnit.EPOCH)`` or ``Time.from_string("10ep")``."""

    value: float
    unit: TimeUnit

    def __post_init__(self):
        if self.unit not in _UNIT_NAMES and not isinstance(self.unit, TimeUnit):
            raise ValueError(f"unknown time unit {self.unit!r}; accepted units: {ACCEPTED_UNITS}")
        unit = TimeUnit(self.unit)
        object.__setattr__(self, "unit", unit)
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise TypeError(f"Time value must be a number, got {self.value!r}")
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"Time value must be finite and >= 0, got {self.value!r} {unit.value}")
        if unit in _WHOLE_UNITS:
            if not (isinstance(self.value, int) or float(self.value).is_integer()):
                raise ValueError(f"{unit.value} counts whole units; got {self.value!r}")
            object.__setattr__(self, "value", int(self.value))
        if unit is TimeUnit.DURATION and self.value > 1:
            raise ValueError(f"'dur' is a fraction of the run and must be between 0 and 1, got {self.value!r}")
        if self.value == 0:
            object.__setattr__(self, "value", type(self.value)(0))  # no -0.0

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_string(cls, text: str) -> "Time":
        if not isinstance(text, str):
            raise TypeError(f"expected a duration string such as '10ep', got {type(text).__name__} {text!r}")
        match = _PATTERN.match(text)
        if not match:
            raise ValueError(f"cannot parse duration {text!r}: expected a number and a unit, one of {ACCEPTED_UNITS}")
        number, multiplier, unit_name = match.groups()
        value = float(number) * _MULTIPLIERS[multiplier]
        if not math.isfinite(value):
            raise ValueError(f"duration {text!r} is too large to count: {number}{multiplier} overflows")
        if multiplier and abs(value - round(value)) < 1e-6:
            value = float(round(value))  # "2.01ktok" is 2010 tokens, not 2009.9999999999998
        if unit_name in _CLOCK_UNITS:
            return cls(value * _CLOCK_UNITS[unit_name], TimeUnit.SECOND)
        if unit_name not in _UNIT_NAMES:
            raise ValueError(f"unknown time unit {unit_name!r} in {text!r}; accepted units: {ACCEPTED_UNITS}")
        unit = _UNIT_NAMES[unit_name]
        if unit in _WHOLE_UNITS and value != int(value):
            raise ValueError(f"{text!r}: {unit.value} counts whole units, so the value must be a whole number")
        if unit is TimeUnit.DURATION and value > 1:
            raise ValueError(f"{text!r}: 'dur' is a fraction of the run and must be between 0 and 1")
        return cls(int(value) if unit in _WHOLE_UNITS else value, unit)

    @classmethod
    def from_input(cls, value: "TimeLike | int | float | None", default_unit: TimeUnit | str | None = None) -> "Time | None":
        """Accept a Time, a string, or a bare number in ``default_unit``; None passes through."""
        if value is None or isinstance(value, Time):
            return value
        if isinstance(value, str):
            return cls.from_string(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and default_unit is not None:
            return cls(value, TimeUnit(default_unit))
        raise TypeError(f"expected a duration such as '10ep' or a Time, got {type(value).__name__} {value!r}")

    @classmethod
    def epochs(cls, n: float) -> "Time":
        return cls(n, TimeUnit.EPOCH)

    @classmethod
    def batches(cls, n: int) -> "Time":
        return cls(n, TimeUnit.BATCH)

    @classmethod
    def samples(cls, n: int) -> "Time":
        return cls(n, TimeUnit.SAMPLE)

    @classmethod
    def tokens(cls, n: int) -> "Time":
        return cls(n, TimeUnit.TOKEN)

    @classmethod
    def fraction(cls, f: float) -> "Time":
        return cls(f, TimeUnit.DURATION)

    @classmethod
    def seconds(cls, s: float) -> "Time":
        return cls(s, TimeUnit.SECOND)

    # -- arithmetic and comparison (same unit only) ---------------------------------------
    def _same_unit(self, other: object, op: str) -> "Time":
        if isinstance(other, str):
            other = Time.from_string(other)
        if not isinstance(other, Time):
            return NotImplemented
        if other.unit is not self.unit:
            raise ValueError(f"cannot {op} {self} and {other}: units differ ({self.unit.value} vs {other.unit.value})")
        return other

    def __add__(self, other):
        other = self._same_unit(other, "add")
        return other if other is NotImplemented else Time(self.value + other.value, self.unit)

    def __sub__(self, other):
        other = self._same_unit(other, "subtract")
        if other is NotImplemented:
            return other
        if other.value > self.value:
            raise ValueError(f"{self} - {other} would be negative")
        return Time(self.value - other.value, self.unit)

    def __mul__(self, factor):
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            return NotImplemented
        value = self.value * factor
        if not math.isfinite(value):
            raise ValueError(f"{self} x {factor!r} is not a finite duration")
        if self.unit in _WHOLE_UNITS:
            value = int(round(value))
        return Time(value, self.unit)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (Time, str)):
            other = self._same_unit(other, "divide")
            return self.value / other.value
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        return self * (1.0 / other)

    def _cmp(self, other, op):
        other = self._same_unit(other, "compare")
        return other if other is NotImplemented else op(self.value, other.value)

    def __lt__(self, other):
        return self._cmp(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._cmp(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._cmp(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._cmp(other, lambda a, b: a >= b)

    def __str__(self) -> str:
        value = self.value
        if isinstance(value, float) and value.is_integer() and self.unit is not TimeUnit.DURATION:
            value = int(value)
        return f"{value}{self.unit.value}"

    def to_dict(self) -> dict:
        return {"value": self.value, "unit": self.unit.value}

    @classmethod
    def from_dict(cls, d: dict) -> "Time":
        return cls(d["value"], TimeUnit(d["unit"]))


def scaled_duration(duration: "TimeLike", scale: float, whole: bool = False) -> str:
    """The budget ``duration`` times ``scale``, in its own unit: at least one whole batch, sample or token, and a
    fraction of an epoch or of wall clock to three significant digits (a budget, not a float's rounding error);
    ``whole`` keeps epochs whole too (a rehearsal of a budget published in whole epochs). The one way a budget is
    scaled: a bench profile's ``duration_scale``, a trial's, a winner's longer budgets, a seed task's rehearsal."""
    time = Time.from_input(duration) * scale
    if isinstance(time.value, int) or (whole and time.unit is TimeUnit.EPOCH):
        return str(Time(max(1, int(round(time.value))), time.unit))
    return str(Time(float(f"{time.value:.3g}"), time.unit))


@dataclasses.dataclass(frozen=True)
class Timestamp:
    """Where training is now, in every unit. Immutable: the trainer replaces it as it advances."""

    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    wall_s: float = 0.0  # training clock: plain evaluation excluded, methods' set-up and eval work included

    def get(self, unit: TimeUnit | str) -> float:
        field = _TIMESTAMP_FIELDS.get(unit)  # a TimeUnit: one lookup (its spelling, "ba", goes through TimeUnit)
        if field is None:
            unit = TimeUnit(unit)
            if unit is TimeUnit.DURATION:
                raise ValueError("a Timestamp does not know the run's length; use State.fraction_done()")
            field = _TIMESTAMP_FIELDS[unit]
        return getattr(self, field)

    def after_batch(self, samples: int, tokens: int = 0, wall_s: float | None = None) -> "Timestamp":
        # Built directly, not with dataclasses.replace: this runs every step, and replace checks every field.
        return Timestamp(epoch=self.epoch, batch=self.batch + 1, sample=self.sample + samples,
                         token=self.token + tokens, batch_in_epoch=self.batch_in_epoch + 1,
                         sample_in_epoch=self.sample_in_epoch + samples, token_in_epoch=self.token_in_epoch + tokens,
                         wall_s=self.wall_s if wall_s is None else wall_s)

    def after_epoch(self) -> "Timestamp":
        return dataclasses.replace(self, epoch=self.epoch + 1, batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0)

    def with_wall(self, wall_s: float) -> "Timestamp":
        return dataclasses.replace(self, wall_s=wall_s)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Timestamp":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
