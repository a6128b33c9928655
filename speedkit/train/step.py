"""One training step's events, and the run's clock: what every loop that runs speedkit's methods drives.

:class:`Step` runs the events of a step in order, with what happens between them that does not depend on
the loop (schedules before BATCH_START, the outputs and the loss put on the State, a step a method skips,
the clock after the optimizer step). Whoever drives it does the loop's own work between the calls:
speedkit's Trainer (``speedkit.train.trainer``, where the step reads top to bottom) and every host through
``speedkit.hosts.session`` (a plain loop, Accelerate, Lightning, the Hugging Face Trainer)::

    step.before_dataloader()           BEFORE_DATALOADER                   (the Trainer's loader only)
    step.after_dataloader(batch)       AFTER_DATALOADER
    step.begin()                       schedules for the fraction done, BATCH_START
    for each microbatch:
        step.before_forward()          BEFORE_FORWARD; returns the batch the forward takes
        step.after_forward(outputs)    AFTER_FORWARD
        step.loss(fn)                  BEFORE_LOSS, state.loss = fn(outputs, batch), AFTER_LOSS
        step.before_backward()         BEFORE_BACKWARD
        step.after_backward()          AFTER_BACKWARD
    step.after_optimizer()             AFTER_TRAIN_BATCH
    step.count(batch)                  the clock: a batch, its samples and tokens on every rank, the seconds
    step.end()                         BATCH_END

An evaluation's events, in the same way::

    step.eval_start()                  EVAL_START                          (EMA swaps its average in)
    for each evaluation batch:
        step.eval_batch(batch)         EVAL_BATCH_START, EVAL_BEFORE_FORWARD; returns the batch the forward takes
        step.eval_outputs(outputs)     EVAL_AFTER_FORWARD; returns the outputs to score (test-time augmentation)
        step.eval_batch_end()          EVAL_BATCH_END                      (after the metrics, where the loop has them)
    step.eval_end()                    EVAL_END                            (EMA swaps it back out)

:class:`Stopwatch` is the one measure of training time, which time to target is read from: evaluation and
saving are timed apart, what methods do at FIT_START and at evaluation counts in.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from speedkit.core import Event, State
from speedkit.core.batch import batch_size, batch_tokens
from speedkit.core.event import EVAL_EVENTS
from speedkit.train.parts import apply_schedules

# Module constants: an Enum member looked up on its class costs a little on every event of every step.
_BEFORE_DATALOADER, _AFTER_DATALOADER = Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER
_BATCH_START, _BATCH_END, _AFTER_TRAIN_BATCH = Event.BATCH_START, Event.BATCH_END, Event.AFTER_TRAIN_BATCH
_BEFORE_FORWARD, _AFTER_FORWARD = Event.BEFORE_FORWARD, Event.AFTER_FORWARD
_BEFORE_LOSS, _AFTER_LOSS = Event.BEFORE_LOSS, Event.AFTER_LOSS
_BEFORE_BACKWARD, _AFTER_BACKWARD = Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD
_EVAL_BATCH_START, _EVAL_BEFORE_FORWARD = Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD
_EVAL_AFTER_FORWARD, _EVAL_BATCH_END = Event.EVAL_AFTER_FORWARD, Event.EVAL_BATCH_END


class Step:
    """The events of a training step on ``state``, in order (see the module's docstring), and its clock.

    ``run(event)`` runs the methods and callbacks at an event (``Engine.run_event``, or a host session's,
    which also notes the events served). ``world``: processes training together (DDP, Accelerate), whose
    samples the clock counts. ``stopwatch``: the run's :class:`Stopwatch`, whose reading each counted batch
    carries (``Timestamp.wall_s``); without one (a host, which owns its clock's seconds) it stays as it was.
    """

    def __init__(self, state: State, run: Callable[[Event], None], *, world: int = 1,
                 stopwatch: "Stopwatch | None" = None):
        self.state, self.run = state, run
        self.world = world
        self.stopwatch = stopwatch

    # -- the loader's batch -------------------------------------------------------------------
    def before_dataloader(self) -> None:
        self.run(_BEFORE_DATALOADER)

    def after_dataloader(self, batch) -> None:
        """The loader's ``batch`` on the State, then AFTER_DATALOADER (methods may replace it)."""
        self.state.batch = batch
        self.run(_AFTER_DATALOADER)

    # -- the step -------------------------------------------------------------------------------
    def begin(self) -> None:
        """A new step: no method has skipped it yet, the schedules set for the fraction done, BATCH_START."""
        self.state.skip_step = False
        apply_schedules(self.state)
        self.run(_BATCH_START)

    def before_forward(self):
        """BEFORE_FORWARD; returns the batch the forward takes (resized, mixed, cut to a sequence length)."""
        self.run(_BEFORE_FORWARD)
        return self.state.batch

    def after_forward(self, outputs) -> None:
        self.state.outputs = outputs
        self.run(_AFTER_FORWARD)

    def loss(self, fn: Callable) -> torch.Tensor:
        """BEFORE_LOSS, ``state.loss = fn(state.outputs, state.batch)``, AFTER_LOSS; returns the loss as the
        methods left it (label smoothing, mixup's mixed labels act on it)."""
        state = self.state
        self.run(_BEFORE_LOSS)
        state.loss = fn(state.outputs, state.batch)
        self.run(_AFTER_LOSS)
        return state.loss

    def before_backward(self) -> None:
        self.run(_BEFORE_BACKWARD)

    def after_backward(self) -> None:
        self.run(_AFTER_BACKWARD)

    def after_optimizer(self) -> None:
        """AFTER_TRAIN_BATCH: after the optimizer step (EMA's update, Lookahead's sync)."""
        self.run(_AFTER_TRAIN_BATCH)

    def count(self, batch=None) -> None:
        """The clock advances by one batch: ``batch``'s samples and tokens on every rank (without a batch,
        the nominal batch), and the stopwatch's training seconds."""
        state, world = self.state, self.world
        if batch is not None:
            samples, tokens = batch_size(batch) * world, batch_tokens(batch) * world
        else:
            samples, tokens = state.samples_per_batch or 0, 0
        wall_s = self.stopwatch.elapsed() if self.stopwatch is not None else None
        state.timestamp = state.timestamp.after_batch(samples, tokens, wall_s=wall_s)

    def end(self) -> None:
        self.run(_BATCH_END)

    # -- epochs ---------------------------------------------------------------------------------
    def epoch_start(self) -> None:
        self.run(Event.EPOCH_START)

    def epoch_end(self) -> None:
        """The clock's epoch advances, then the methods hear of it (EPOCH_END)."""
        self.state.timestamp = self.state.timestamp.after_epoch()
        self.run(Event.EPOCH_END)

    # -- evaluation -----------------------------------------------------------------------------
    def eval_start(self) -> None:
        self.run(Event.EVAL_START)

    def eval_batch(self, batch):
        """The evaluation ``batch`` on the State, EVAL_BATCH_START and EVAL_BEFORE_FORWARD; returns the batch the
        forward takes."""
        self.state.batch = batch
        self.run(_EVAL_BATCH_START)
        self.run(_EVAL_BEFORE_FORWARD)
        return self.state.batch

    def eval_outputs(self, outputs):
        """``outputs`` on the State, then EVAL_AFTER_FORWARD; returns the outputs to score, as the methods left
        them (test-time augmentation averages in its flipped view)."""
        self.state.outputs = outputs
        self.run(_EVAL_AFTER_FORWARD)
        return self.state.outputs

    def eval_batch_end(self) -> None:
        self.run(_EVAL_BATCH_END)

    def eval_end(self) -> None:
        self.run(Event.EVAL_END)


class Stopwatch:
    """Training time, the one clock time to target is read from; evaluation and saving are timed apart.

    It runs while the loop trains (from the first epoch's start, the loader's workers starting included) and
    stops while the run evaluates or saves (:meth:`paused`). What methods do at FIT_START (a fit on the
    data, optimizer wrapping) and at evaluation (test-time augmentation, EMA/SWA weight swaps) is training
    and counts in; a plain evaluation does not. Its reading is ``state.timestamp.wall_s``, so every logged
    row's ``wall_s`` (an evaluation row's: the training time its metrics took to reach). The record's timings
    come from here, through the logger: ``fit_start_s``, ``eval_s``, ``eval_methods_s``, ``paused_s``,
    ``train_s``, and ``data_s``, the part of ``train_s`` the loop spent taking its next batch from the loader.

    ``method_seconds(events)``: the seconds methods have spent at ``events`` so far (``Engine.seconds_at``).
    """

    def __init__(self, state: State, logger, method_seconds: Callable[[tuple], float]):
        self.state, self.logger, self._method_seconds = state, logger, method_seconds
        self.offset, self._started = 0.0, None
        self._data_s = 0.0  # taking batches since the record last heard of it

    # -- the clock --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started is None:
            self._started = time.perf_counter()

    def pause(self) -> None:
        if self._started is not None:
            self.offset += time.perf_counter() - self._started
            self._started = None

    def elapsed(self) -> float:
        """Training seconds so far."""
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self.offset + running

    def stamp(self) -> None:
        """``state.timestamp.wall_s`` to the reading now (a run whose length is wall-clock checks it often)."""
        self.state.timestamp = self.state.timestamp.with_wall(self.elapsed())

    # -- what counts --------------------------------------------------------------------------------
    def fit_started(self, fit_start_s: float) -> None:
        """Set at fit start. A fresh run's clock starts at what its methods did at FIT_START (part of training,
        so of time to target, and reported apart as ``fit_start_s``); a resumed run's continues from its
        checkpoint's, which already counts the first run's fit start."""
        state = self.state
        if state.timestamp.batch == 0:
            state.timestamp = state.timestamp.with_wall(fit_start_s)
            self.logger.log_timing("fit_start_s", fit_start_s)
        self.offset, self._started = state.timestamp.wall_s, None

    @contextlib.contextmanager
    def paused(self):
        """Evaluating or saving: the clock stops (the seconds go to ``paused_s``)."""
        self.pause()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.start()
            self.logger.log_timing("paused_s", time.perf_counter() - start, add=True)

    def eval_started(self) -> tuple[float, float]:
        """An evaluation begins; pass what this returns to :meth:`eval_ended`."""
        return time.perf_counter(), self._method_seconds(EVAL_EVENTS)

    def eval_ended(self, started: tuple[float, float], training: bool) -> float:
        """An evaluation ended: its seconds go to ``eval_s``; returns them. In a ``training`` run (fit has
        started), what methods added to it (test-time augmentation, weight swaps) is training time, added
        now, before the caller logs the metrics: the row that reaches a target pays its own."""
        start, method_s_before = started
        eval_s = time.perf_counter() - start
        self.logger.log_timing("eval_s", eval_s, add=True)
        method_s = self._method_seconds(EVAL_EVENTS) - method_s_before
        if training and method_s > 0:
            self.offset += method_s
            self.state.timestamp = self.state.timestamp.with_wall(self.state.timestamp.wall_s + method_s)
            self.logger.log_timing("eval_methods_s", method_s, add=True)
        return eval_s

    @contextlib.contextmanager
    def taking_data(self):
        """The loop takes its next batch (waiting for the loader's workers, or an in-process loader's own work):
        still training time, and also counted in ``data_s``, so a record says what share of training went to
        data rather than to the step; near zero where the loader keeps up."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._data_s += time.perf_counter() - start

    # -- the record ---------------------------------------------------------------------------------
    def checkpointed(self) -> None:
        """A checkpoint is written: its record carries the training time of the batches it holds."""
        self.logger.log_timing("train_s", self.state.timestamp.wall_s)
        self._hand_over_data_s()

    def stop(self) -> None:
        """The run ends: the clock stops and ``train_s`` is its reading (a final save sets the checkpoint's own)."""
        self.pause()
        self.logger.log_timing("train_s", self.elapsed())
        self._hand_over_data_s()

    def _hand_over_data_s(self) -> None:
        # Summed here and handed over at a save or the end, not logged per batch: the record (a resumed run's
        # included) adds each part once.
        if self._data_s:
            self.logger.log_timing("data_s", self._data_s, add=True)
            self._data_s = 0.0
