"""The engine: event order, per-microbatch events, method ordering, conflicts and parameter checks."""
from __future__ import annotations

import pytest
from helpers import Recorder, make_card, method_class, toy_loaders, toy_model

from speedkit import Trainer
from speedkit.core import Event, HParam, IncompatibleMethodsError, MethodCard
from speedkit.core.method import Method, order_methods

TRAIN_STEP = [Event.BATCH_START]
MICRO = [Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
         Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD]
EVAL_BATCH = [Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD, Event.EVAL_BATCH_END]


def test_recorder_sees_every_event_in_documented_order_with_microbatches(tmp_path):
    train, test = toy_loaders(batch_size=32, n=96)  # 3 batches per epoch
    recorder = Recorder()
    trainer = Trainer(toy_model(), train, eval_dataloader=test, max_duration="2ep", methods=[recorder],
                      microbatch_size=16, device="cpu", run_dir=tmp_path, save_interval="1ep")
    trainer.fit()
    events = [e for e, _ in recorder.seen]

    one_batch = ([Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START] + MICRO * 2
                 + [Event.AFTER_TRAIN_BATCH, Event.BATCH_END, Event.BATCH_CHECKPOINT])
    evaluation = [Event.EVAL_START] + EVAL_BATCH + [Event.EVAL_END]  # 96 samples, eval batch 128: one batch
    one_epoch = ([Event.EPOCH_START] + one_batch * 3 + [Event.EPOCH_END] + evaluation + [Event.EPOCH_CHECKPOINT])
    expected = [Event.INIT, Event.FIT_START] + one_epoch * 2 + [Event.FIT_END]
    assert events == expected
    # Microbatch events carry their index: 0 then 1 within every batch.
    micro_indices = [i for e, i in recorder.seen if e is Event.BEFORE_FORWARD]
    assert micro_indices == [0, 1] * 6
    # The engine's trace counts the same applications.
    counts = trainer.engine.events_of("recorder")
    assert counts[Event.BEFORE_FORWARD] == 12 and counts[Event.BATCH_START] == 6 and counts[Event.FIT_START] == 1


def test_methods_run_in_stage_order_and_reverse_on_after_events(tmp_path):
    log = []
    early = method_class("zz_surgery", writes=("model",), log=log)()
    late = method_class("aa_loss", writes=("loss",), log=log)()
    train, _ = toy_loaders(n=32)
    trainer = Trainer(toy_model(), train, max_duration="1ba", methods=[late, early], device="cpu",
                      run_dir=tmp_path, save_checkpoints=False)
    assert [a.name for a in trainer.state.methods] == ["zz_surgery", "aa_loss"]  # stage beats name
    trainer.fit()
    at_start = [n for e, n in log if e is Event.BATCH_START]
    after_forward = [n for e, n in log if e is Event.AFTER_FORWARD]
    assert at_start == ["zz_surgery", "aa_loss"]
    assert after_forward == ["aa_loss", "zz_surgery"]


def test_runs_after_and_cycles():
    a = method_class("a", writes=("loss",), runs_after=("b",))()
    b = method_class("b", writes=("loss",))()
    assert [x.name for x in order_methods([a, b])] == ["b", "a"]
    c = method_class("c", runs_after=("d",))()
    d = method_class("d", runs_after=("c",))()
    with pytest.raises(IncompatibleMethodsError, match="circular"):
        order_methods([c, d])


def test_declared_conflict_names_both_methods_and_the_fix(tmp_path):
    first = method_class("mix_one", conflicts={"mix_two": "both mix the loss; keep one"})()
    second = method_class("mix_two")()
    train, _ = toy_loaders()
    with pytest.raises(IncompatibleMethodsError) as info:
        Trainer(toy_model(), train, methods=[first, second], device="cpu", run_dir=tmp_path)
    message = str(info.value)
    assert "mix_one" in message and "mix_two" in message and "keep one" in message


def test_conflict_added_after_init_is_caught_at_fit_start(tmp_path):
    train, _ = toy_loaders()
    trainer = Trainer(toy_model(), train, methods=[method_class("x", exclusive=("loss_mixing",))()],
                      device="cpu", run_dir=tmp_path)
    trainer.state.methods.append(method_class("y", exclusive=("loss_mixing",))())
    with pytest.raises(IncompatibleMethodsError, match="loss_mixing"):
        trainer.fit()


def test_same_method_twice_is_refused(tmp_path):
    cls = method_class("twice")
    train, _ = toy_loaders()
    with pytest.raises(IncompatibleMethodsError, match="twice is listed twice"):
        Trainer(toy_model(), train, methods=[cls(), cls()], device="cpu", run_dir=tmp_path)


class Tunable(Method):
    CARD = MethodCard(name="tunable", summary="t", domain="any", events=(Event.BATCH_START,),
                      hparams=(HParam("alpha", float, 0.2, low=0.0, high=1.0, step=0.1),
                               HParam("mode", str, "a", choices=("a", "b")),
                               HParam("k", int, 2, low=1, high=10)))

    def apply(self, event, state, logger):
        pass


def test_hyperparameters_are_checked_against_the_card():
    assert Tunable().params == {"alpha": 0.2, "mode": "a", "k": 2}
    assert Tunable(alpha=0.5, k=3).params["alpha"] == 0.5
    with pytest.raises(ValueError, match=r"tunable.alpha=1.5 is outside its range \[0.0, 1.0\]"):
        Tunable(alpha=1.5)
    with pytest.raises(ValueError, match="tunable.mode must be one of"):
        Tunable(mode="c")
    with pytest.raises(TypeError, match="tunable.k must be a whole number"):
        Tunable(k=2.5)
    with pytest.raises(TypeError, match="unknown parameter"):
        Tunable(beta=1)


def test_card_rejects_unknown_domain_and_write_targets():
    with pytest.raises(ValueError, match="domain"):
        make_card("bad", domain="audio")
    with pytest.raises(ValueError, match="unknown read/write"):
        make_card("bad", writes=("weights",))


def test_default_match_is_the_cards_events(tmp_path):
    method = method_class("only_start", events=(Event.FIT_START, Event.EPOCH_END))()
    train, _ = toy_loaders(n=64)
    trainer = Trainer(toy_model(), train, max_duration="2ep", methods=[method], device="cpu",
                      run_dir=tmp_path, save_checkpoints=False)
    trainer.fit()
    assert trainer.engine.events_of("only_start") == {Event.FIT_START: 1, Event.EPOCH_END: 2}


def test_callbacks_get_the_events_they_handle_even_when_added_mid_run(tmp_path):
    """The engine looks up once which callbacks handle which event; a callback added to the list during
    the run, and one that overrides run_event itself, still get theirs."""
    from speedkit.callbacks import Callback

    class CountsBatchEnds(Callback):
        def __init__(self):
            self.batches = 0

        def batch_end(self, state, logger):
            self.batches += 1

    class SeesEverything:  # duck-typed: only run_event
        def __init__(self):
            self.events = []

        def run_event(self, event, state, logger):
            self.events.append(event)

    late = CountsBatchEnds()

    class AddsOneAtBatchTwo(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 2:
                state.callbacks.append(late)

    train, _ = toy_loaders(batch_size=32, n=96)
    watcher = SeesEverything()
    trainer = Trainer(toy_model(), train, max_duration="5ba", callbacks=[AddsOneAtBatchTwo(), watcher],
                      device="cpu", run_dir=tmp_path, save_checkpoints=False)
    trainer.fit()
    assert late.batches == 3  # batches 3, 4 and 5
    assert watcher.events.count(Event.BEFORE_FORWARD) == 5 and watcher.events[-1] is Event.FIT_END


def test_the_engine_overhead_benchmark_runs_and_reports_each_loop(tmp_path):
    """bench/engine_overhead.py at a tiny size: it must keep running, since its figures are quoted."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "bench/engine_overhead.py", "--steps", "60", "--repeats", "1",
                           "--run-dir", str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(figures[f"{arm}_steps_per_s"] > 0 for arm in ("bare", "loop_only", "trainer"))
    assert 0 < figures["event_ns"] < 1e6 and "loop_only_overhead_us_per_step" in figures
