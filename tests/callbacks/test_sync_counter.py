"""The host never waits on the device inside a training step between logging intervals, counted on a CPU.

A ``SyncCounter`` sees every read of a device value (``.item()``, ``bool()``, ``float()``), speedkit's own
deliberate reads and synchronizes, and collectives; on a CPU these cost nothing, so only a count catches
a GPU regression here. Every preset of both built-in tasks runs a few steps at tiny scale with the default
callbacks (the NaN guard, speed and LR monitors).
"""
from __future__ import annotations

import pytest
import torch
from helpers import toy_loaders, toy_model
from prerequisites import require

from speedkit.callbacks import Callback, SyncCounter
from speedkit.core.devices import synchronize, to_host
from speedkit.tasks import make_trainer
from speedkit.tasks import TASKS
from speedkit.tasks.task import BUILT_IN
from speedkit.train.trainer import Trainer

PRESETS = [(task, name) for task in sorted(BUILT_IN) for name in TASKS[task].recipes]
LOG_EVERY = 3


def counted_run(tmp_path, task, name, callbacks=()):
    require("fashion-mnist" if task == "fashion-mnist" else "python-docs")
    counter = SyncCounter(keep_stacks=True)
    trainer = make_trainer(task, name, duration="7ba", batch_size=8, data_fraction=0.01, eval_fraction=0.005,
                           eval_interval="3ba", log_interval=LOG_EVERY, device="cpu", run_dir=tmp_path,
                           save_checkpoints=False, callbacks=[counter, *callbacks])
    record = trainer.fit()
    assert record.status == "completed"
    return counter, record


@pytest.mark.parametrize("task, name", PRESETS, ids=[f"{t}:{n}" for t, n in PRESETS])
def test_no_host_wait_in_a_step_between_logging_intervals_and_one_per_evaluation(tmp_path, task, name):
    counter, record = counted_run(tmp_path, task, name)
    quiet = counter.quiet_steps()
    assert set(quiet) == {2, 4, 5}, counter.report()  # neither logged nor evaluated after (7 is the last)
    where = "\n".join(stack for (phase, stack) in counter.stacks if phase[1] > 1 and phase[1] in quiet)
    assert sum(quiet.values()) == 0, f"host waits in quiet steps {quiet}:\n{where}"
    # Evaluations at batches 3 and 6 and the final one: each reads its metrics once, not once per batch.
    assert len(counter.evals) == 3 and all(n <= 1 for n in counter.evals), counter.evals
    assert record.notes["syncs"]["waits_in_quiet_steps"] == 0


def test_an_item_added_to_the_step_is_counted(tmp_path):
    class ReadsTheLoss(Callback):
        def after_loss(self, state, logger):
            float(state.loss)  # the regression: one host wait per microbatch

    counter, _ = counted_run(tmp_path, "pydocs", "hot", callbacks=[ReadsTheLoss()])
    quiet = counter.quiet_steps()
    assert quiet and all(n >= 1 for n in quiet.values()), quiet
    assert counter.totals["item"] >= len(quiet)


def test_the_counter_sees_each_kind_of_wait_and_nothing_else():
    x = torch.randn(4)
    with SyncCounter() as counter:
        y = (x * 2).sum()  # device work: no wait
        y.item()
        bool(y > 0)
        float(y)
        if y:
            pass
        to_host(torch.stack([y, y]))  # speedkit's deliberate read: one wait however many values
        synchronize(torch.device("cpu"))
    assert dict(counter.totals) == {"item": 4, "host_read": 1, "device_sync": 1}
    assert counter.total == 6
    y.item()  # after the block: no longer counted
    assert counter.total == 6


def test_an_optimizers_step_count_on_the_host_is_not_a_wait():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)  # reads its CPU step count with .item()
    with SyncCounter() as counter:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
    assert counter.total == 0, dict(counter.totals)


def test_a_run_that_fails_stops_counting(tmp_path):
    class Fails(Callback):
        def batch_end(self, state, logger):
            raise RuntimeError("boom")

    train, _ = toy_loaders()
    counter = SyncCounter()
    trainer = Trainer(toy_model(), train, max_duration="2ba", device="cpu", run_dir=tmp_path,
                      save_checkpoints=False, callbacks=[counter, Fails()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    before = counter.total
    torch.ones(()).item()
    assert counter.total == before  # the dispatch mode was popped when the run ended
