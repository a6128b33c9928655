"""State: everything a method or callback may read or change during a run."""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from speedkit.core import batch as batch_view
from speedkit.core.time import Time, Timestamp, TimeUnit


class State:
    """The run's mutable state. Methods act on it; the Trainer (or a host's session) advances it.

    Every field is declared in ``__init__``, grouped by who sets it; nothing else adds one
    (``tests/core/test_state_fields.py`` reads the package for assignments to undeclared fields).
    ``batch`` is whatever the dataloader yields: ``(inputs, targets, ...)``, a dict or a tensor, read and
    rewritten through ``speedkit.core.batch``; methods rewrite it at AFTER_DATALOADER / BEFORE_FORWARD.
    ``outputs`` and ``loss`` hold the current microbatch's.
    """

    def __init__(self, *, model: torch.nn.Module, loss_fn: Callable, max_duration: Time,
                 device: torch.device, precision: str, seed: int, optimizers=(), schedulers=(),
                 methods=(), callbacks=(), train_dataloader=None, evaluators=(), record=None,
                 schedule_scale: float = 1.0, log_every: int = 10, autocast: Callable | None = None,
                 grad_scaler=None):
        # The run's parts: what trains, on what, with what (methods may replace them at INIT and FIT_START).
        self.model = model
        self.loss_fn = loss_fn
        self.optimizers: list[torch.optim.Optimizer] = list(optimizers)
        self.schedulers: list = list(schedulers)
        self.methods: list = list(methods)
        self.callbacks: list = list(callbacks)
        self.train_dataloader = train_dataloader
        self.evaluators: list = list(evaluators)
        self.record = record
        self.device = device
        self.precision = precision
        self.seed = seed
        self.log_every = log_every  # batches between the loss's logged rows (and the monitors' readings)

        # The run's length and where it is.
        self.schedule_scale = schedule_scale
        # The user's duration before the schedule scale ratio; schedules are fractions of it.
        self.original_max_duration = max_duration
        self.max_duration = max_duration * schedule_scale if max_duration.unit is not TimeUnit.DURATION else max_duration
        self.timestamp = Timestamp()
        # Nominal sizes, filled in by the Trainer at FIT_START, used to convert between units.
        self.batches_per_epoch: int | None = None
        self.samples_per_batch: int | None = None
        self.tokens_per_batch: int | None = None

        # The step in flight (speedkit.train.step) and the last evaluation.
        self.batch: Any = None
        self.outputs: Any = None
        self.loss: torch.Tensor | None = None
        self.microbatch_index = 0
        self.num_microbatches = 1
        self.skip_step = False  # set by a method or the NaN guard to skip this optimizer step
        self.last_train_loss: float | None = None
        self.eval_metrics: dict[str, dict[str, float]] = {}  # evaluator label -> metric -> value
        self.current_evaluator = None

        # Autocast context factory and fp16 scaler, set by the Trainer (and by precision methods).
        self.autocast: Callable | None = autocast
        self.grad_scaler = grad_scaler

        # Stopping, asked from any thread.
        self._stop = threading.Event()
        self.stop_reason: str | None = None

    # -- stopping (safe from any thread) --------------------------------------------------
    def request_stop(self, reason: str = "stopped") -> None:
        if not self._stop.is_set():
            self.stop_reason = reason
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    # -- progress -------------------------------------------------------------------------
    def batch_inputs(self):
        """The current batch's inputs, whatever its shape (see ``speedkit.core.batch``)."""
        return batch_view.batch_inputs(self.batch)

    def batch_targets(self):
        """The current batch's labels, or None."""
        return batch_view.batch_targets(self.batch)

    def progress(self, unit: TimeUnit) -> float:
        """Progress so far in ``unit``; epochs count fractionally within the current epoch."""
        unit = unit if isinstance(unit, TimeUnit) else TimeUnit(unit)
        ts = self.timestamp
        if unit is TimeUnit.EPOCH:
            per_epoch = self.batches_per_epoch or 1
            return ts.epoch + ts.batch_in_epoch / per_epoch
        return float(ts.get(unit))

    def fraction_done(self) -> float:
        """Fraction of the (scaled) run completed, in [0, 1]."""
        total = self.max_duration
        if total.value == 0:
            return 1.0
        return min(1.0, self.progress(total.unit) / total.value)

    def is_done(self) -> bool:
        return self.fraction_done() >= 1.0

    def convert(self, time: Time, unit: TimeUnit) -> float:
        """Express ``time`` in ``unit`` using the nominal batch size and epoch length."""
        unit = TimeUnit(unit)
        if time.unit is unit:
            return float(time.value)
        if TimeUnit.SECOND in (time.unit, unit) or TimeUnit.DURATION in (time.unit, unit):
            raise ValueError(f"cannot convert {time} to {unit.value}: wall-clock and fraction times only "
                             f"convert to themselves; give it in the same unit as max_duration")
        return time.value * self._batches_per(time.unit, time) / self._batches_per(unit, time)

    def _batches_per(self, unit: TimeUnit, time: Time) -> float:
        """How many batches one ``unit`` is, from the run's nominal sizes."""
        if unit is TimeUnit.BATCH:
            return 1.0
        attr = {TimeUnit.EPOCH: "batches_per_epoch", TimeUnit.SAMPLE: "samples_per_batch",
                TimeUnit.TOKEN: "tokens_per_batch"}[unit]
        value = getattr(self, attr)
        if not value:
            raise ValueError(f"cannot convert {time}: the run's {attr.replace('_', ' ')} is unknown")
        return float(value) if unit is TimeUnit.EPOCH else 1.0 / float(value)

    def to_fraction(self, time: Time | str) -> float:
        """A Time as a fraction of the user's (unscaled) run, so schedules keep their shape under scaling."""
        time = Time.from_input(time)
        if time.unit is TimeUnit.DURATION:
            return float(time.value)
        total = self.original_max_duration
        if total.unit is TimeUnit.DURATION:
            raise ValueError("max_duration cannot be given in 'dur'")
        return self.convert(time, total.unit) / total.value

    def reached(self, time: Time) -> bool:
        """Whether the run has reached ``time`` (a point measured from the start)."""
        if time.unit is TimeUnit.DURATION:
            return self.fraction_done() >= time.value
        return self.progress(time.unit) >= self.convert(time, time.unit)

    def __repr__(self) -> str:
        return f"State(timestamp={self.timestamp}, max_duration={self.max_duration}, device={self.device})"


class Interval:
    """Fires each time training passes another multiple of ``every`` (``"1ep"``, ``"500ba"``, ``"0.25dur"``).

    Whole-epoch intervals fire at epoch ends, others at batch ends. ``due`` advances the next mark, so a
    resumed run (whose progress starts past zero) fires at the same points as an uninterrupted one.
    """

    def __init__(self, every: Time | str):
        self.every = Time.from_input(every)
        if self.every is None:
            raise TypeError("an interval needs a duration such as '1ep', '500ba' or '0.25dur', got None")
        if self.every.value <= 0:
            raise ValueError(f"an interval must be positive, got {self.every}")
        self._last_mark = 0

    def _progress_and_step(self, state: State) -> tuple[float, float]:
        if self.every.unit is TimeUnit.DURATION:
            return state.fraction_done(), float(self.every.value)
        if self._at_epoch_ends:
            return float(state.timestamp.epoch), float(self.every.value)
        return state.progress(self.every.unit), float(self.every.value)

    @property
    def _at_epoch_ends(self) -> bool:
        """Whole-epoch intervals fire at epoch ends; "0.5ep" and every other unit at batch ends."""
        return self.every.unit is TimeUnit.EPOCH and float(self.every.value).is_integer()

    def start(self, state: State) -> None:
        """Count marks already passed (a resumed run) as done."""
        progress, step = self._progress_and_step(state)
        self._last_mark = int(progress / step + 1e-9)

    def due(self, state: State, at_epoch_end: bool) -> bool:
        if self._at_epoch_ends != at_epoch_end:
            return False
        progress, step = self._progress_and_step(state)
        mark = int(progress / step + 1e-9)
        if mark >= 1 and mark != self._last_mark:
            self._last_mark = mark
            return True
        return False
