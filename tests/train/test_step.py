"""The one step (speedkit.train.step): its events in order with the work between them, its clock, and the
stopwatch that time to target is read from. The Trainer's whole run is checked in tests/core/test_engine.py
and tests/train/test_time_accounting.py; a host session driving the same step in tests/hosts/test_step_events.py."""
from __future__ import annotations

import pytest
import torch

from speedkit.core import Event, State, Time
from speedkit.record.loggers import Logger, RecordDestination
from speedkit.record.runs import RunRecord
from speedkit.train import step as step_module
from speedkit.train.step import Step, Stopwatch


def _state(**kwargs) -> State:
    return State(model=torch.nn.Linear(2, 2), loss_fn=None, max_duration=Time.from_input("10ba"),
                 device=torch.device("cpu"), precision="fp32", seed=0, record=RunRecord(name="r"), **kwargs)


def _step(state, **kwargs):
    seen = []
    return Step(state, seen.append, **kwargs), seen


def test_a_step_runs_its_events_in_order_with_the_work_between_them():
    state = _state()
    step, seen = _step(state)
    batch = (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    state.skip_step = True  # the last step's: a new step starts unskipped
    step.before_dataloader()
    step.after_dataloader(batch)
    step.begin()
    assert state.batch is batch and state.skip_step is False
    assert step.before_forward() is batch
    step.after_forward("outputs")
    loss = step.loss(lambda outputs, b: (outputs, b))
    assert loss == ("outputs", batch) and state.loss == loss and state.outputs == "outputs"
    step.before_backward()
    step.after_backward()
    step.after_optimizer()
    step.count(batch)
    step.end()
    assert seen == [Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_FORWARD,
                    Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
                    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.BATCH_END]


def test_the_loss_is_what_the_methods_left_after_after_loss():
    state = _state()

    def halve_at_after_loss(event):
        if event is Event.AFTER_LOSS:
            state.loss = state.loss / 2

    step = Step(state, halve_at_after_loss)
    step.after_forward(torch.tensor(4.0))
    assert step.loss(lambda outputs, batch: outputs).item() == 2.0


def test_begin_sets_the_learning_rate_for_the_fraction_done():
    state = _state(schedulers=[])
    from speedkit.optim import get_schedule

    state.optimizers = [torch.optim.SGD(state.model.parameters(), lr=1.0)]
    state.schedulers = [get_schedule("linear_to_zero")]
    state.timestamp = state.timestamp.after_batch(4).after_batch(4).after_batch(4).after_batch(4).after_batch(4)
    step, _ = _step(state)
    step.begin()
    assert state.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.5)


def test_the_clock_counts_every_ranks_samples_and_tokens_or_the_nominal_batch():
    state = _state()
    state.samples_per_batch = 24
    step, seen = _step(state, world=3)
    step.count({"input_ids": torch.zeros(4, 5, dtype=torch.long)})
    ts = state.timestamp
    assert (ts.batch, ts.sample, ts.token, ts.wall_s) == (1, 12, 60, 0.0)  # no stopwatch: no seconds
    step.count(None)  # a host that did not see the batch: the nominal one
    assert (state.timestamp.batch, state.timestamp.sample, state.timestamp.token) == (2, 36, 60)
    step.epoch_end()
    assert (state.timestamp.epoch, state.timestamp.batch_in_epoch, state.timestamp.batch) == (1, 0, 2)
    assert seen == [Event.EPOCH_END]


class _FakeTime:
    """``time.perf_counter`` that moves only when told, so the stopwatch's arithmetic is checked exactly."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _FakeTime()
    monkeypatch.setattr(step_module, "time", fake)
    return fake


def _stopwatch(state, method_seconds=lambda events: 0.0):
    return Stopwatch(state, Logger(state, [RecordDestination(state.record)]), method_seconds)


def test_the_stopwatch_counts_training_and_times_evaluation_and_saving_apart(clock):
    state = _state()
    method_s = {"eval": 0.0}
    watch = _stopwatch(state, lambda events: method_s["eval"])
    step, _ = _step(state, stopwatch=watch)
    watch.fit_started(0.5)  # methods' FIT_START work counts in
    assert state.timestamp.wall_s == 0.5 and state.record.timings["fit_start_s"] == 0.5
    watch.start()
    clock.now += 2.0
    step.count(torch.zeros(4, 2))
    assert state.timestamp.wall_s == 2.5
    with watch.paused():  # an evaluation: 3 s, of which methods (test-time augmentation) 1 s
        started = watch.eval_started()
        clock.now += 3.0
        method_s["eval"] = 1.0
        assert watch.eval_ended(started, training=True) == 3.0
    assert state.timestamp.wall_s == 3.5  # the row the evaluation logs pays its methods' second
    clock.now += 1.0
    step.count(torch.zeros(4, 2))
    assert state.timestamp.wall_s == 4.5
    watch.checkpointed()
    assert state.record.timings["train_s"] == 4.5
    clock.now += 0.25
    watch.stop()
    clock.now += 10.0  # stopped: nothing more counts
    assert watch.elapsed() == 4.75
    assert state.record.timings == {"fit_start_s": 0.5, "eval_s": 3.0, "eval_methods_s": 1.0, "paused_s": 3.0,
                                    "train_s": 4.75}


def test_an_evaluation_outside_training_adds_nothing_to_training_time(clock):
    state = _state()
    method_s = {"eval": 0.0}
    watch = _stopwatch(state, lambda events: method_s["eval"])
    started = watch.eval_started()
    clock.now += 2.0
    method_s["eval"] = 1.0
    assert watch.eval_ended(started, training=False) == 2.0
    assert state.timestamp.wall_s == 0.0 and watch.elapsed() == 0.0
    assert "eval_methods_s" not in state.record.timings


def test_a_resumed_run_continues_from_its_checkpoints_training_time(clock):
    state = _state()
    state.timestamp = state.timestamp.after_batch(4, wall_s=7.0)  # as loaded from a checkpoint
    watch = _stopwatch(state)
    watch.fit_started(0.5)  # the resumed run's own fit start is not counted again
    assert state.timestamp.wall_s == 7.0 and "fit_start_s" not in state.record.timings
    watch.start()
    clock.now += 1.0
    watch.stamp()
    assert state.timestamp.wall_s == 8.0
