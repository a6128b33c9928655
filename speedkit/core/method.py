"""The Method base class and the MethodCard every method carries.

A method is one module with two faces: a functional form for any PyTorch loop and an
:class:`Method` that plugs the same code into the Trainer at the events its card declares.
The card is data that the engine (ordering, conflicts), the explorer (controls, badges) and the
README (methods table) all read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import numbers
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

from speedkit.core.event import Event

DOMAINS = ("vision", "language")  # what a task is about, and so its models, its recipes and the methods that suit it
CARD_DOMAINS = (*DOMAINS, "any")  # a method suits one domain, or any

# What a method may read or write. Stages order methods: surgery before precision before data ...
STAGES = ("model", "precision", "data", "batch", "labels", "loss", "gradients", "optimizer", "schedule", "eval")

# What a method may need from the loop that runs it beyond events (``MethodCard.loop_needs``), each with what it
# means. speedkit's Trainer gives them all; a host that does not is refused before training, with this line.
LOOP_NEEDS = {
    "step_closure": "its optimizer step runs the forward, the loss and the backward a second time, with speedkit's "
                    "events, through a closure (optimizer.step(closure))",
}


@dataclasses.dataclass(frozen=True)
class HParam:
    """One hyperparameter: its type, default and the range the explorer offers."""

    name: str
    type: type
    default: Any
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple | None = None
    help: str = ""
    log: bool = False  # spans orders of magnitude: controls step multiplicatively instead of by `step`
    at_most: str | None = None  # another hyperparameter of the same method this one may not exceed (gyro's tau <= sigma)

    def validate(self, value: Any, method: str) -> Any:
        """Return ``value`` checked against this parameter, or raise a message naming both."""
        where = f"{method}.{self.name}"
        if self.choices is not None:
            if not any(_is_choice(value, choice) for choice in self.choices):
                raise ValueError(f"{where} must be one of {list(self.choices)}, got {show(value)}")
            return value
        if self.type is bool:
            if not isinstance(value, bool):
                raise TypeError(f"{where} must be True or False, got {type(value).__name__} {show(value)}")
            return value
        if self.type in (int, float):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{where} must be a number, got {type(value).__name__} {show(value)}")
            if isinstance(value, numbers.Integral):
                value = int(value)  # numpy integers too; compared exactly, however large
            else:
                value = float(value)
                if not math.isfinite(value):
                    raise ValueError(f"{where} must be a finite number in [{self.low}, {self.high}], got {value!r}")
                if self.type is int:
                    if not value.is_integer():
                        raise TypeError(f"{where} must be a whole number, got {value!r}")
                    value = int(value)
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                raise ValueError(f"{where}={show(value)} is outside its range [{self.low}, {self.high}]")
            return self.type(value)
        if not isinstance(value, self.type):
            raise TypeError(f"{where} must be {self.type.__name__}, got {type(value).__name__} {show(value)}")
        return value


def show(value: Any, limit: int = 60) -> str:
    """``repr`` cut short, never failing (an int too long to print, a broken ``__repr__``)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_free_name(kind: str, name: str, current: Any, new: Any, built_in, replace: bool, rename: str) -> None:
    """The one rule for adding ``new`` to a registry (methods, tasks) under ``name``, where ``current`` holds it.

    Re-adding the same object is fine; a built-in name is never taken over; another object's name only
    with ``replace=True``. ``rename`` says what to rename in the message ("your task", "your method's card").
    """
    if current is None or current is new:
        return
    if name in built_in:
        raise ValueError(f"{kind} name {name!r} is built in; give {rename} another name")
    if not replace:
        raise ValueError(f"a different {kind} named {name!r} is registered already; pass replace=True "
                         f"to replace it or give yours another name")


def _is_choice(value: Any, choice: Any) -> bool:
    """``value`` is ``choice`` itself: ``1`` is not ``True`` and ``0.0`` is not ``False`` here."""
    if choice is None or isinstance(choice, bool) or isinstance(value, bool):
        return value is choice
    try:
        return isinstance(value, type(choice)) and bool(value == choice)
    except Exception:  # e.g. an array, whose == is elementwise
        return False


@dataclasses.dataclass(frozen=True)
class MethodCard:
    """Everything other parts of speedkit need to know about a method, as data."""

    name: str
    summary: str
    domain: str
    events: tuple[Event, ...]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    hparams: tuple[HParam, ...] = ()
    requirements: tuple[str, ...] = ()
    conflicts: dict[str, str] = dataclasses.field(default_factory=dict)  # other method -> why / the fix
    exclusive: tuple[str, ...] = ()  # roles only one method may hold, e.g. "loss_mixing"
    runs_after: tuple[str, ...] = ()  # explicit ordering on top of the stage order
    # Whether the set of parameters a step uses varies over the run (by epoch, or at random per rank): True,
    # or only when the method's parameters take these values, e.g. {"mode": "block"}. DDP then looks for
    # unused parameters after each forward, and FSDP refuses the method (every rank must run every block).
    varies_parameters: bool | dict = False
    loop_needs: tuple[str, ...] = ()  # what it needs from the loop beyond events, keys of LOOP_NEEDS
    effect: str = ""
    source: str = ""

    def __post_init__(self):
        if self.domain not in CARD_DOMAINS:
            raise ValueError(f"card {self.name!r}: domain must be one of {CARD_DOMAINS}, got {self.domain!r}")
        bad = [s for s in (*self.reads, *self.writes) if s not in STAGES]
        if bad:
            raise ValueError(f"card {self.name!r}: unknown read/write targets {bad}; known: {STAGES}")
        unknown = [n for n in self.loop_needs if n not in LOOP_NEEDS]
        if unknown:
            raise ValueError(f"card {self.name!r}: unknown loop_needs {unknown}; known: {sorted(LOOP_NEEDS)}")
        object.__setattr__(self, "events", tuple(Event(e) for e in self.events))

    @property
    def stage(self) -> int:
        """The earliest stage this method writes; methods run in stage order, then by name."""
        return min((STAGES.index(w) for w in self.writes), default=len(STAGES))

    def hparam(self, name: str) -> HParam:
        for hp in self.hparams:
            if hp.name == name:
                return hp
        raise KeyError(f"{self.name} has no hyperparameter {name!r}; it has {[h.name for h in self.hparams]}")

    def validate_params(self, params: dict) -> dict:
        """Check keyword arguments against the card: unknown names and out-of-range values are errors."""
        known = {hp.name: hp for hp in self.hparams}
        unknown = sorted(map(str, set(params) - set(known)))
        if unknown:
            close = [m for u in unknown for m in difflib.get_close_matches(u, list(known), n=1)]
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise TypeError(f"{self.name} got unknown parameter(s) {unknown}{hint}; it accepts {sorted(known)}")
        return {k: known[k].validate(v, self.name) for k, v in params.items()}

    def check_constraints(self, params: dict) -> None:
        """Refuse settings that break a constraint between two hyperparameters (``HParam.at_most``); ``params``
        holds every hyperparameter (the defaults filled in)."""
        for hp in self.hparams:
            if hp.at_most is not None and params.get(hp.name) is not None and params.get(hp.at_most) is not None \
                    and params[hp.name] > params[hp.at_most]:
                raise ValueError(f"{self.name}.{hp.name}={params[hp.name]} must not exceed "
                                 f"{hp.at_most}={params[hp.at_most]}; lower {hp.name} or raise {hp.at_most}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["events"] = [e.value for e in self.events]
        d["hparams"] = [{**dataclasses.asdict(h), "type": h.type.__name__} for h in self.hparams]
        return d


class Method:
    """Base class of Trainer methods. Subclasses set ``CARD`` and implement ``apply``.

    ``match`` defaults to "the event is one the card declares", so the card is the truth about
    where a method acts; override it to narrow further (e.g. only every k-th batch).
    """

    CARD: ClassVar[MethodCard]

    def __init__(self, **params):
        """Parameters are checked against the card; those not given take the card's defaults."""
        defaults = {hp.name: hp.default for hp in self.CARD.hparams}
        self.params = {**defaults, **self.CARD.validate_params(params)}
        self.CARD.check_constraints(self.params)

    @property
    def name(self) -> str:
        return self.CARD.name

    @property
    def varies_parameters(self) -> bool:
        """Whether, with these parameters, the set of parameters a step uses varies (read from the card)."""
        varies = self.CARD.varies_parameters
        if isinstance(varies, dict):
            return all(self.params.get(name) == value for name, value in varies.items())
        return bool(varies)

    def match(self, event: Event, state) -> bool:
        return event in self.CARD.events

    def apply(self, event: Event, state, logger) -> None:
        raise NotImplementedError(f"{type(self).__name__}.apply")

    # Methods with state (EMA weights, SWA averages, counters) override these for checkpoints.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # Averaging methods (EMA, SWA) keep weights apart from the model. Hosts (a checkpoint's model weights are the
    # ones evaluation measures) and export (the weights a run ends with) read them through these, never through
    # a method's own attributes, so a new averaging method needs no change outside its module.
    def averaged_weights(self) -> Mapping[str, Any] | None:
        """The weights this method keeps apart from the model, by state-dict name (an average), or None (the
        default: it keeps none, or has none yet)."""
        return None

    def evaluates_average(self) -> bool:
        """Whether evaluation measures :meth:`averaged_weights` in place of the model's (EMA swaps them in)."""
        return False

    def ends_with_average(self) -> bool:
        """Whether FIT_END leaves :meth:`averaged_weights` in the model (the weights the run ends with)."""
        return False

    @contextlib.contextmanager
    def training_weights_in(self, model) -> Iterator[None]:
        """Inside, ``model`` holds the weights training goes on from and :meth:`averaged_weights` the average, even
        during an evaluation that has swapped the average into the model; afterwards both hold what they held
        before. A method that swaps weights in at an event overrides it."""
        yield

    def check_criterion(self, loss_fn: Callable) -> None:
        """Refuse, before the first step, a loss criterion the user gave (``loss_fn``) that already does what this
        method does, so the two would do it twice without a word (label smoothing's). The default accepts any."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


class IncompatibleMethodsError(ValueError):
    """Two methods that cannot run together; the message names both and the fix."""


def order_methods(methods: Sequence[Method]) -> list[Method]:
    """Deterministic order from the cards: stage, then explicit ``runs_after``, then name."""
    by_name = {a.name: a for a in methods}
    pending = sorted(methods, key=lambda a: (a.CARD.stage, a.name))
    ordered: list[Method] = []
    while pending:
        for a in pending:
            waits_for = [n for n in a.CARD.runs_after if n in by_name and by_name[n] not in ordered]
            if not waits_for:
                ordered.append(a)
                pending.remove(a)
                break
        else:
            names = [a.name for a in pending]
            raise IncompatibleMethodsError(f"methods {names} declare a circular runs_after order; fix their cards")
    return ordered


def check_compatibility(methods: Sequence[Method]) -> None:
    """Raise IncompatibleMethodsError for declared conflicts, shared exclusive roles or duplicates."""
    seen: dict[str, Method] = {}
    for a in methods:
        if a.name in seen:
            raise IncompatibleMethodsError(f"{a.name} is listed twice; keep one and set its parameters there")
        seen[a.name] = a
    algos = list(seen.values())
    for i, a in enumerate(algos):
        for b in algos[i + 1:]:
            reason = a.CARD.conflicts.get(b.name) or b.CARD.conflicts.get(a.name)
            if reason:
                raise IncompatibleMethodsError(f"{a.name} and {b.name} cannot be used together: {reason}")
            shared = set(a.CARD.exclusive) & set(b.CARD.exclusive)
            if shared:
                role = sorted(shared)[0]
                raise IncompatibleMethodsError(
                    f"{a.name} and {b.name} both take the role {role!r}, which only one method may hold; "
                    f"remove one of them")


@dataclasses.dataclass
class SurgeryReport:
    """What a model surgery changed: counts by kind and a line per module touched."""

    method: str
    changed: dict = dataclasses.field(default_factory=dict)  # kind -> count
    details: list = dataclasses.field(default_factory=list)  # "layer1.0.conv1: Conv2d -> BlurConv2d"

    def add(self, kind: str, detail: str) -> None:
        self.changed[kind] = self.changed.get(kind, 0) + 1
        self.details.append(detail)

    @property
    def total(self) -> int:
        return sum(self.changed.values())

    def require_changes(self, allow_empty: bool, looked_for: str) -> "SurgeryReport":
        """A surgery that finds nothing to change says so, unless the caller allows it."""
        if self.total == 0 and not allow_empty:
            raise NothingToChangeError(f"{self.method} found no {looked_for} in the model, so it would do nothing; "
                                       f"remove the method or pass allow_empty=True", method=self.method)
        return self

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {kind}" for kind, n in self.changed.items()) or "nothing"
        return f"{self.method}: changed {counts}"


class NothingToChangeError(ValueError):
    """A surgery method found nothing in the model to act on; ``method`` is its name."""

    def __init__(self, message: str, method: str | None = None):
        super().__init__(message)
        self.method = method
