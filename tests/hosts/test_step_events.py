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


EVAL_BATCH_EVENTS = (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD,
                     Event.EVAL_BATCH_END)


class EvalRecorder(Method):
    """Acts on every evaluation event, remembers them in order, and halves the logits at EVAL_AFTER_FORWARD
    (a stand-in for test-time augmentation), so what is scored must be what the methods left."""

    CARD = make_card("eval_recorder", events=(Event.EVAL_START, *EVAL_BATCH_EVENTS, Event.EVAL_END))

    def __init__(self):
        super().__init__()
        self.seen: list[Event] = []

    def apply(self, event, state, logger):
        self.seen.append(event)
        if event is Event.EVAL_AFTER_FORWARD:
            state.outputs = state.outputs * 0.5


def test_step_runs_an_evaluations_events_and_returns_what_the_methods_left():
    from speedkit.core import State, Time
    from speedkit.train.step import Step

    seen = []
    state = State(model=toy_model(), loss_fn=None, max_duration=Time.from_input("1ba"), device=torch.device("cpu"),
                  precision="fp32", seed=0)

    def run(event):
        seen.append(event)
        if event is Event.EVAL_BEFORE_FORWARD:
            state.batch = state.batch[:1]
        elif event is Event.EVAL_AFTER_FORWARD:
            state.outputs = state.outputs + 1

    step = Step(state, run)
    step.eval_start()
    assert step.eval_batch(torch.zeros(4, 8)).shape == (1, 8)
    assert torch.equal(step.eval_outputs(torch.zeros(1, 3)), torch.ones(1, 3))
    step.eval_batch_end()
    step.eval_end()
    assert seen == [Event.EVAL_START, *EVAL_BATCH_EVENTS, Event.EVAL_END]


def test_a_plain_loop_and_the_trainer_run_an_evaluations_events_in_one_order(tmp_path):
    train, test = toy_loaders(batch_size=32, n=64, shuffle=False)  # one evaluation batch of 64
    in_trainer = EvalRecorder()
    trainer = Trainer(toy_model(), train, eval_dataloader=test, max_duration="1ba", methods=[in_trainer],
                      device="cpu", precision="fp32", run_dir=tmp_path, save_checkpoints=False)
    accuracy = trainer.eval()["eval"]["accuracy"]

    in_loop = EvalRecorder()
    sk = Speedkit([in_loop], max_duration="1ba", train_dataloader=train)
    model = sk.prepare_model(toy_model())
    sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with sk.evaluating():
        for x, y in test:
            x, y = sk.eval_batch((x, y))
            logits = sk.eval_outputs(model(x))
    assert in_loop.seen == in_trainer.seen == [Event.EVAL_START, *EVAL_BATCH_EVENTS, Event.EVAL_END]
    assert torch.allclose(logits, model(x) * 0.5)  # the loop scores what the methods left, as the Trainer does
    assert accuracy == (logits.argmax(1) == y).float().mean().item()
