"""Fair time accounting: what methods do at FIT_START and at evaluation is training time; a plain evaluation is not."""
from __future__ import annotations

import time

from helpers import make_card, toy_loaders, toy_model

from speedkit import Evaluator, Trainer
from speedkit.core import Event, Method

FIT_START_S = 0.3
EVAL_FORWARD_S = 0.1
SLOW_METRIC_S = 0.3


class Sleeper(Method):
    """A method whose set-up (FIT_START) and evaluation work (EVAL_AFTER_FORWARD) cost known seconds."""

    CARD = make_card("sleeper", events=(Event.FIT_START, Event.EVAL_AFTER_FORWARD), writes=("eval",))

    def __init__(self, eval_s: float = EVAL_FORWARD_S):
        super().__init__()
        self.eval_s = eval_s

    def apply(self, event, state, logger):
        time.sleep(FIT_START_S if event is Event.FIT_START else self.eval_s)


class SlowMetric:
    """A plain evaluation that costs time: excluded from training time."""

    def reset(self):
        pass

    def update(self, outputs, targets):
        time.sleep(SLOW_METRIC_S)

    def compute(self):
        return 1.0


def _trainer(tmp_path, eval_s=EVAL_FORWARD_S, **kwargs):
    train, test = toy_loaders()  # 8 batches per epoch; evaluation: 2 batches of 128
    options = dict(max_duration="2ba", eval_interval="1ba", device="cpu", run_dir=tmp_path, run_name="r",
                   methods=[Sleeper(eval_s)], evaluators=[Evaluator(test, {"slow": SlowMetric()})],
                   save_checkpoints=False)
    options.update(kwargs)
    return Trainer(toy_model(), train, **options)


def test_fit_start_and_eval_method_work_count_as_training_time(tmp_path):
    record = _trainer(tmp_path).fit()
    assert [row["batch"] for row in record.evals] == [1, 2]
    per_eval = 2 * EVAL_FORWARD_S  # two evaluation batches
    assert record.timings["fit_start_s"] >= FIT_START_S
    assert 2 * per_eval <= record.timings["eval_methods_s"] < 2 * per_eval + 0.5  # sleeps overshoot a little
    # Each evaluation row pays the set-up and every method cost so far, its own included ...
    assert record.evals[0]["wall_s"] >= FIT_START_S + per_eval
    assert record.evals[1]["wall_s"] >= FIT_START_S + 2 * per_eval
    assert record.timings["train_s"] >= FIT_START_S + 2 * per_eval
    # ... but not the plain evaluation (the slow metric: 2 batches x 2 evaluations x 0.3 s).
    assert record.timings["eval_s"] >= 4 * SLOW_METRIC_S + 2 * per_eval
    assert record.evals[1]["wall_s"] < FIT_START_S + 2 * per_eval + 4 * SLOW_METRIC_S / 2


def test_callbacks_set_up_at_fit_start_is_not_training(tmp_path):
    """Only methods' FIT_START work counts: a callback's (the speed monitor measuring the matmul peak) does not."""
    from speedkit.callbacks import Callback

    class SlowSetUp(Callback):
        def fit_start(self, state, logger):
            time.sleep(0.5)

    record = _trainer(tmp_path, eval_s=0.0, callbacks=[SlowSetUp()]).fit()
    assert FIT_START_S <= record.timings["fit_start_s"] < FIT_START_S + 0.4
    assert record.timings["train_s"] < FIT_START_S + 0.4


def test_the_evaluation_that_reaches_the_target_pays_its_own_method_cost(tmp_path):
    record = _trainer(tmp_path, stop_at=("eval/slow", 1.0)).fit()
    assert record.status == "target_reached" and len(record.evals) == 1
    assert record.time_to_target == record.evals[0]["wall_s"] >= FIT_START_S + 2 * EVAL_FORWARD_S


def test_plain_evaluation_adds_nothing_to_training_time(tmp_path):
    record = _trainer(tmp_path, eval_s=0.0).fit()
    assert record.timings.get("eval_methods_s", 0.0) < 0.05
    assert record.evals[1]["wall_s"] < FIT_START_S + 4 * SLOW_METRIC_S / 2


def test_resume_does_not_count_fit_start_twice(tmp_path):
    common = dict(eval_s=0.0, evaluators=(), eval_interval="1ep", save_checkpoints=True)
    first = _trainer(tmp_path, **common).fit()
    assert first.timings["fit_start_s"] >= FIT_START_S and first.timings["train_s"] >= FIT_START_S
    # The resumed run does its FIT_START work again (a real cost) but its clock continues from the checkpoint.
    second = _trainer(tmp_path, max_duration="4ba", autoresume=True, extend_duration=True, **common).fit()
    assert second.notes["resumed_from"].endswith("latest.ckpt")
    assert second.timings["fit_start_s"] == first.timings["fit_start_s"]
    assert second.timings["train_s"] - first.timings["train_s"] < FIT_START_S


class SlowLoader:
    """A loader that takes ``delay_s`` to hand over each batch (a loader falling behind the step)."""

    def __init__(self, loader, delay_s: float):
        self.loader, self.delay_s = loader, delay_s

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            time.sleep(self.delay_s)
            yield batch


def test_the_time_spent_taking_batches_is_training_time_and_reported_as_data_s(tmp_path):
    train, test = toy_loaders()
    delay = 0.05
    record = Trainer(toy_model(), SlowLoader(train, delay), max_duration="4ba", device="cpu", run_dir=tmp_path,
                     run_name="slow", save_checkpoints=False).fit()
    assert 4 * delay <= record.timings["data_s"] <= record.timings["train_s"]
    quick = Trainer(toy_model(), train, max_duration="4ba", device="cpu", run_dir=tmp_path, run_name="quick",
                    save_checkpoints=False).fit()
    assert quick.timings.get("data_s", 0.0) < record.timings["data_s"]
