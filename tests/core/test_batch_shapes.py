"""Batches of any common shape: ``(inputs, targets)``, ``(inputs, targets, extra...)`` and Hugging Face-style
dicts, read and rewritten by one accessor (speedkit.core.batch), trained on by the Trainer and acted on by
the methods, which say why when they cannot act on a batch."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit import Trainer
from speedkit.core import batch as b
from speedkit.data import load_fashion_mnist
from speedkit.methods import build_methods

pytestmark = pytest.mark.prerequisite("fashion-mnist")


def real_images(n: int = 256):
    """Real Fashion-MNIST images [n, 1, 28, 28], normalised, and their labels."""
    arrays = load_fashion_mnist()
    x = (arrays.train_x[:n].float() / 255 - arrays.mean) / arrays.std
    return x.unsqueeze(1), arrays.train_y[:n].long()


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 10))

    def forward(self, x):
        return self.body(x)


class DictConvNet(ConvNet):
    """A model called Hugging Face style, ``model(**batch)``: logits, and its own loss when given labels."""

    def __init__(self, own_loss: bool):
        super().__init__()
        self.own_loss = own_loss

    def forward(self, pixel_values, labels=None, sample_id=None):
        logits = self.body(pixel_values)
        loss = F.cross_entropy(logits, labels) if self.own_loss and labels is not None else None
        return types.SimpleNamespace(logits=logits, loss=loss)


def tuple_batches(extra: bool = False, n_batches: int = 4, size: int = 32):
    x, y = real_images(n_batches * size)
    ids = torch.arange(len(y))
    return [(x[i:i + size], y[i:i + size], ids[i:i + size]) if extra else (x[i:i + size], y[i:i + size])
            for i in range(0, len(y), size)]


def dict_batches(n_batches: int = 4, size: int = 32, labels: bool = True):
    return [{"pixel_values": x, **({"labels": y} if labels else {}), "sample_id": ids}
            for x, y, ids in tuple_batches(True, n_batches, size)]


def fit(model, batches, tmp_path, **kwargs):
    trainer = Trainer(model, batches, eval_dataloader=batches[:1], max_duration="4ep", save_checkpoints=False,
                      run_dir=tmp_path, optimizers=lambda p: torch.optim.Adam(p, lr=3e-3), **kwargs)
    return trainer, trainer.fit()


# -- the accessor ---------------------------------------------------------------------------------
def test_the_accessor_reads_and_rewrites_every_shape():
    x, y, extra = torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), torch.arange(4)
    shapes = {"pair": (x, y), "triple": (x, y, extra), "list": [x, y], "dict": {"inputs": x, "labels": y, "id": extra}}
    for name, batch in shapes.items():
        assert b.batch_inputs(batch) is x and b.batch_targets(batch) is y, name
        assert b.batch_size(batch) == 4 and b.batch_tokens(batch) == 0, name
        new_x, new_y = torch.zeros(4, 3), torch.ones(4, dtype=torch.long)
        changed = b.with_targets(b.with_inputs(batch, new_x), new_y)
        assert type(changed) is type(batch), name
        assert b.batch_inputs(changed) is new_x and b.batch_targets(changed) is new_y, name
        assert b.batch_inputs(batch) is x, f"{name}: the original batch was changed in place"
        picked = b.select_samples(batch, torch.tensor([3, 0]))
        assert b.batch_targets(picked).tolist() == [0, 0] and b.batch_size(picked) == 2, name
    assert b.batch_inputs(shapes["triple"])[0] is not None and b.select_samples(shapes["triple"],
                                                                                torch.tensor([2]))[2].tolist() == [2]
    tokens = {"input_ids": torch.ones(2, 5, dtype=torch.long)}
    assert b.batch_tokens(tokens) == 10 and b.batch_targets(tokens) is None
    assert b.batch_targets(x) is None and b.batch_inputs(x) is x


def test_the_accessor_says_what_a_batch_lacks():
    with pytest.raises(b.BatchShapeError, match=r"inputs under one of \['input_ids', 'pixel_values'.*keys \['features'\]"):
        b.batch_inputs({"features": torch.ones(2)})
    with pytest.raises(b.BatchShapeError, match="no labels to replace"):
        b.with_targets({"input_ids": torch.ones(2, 3)}, torch.ones(2))
    with pytest.raises(b.BatchShapeError, match="no labels to replace"):
        b.with_targets((torch.ones(2, 3),), torch.ones(2))


# -- the Trainer on each shape --------------------------------------------------------------------
def test_the_trainer_learns_from_batches_with_extra_items(tmp_path):
    _, record = fit(ConvNet(), tuple_batches(extra=True), tmp_path)
    assert record.status == "completed" and record.final_metrics["eval/accuracy"] > 0.3


@pytest.mark.parametrize("own_loss", [True, False], ids=["model-loss", "logits-and-labels"])
def test_the_trainer_learns_from_dict_batches(tmp_path, own_loss):
    trainer, record = fit(DictConvNet(own_loss), dict_batches(), tmp_path, microbatch_size=16)  # dicts split too
    assert record.status == "completed"
    assert trainer.state.timestamp.sample == 4 * 4 * 32  # samples counted from the dict's inputs
    assert record.final_metrics["eval/accuracy"] > 0.3  # chance is 0.1: logits read from the output's .logits


def test_a_dict_batch_without_labels_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"no 'labels'.*add the labels under 'labels'"):
        fit(DictConvNet(own_loss=False), dict_batches(labels=False), tmp_path)


# -- methods on each shape ------------------------------------------------------------------------
LABEL_AND_INPUT_METHODS = {
    "label_smoothing": {"smoothing": 0.1},
    "mixup": {"alpha": 0.2},
    "cutmix": {"alpha": 1.0},
    "selective_backprop": {"start": 0.0, "end": 1.0, "keep": 0.5, "interrupt": 0},
    "progressive_resizing": {"initial_scale": 0.5},
    "cutout": {},
    "channels_last": {},
    "data_echoing": {"factor": 2},
    "test_time_augmentation": {"flip": True},
}


@pytest.mark.parametrize("method", sorted(LABEL_AND_INPUT_METHODS))
def test_methods_act_on_batches_with_extra_items(tmp_path, method):
    """The extra item (a per-sample id) survives every method; selective backprop slices it with the samples."""
    seen = []
    trainer = Trainer(ConvNet(), tuple_batches(extra=True), eval_dataloader=tuple_batches(extra=True)[:1],
                      max_duration="4ba", save_checkpoints=False, run_dir=tmp_path,
                      methods=build_methods({method: LABEL_AND_INPUT_METHODS[method]}),
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.05))
    original_loss = trainer.state.loss_fn

    def loss_and_look(outputs, batch):
        inputs, targets, ids = batch
        assert ids.shape[0] == inputs.shape[0] == targets.shape[0]
        seen.append(ids.clone())
        return original_loss(outputs, batch)

    trainer.state.loss_fn = loss_and_look
    record = trainer.fit()
    assert record.status == "completed" and seen
    if method == "selective_backprop":
        assert all(len(ids) == 16 for ids in seen)  # half of each 32-sample batch kept, ids sliced alike


@pytest.mark.parametrize("method", ["label_smoothing", "mixup", "cutmix", "selective_backprop",
                                    "test_time_augmentation"])
def test_methods_that_cannot_act_on_dict_batches_say_why(tmp_path, method):
    with pytest.raises(ValueError, match=rf"{method} cannot act on this batch \(a dict with keys .*\): .*remove {method}"):
        fit(DictConvNet(own_loss=False), dict_batches(), tmp_path,
            methods=build_methods({method: LABEL_AND_INPUT_METHODS[method]}))


@pytest.mark.parametrize("method", ["progressive_resizing", "cutout", "channels_last", "data_echoing"])
def test_input_methods_act_on_dict_batches(tmp_path, method):
    _, record = fit(DictConvNet(own_loss=True), dict_batches(), tmp_path,
                    methods=build_methods({method: LABEL_AND_INPUT_METHODS[method]}))
    assert record.status == "completed"


def test_a_dict_batch_without_a_known_inputs_key_is_refused_naming_the_keys(tmp_path):
    batches = [{"features": x, "labels": y} for x, y in tuple_batches(n_batches=1)]
    with pytest.raises(ValueError, match=r"inputs under one of \['input_ids', 'pixel_values'.*"
                                         r"keys \['features', 'labels'\]; rename the inputs' key"):
        fit(ConvNet(), batches, tmp_path)
