"""A host's session and speedkit's Trainer drive the same Step (speedkit.train.step): a plain loop's step runs
the Trainer's step events in the Trainer's order, and its clock counts the same samples. (EPOCH_START is left
out: a loop's epoch starts at its first ``sk.batch``, after that batch's AFTER_DATALOADER.)"""
from __future__ import annotations

import torch
from helpers import make_card, toy_loaders, toy_model

from speedkit.core import Event, Method
from speedkit.hosts import Speedkit
from speedkit.hosts.session import STEP_EVENTS
from speedkit.train.trainer import Trainer


class StepRecorder(Method):
    """Acts on every per-step event and at epoch ends, and remembers them in order."""

    CARD = make_card("step_recorder", events=STEP_EVENTS + (Event.EPOCH_END,))

    def __init__(self):
        super().__init__()
        self.seen: list[Event] = []

    def apply(self, event, state, logger):
        self.seen.append(event)


def test_a_plain_loop_runs_the_trainers_step_events_in_its_order(tmp_path):
    train, _ = toy_loaders(batch_size=32, n=64, shuffle=False)  # 2 batches an epoch
    in_trainer = StepRecorder()
    trainer = Trainer(toy_model(), train, max_duration="3ba", methods=[in_trainer], device="cpu", run_dir=tmp_path,
                      save_checkpoints=False)
    trainer.fit()

    in_loop = StepRecorder()
    sk = Speedkit([in_loop], max_duration="3ba", train_dataloader=train)
    model = sk.prepare_model(toy_model())
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    while not sk.done:
        for batch in train:
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            optimizer.step()
            optimizer.zero_grad()
            sk.step_end()
            if sk.done:
                break

    assert in_loop.seen == in_trainer.seen
    assert in_trainer.seen.count(Event.BEFORE_FORWARD) == 3 and in_trainer.seen.count(Event.EPOCH_END) == 1
    assert sk.state.timestamp.sample == trainer.state.timestamp.sample == 96
