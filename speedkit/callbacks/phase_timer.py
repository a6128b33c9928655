"""Where a run's time goes: data, forward, loss, backward, optimizer, evaluation, and the rest.

``PhaseTimer`` is a callback, so the Trainer needs no changes: the Engine runs callbacks at every
event, and the time from one event to the next belongs to one phase of the loop. It also opens a
``torch.profiler.record_function`` range per phase, so a torch.profiler trace (or its table of
operators) is grouped by the same phases.

Methods' work at an event runs before the callbacks there, so it counts towards the phase that
ends at that event (e.g. batch augmentation at AFTER_DATALOADER counts as data).
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import torch

from speedkit.core.devices import synchronize
from speedkit.core.engine import Callback
from speedkit.core.event import Event

PHASES = ("data", "forward", "loss", "backward", "optimizer", "evaluation", "other")

# The phase that runs from each of these events to the next one; every other gap is "other"
# (method hooks, schedules, logging).
_PHASE_FROM = {
    Event.BEFORE_DATALOADER: "data",
    Event.BEFORE_FORWARD: "forward",
    Event.BEFORE_LOSS: "loss",
    Event.BEFORE_BACKWARD: "backward",
    Event.AFTER_BACKWARD: "optimizer",  # then the step and zero_grad, up to AFTER_TRAIN_BATCH
    **{event: "evaluation" for event in Event if event.is_eval},  # EVAL_END: then logging the results
}


class PhaseTimer(Callback):
    """Wall-clock seconds per phase of the training loop, measured from FIT_START to FIT_END.

    It synchronizes the device at every event, so on a GPU each phase gets its own kernels' time
    (at some cost to throughput: use it for a profile run, not a benchmark run).
    """

    def __init__(self, label_prefix: str = "speedkit/"):
        self.label_prefix = label_prefix
        self.seconds: collections.Counter = collections.Counter()
        self.steps = 0
        self._phase: str | None = None
        self._since = 0.0
        self._range = None

    def run_event(self, event: Event, state, logger) -> None:
        if event is Event.INIT:
            return
        synchronize(state.device)
        now = time.perf_counter()
        if self._phase is not None:
            self.seconds[self._phase] += now - self._since
        if event is Event.AFTER_TRAIN_BATCH:
            self.steps += 1
        self._enter(None if event is Event.FIT_END else _PHASE_FROM.get(event, "other"), now)

    def _enter(self, phase: str | None, now: float) -> None:
        if phase != self._phase:
            if self._range is not None:
                self._range.__exit__(None, None, None)
                self._range = None
            if phase is not None:
                self._range = torch.profiler.record_function(self.label_prefix + phase)
                self._range.__enter__()
        self._phase, self._since = phase, now

    def breakdown(self) -> dict:
        """``{phase: {"s", "share", "per_step_ms"}}`` plus the total and the number of steps."""
        total = sum(self.seconds.values())
        phases = {name: {"s": round(self.seconds.get(name, 0.0), 4),
                         "share": round(self.seconds.get(name, 0.0) / total, 4) if total else None,
                         "per_step_ms": round(1000 * self.seconds.get(name, 0.0) / self.steps, 3)
                         if self.steps else None}
                  for name in PHASES}
        return {"steps": self.steps, "total_s": round(total, 4), "phases": phases}


def top_operators(prof, limit: int = 10) -> list[dict]:
    """The operators with the most self time in a finished torch.profiler run (phase ranges left out)."""
    device_attr = "self_device_time_total"
    rows = []
    for event in prof.key_averages():
        if event.key.startswith("speedkit/") or event.key.startswith("ProfilerStep"):
            continue
        row = {"name": event.key, "calls": event.count, "self_cpu_ms": round(event.self_cpu_time_total / 1000, 3)}
        device_us = getattr(event, device_attr, 0) or 0
        if device_us:
            row["self_device_ms"] = round(device_us / 1000, 3)
        rows.append(row)
    key = "self_device_ms" if any("self_device_ms" in r for r in rows) else "self_cpu_ms"
    return sorted(rows, key=lambda r: r.get(key, 0.0), reverse=True)[:limit]


def profile_steps(trainer_factory: Callable[..., object], steps: int = 300, torch_profiler: bool = True,
                  top: int = 10, trace_path: str | None = None) -> dict:
    """Train ``steps`` batches of the run ``trainer_factory(duration=..., callbacks=[...])`` builds
    (e.g. a ``functools.partial`` of ``make_trainer``) and report where the time went, by phase.

    With ``torch_profiler`` the run is also recorded by torch.profiler, whose busiest operators are
    listed (and its trace written to ``trace_path`` if given); its overhead inflates every phase a
    little, the shares stay comparable.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    timer = PhaseTimer()
    trainer = trainer_factory(duration=f"{steps}ba", callbacks=[timer])
    if not torch_profiler:
        trainer.fit()
        return timer.breakdown()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if trainer.state.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        trainer.fit()
    if trace_path:
        prof.export_chrome_trace(str(trace_path))
    return {**timer.breakdown(), "top_operators": top_operators(prof, top), "under_torch_profiler": True}
