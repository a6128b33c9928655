"""torchmetrics metrics passed to an Evaluator as they are: the same numbers as speedkit's own metrics at every
evaluation, a clear error for one that does not reduce to a number, and left out of speedkit's own cross-rank
sum (the two-rank run is in tests/train/test_distributed.py)."""
from __future__ import annotations

import pytest
from helpers import toy_loaders, toy_model
from prerequisites import import_or_missing

from speedkit import Trainer
from speedkit.core import distributed
from speedkit.record.metrics import Accuracy, CrossEntropy, Evaluator, TorchMetric

INSTALL = "pip install 'torch-speedkit[metrics]'"


def classification():
    return import_or_missing("torchmetrics.classification", INSTALL)


def fit(tmp_path, metrics):
    train, test = toy_loaders()
    trainer = Trainer(toy_model(), train, evaluators=[Evaluator(test, metrics)], max_duration="2ep",
                      eval_interval="4ba", device="cpu", run_dir=tmp_path, run_name="run", save_checkpoints=False)
    return trainer, trainer.fit()


def test_torchmetrics_accuracy_and_loss_match_speedkits_at_every_evaluation(tmp_path):
    tm = classification()
    torchmetrics = import_or_missing("torchmetrics", INSTALL)
    trainer, record = fit(tmp_path, {"accuracy": Accuracy(), "loss": CrossEntropy(),
                                     "tm_accuracy": tm.MulticlassAccuracy(num_classes=3, average="micro"),
                                     "tm_top2": tm.MulticlassAccuracy(num_classes=3, top_k=2, average="micro")})
    assert isinstance(trainer.state.evaluators[0].metrics["tm_accuracy"], TorchMetric)
    accuracies = [row["eval/accuracy"] for row in record.evals]
    assert len(accuracies) >= 4 and len(set(accuracies)) > 1  # the comparison spans different values
    for row in record.evals:
        assert row["eval/tm_accuracy"] == pytest.approx(row["eval/accuracy"], abs=1e-6)
        assert row["eval/tm_top2"] >= row["eval/tm_accuracy"]
    assert isinstance(record.evals[-1]["eval/tm_accuracy"], float)  # a plain number in the JSON record

    # a metric that lowers is read as such (higher_is_better=False)
    assert TorchMetric(torchmetrics.MeanSquaredError()).lower_is_better


def test_a_metric_that_is_not_one_number_is_refused_with_the_fix(tmp_path):
    tm = classification()
    with pytest.raises(TypeError, match=r"shape \(3,\).*average='micro'"):
        fit(tmp_path, {"per_class": tm.MulticlassAccuracy(num_classes=3, average=None)})


def test_something_that_is_not_a_metric_is_refused_when_the_evaluator_is_made():
    train, _ = toy_loaders()
    with pytest.raises(TypeError, match="reset\\(\\), update\\(outputs, targets\\) and compute\\(\\)"):
        Evaluator(train, {"accuracy": lambda outputs, targets: 0.0})


def test_speedkits_cross_rank_sum_leaves_torchmetrics_to_its_own_sync(monkeypatch):
    tm = classification()
    summed = []
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t, op=None: summed.append(t.clone()))
    ours = Accuracy()
    ours.correct, ours.total = 3, 4
    distributed.reduce_metrics([ours, TorchMetric(tm.MulticlassAccuracy(num_classes=3))])
    assert [t.tolist() for t in summed] == [[3.0, 4.0]]  # only speedkit's own states went into the sum

    class NoStates:
        def reset(self): ...
        def update(self, outputs, targets): ...
        def compute(self): return 0.0

    with pytest.raises(TypeError, match="torchmetrics.Metric, which synchronizes itself"):
        distributed.reduce_metrics([NoStates()])
