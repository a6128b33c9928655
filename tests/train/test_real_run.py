"""Real data, real model: a small ResNet on Fashion-MNIST learns within one epoch on the CPU."""
from __future__ import annotations

import math

import pytest

from speedkit.tasks import make_trainer

from helpers import needs_fmnist, needs_python_docs


@pytest.mark.slow
@needs_fmnist
def test_resnet8_reaches_85_percent_on_fashion_mnist_in_one_epoch(tmp_path):
    trainer = make_trainer("fashion-mnist", "mild", duration="1ep", device="cpu", run_dir=tmp_path, run_name="real")
    record = trainer.fit()
    assert record.config["recipe_spec"]["model"] == "resnet8"
    assert record.steps[-1]["sample"] == 60_000  # the whole training set, once
    assert record.final_metrics["eval/accuracy"] >= 0.85, record.final_metrics


@pytest.mark.slow
@needs_python_docs
def test_byte_gpt_learns_the_python_docs(tmp_path):
    """A few hundred steps take the byte-level GPT well below the 8 bits/byte of a uniform guess."""
    trainer = make_trainer("pydocs", "baseline", duration="60ba", batch_size=16, device="cpu", eval_fraction=0.25,
                           run_dir=tmp_path, run_name="lm", log_interval=1)
    record = trainer.fit()
    first, last = record.steps[0]["loss"], record.steps[-1]["loss"]
    assert first == pytest.approx(math.log(256), abs=0.3)  # a fresh model guesses uniformly over bytes
    assert last < first - 1.5, (first, last)
    assert record.final_metrics["eval/bpb"] < 5.0
    assert record.steps[-1]["token"] == 60 * 16 * 256
