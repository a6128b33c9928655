"""Data methods: batch and input-pipeline transformations. Each functional form is checked to do what it
claims, each Trainer method to act at exactly its card's events, and each card to refuse bad parameters."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from helpers import toy_loaders, toy_model
from method_harness import run_steps, tiny_images, tiny_language, tiny_vision

from speedkit import Trainer
from speedkit.core import Event, IncompatibleMethodsError
from speedkit.core.method import Method, MethodCard
from speedkit.data import Augment, BatchLoader
from speedkit.hosts import Speedkit
from speedkit.methods.alternating_flip import AlternatingFlip, alternating_flip_mask
from speedkit.methods.augmix import AugMix, augmix_batch, mixing_weights
from speedkit.methods.batch_size_warmup import BatchSizeWarmup, batch_size_at
from speedkit.methods.colout import ColOut, colout_batch
from speedkit.methods.cutmix import CutMix, cutmix_batch
from speedkit.methods.cutout import CutOut, cutout_batch
from speedkit.methods.data_echoing import DataEchoing, EchoingLoader, echo_batches
from speedkit.methods.label_smoothing import LabelSmoothing, smooth_labels
from speedkit.methods.mixup import MixUp, mixup_batch
from speedkit.methods.progressive_resizing import ProgressiveResizing, progressive_scale, resize_batch
from speedkit.methods.randaugment import (OPERATIONS, RandAugment, apply_drawn_operations, apply_operation,
                                          apply_per_sample, from_unit_range, loader_normalization, randaugment_batch,
                                          to_unit_range)
from speedkit.methods.selective_backprop import SelectiveBackprop, per_sample_loss, select_hardest, should_select
from speedkit.methods.test_time_augmentation import TestTimeAugmentation, tta_logits

TRAIN_EVENTS = {Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.EVAL_BATCH_END}


class Spy(Method):
    """Records (event, inputs, targets, outputs) where it runs; it writes nothing, so it runs last."""

    CARD = MethodCard(name="spy", summary="records batches", domain="any", events=tuple(TRAIN_EVENTS))

    def __init__(self):
        super().__init__()
        self.seen = []

    def apply(self, event, state, logger):
        outputs = state.outputs.detach().clone() if event is Event.EVAL_BATCH_END else None
        self.seen.append((event, state.batch[0].detach().clone(), state.batch[1].detach().clone(), outputs))

    def at(self, event):
        return [(x, y, out) for e, x, y, out in self.seen if e is event]


def acted_at(trainer, name) -> set:
    return set(trainer.engine.events_of(name))


def images(n=8, channels=3, size=12, seed=0):
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- mixup

def test_mixup_batch_is_a_convex_combination_with_the_returned_weight():
    x, y = images(), torch.arange(8) % 4
    g = torch.Generator().manual_seed(1)
    mixed, dense, lam, perm = mixup_batch(x, y, alpha=1.0, num_classes=4, generator=g)
    assert 0.0 < lam < 1.0 and not torch.equal(perm, torch.arange(8))
    assert torch.allclose(mixed, lam * x + (1 - lam) * x[perm])
    one_hot = F.one_hot(y, 4).float()
    assert torch.allclose(dense, lam * one_hot + (1 - lam) * one_hot[perm])
    assert torch.allclose(dense.sum(1), torch.ones(8)) and not torch.allclose(mixed, x)
    # Dense labels in, dense labels out; the same generator seed repeats the mix.
    again = mixup_batch(x, one_hot, alpha=1.0, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(again[0], mixed) and torch.allclose(again[1], dense)
    with pytest.raises(ValueError, match="num_classes"):
        mixup_batch(x, y, alpha=1.0)


def test_mixup_trains_on_dense_mixed_labels_and_composes_with_label_smoothing(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [MixUp(alpha=1.0), LabelSmoothing(0.2), spy], steps=2, tmp_path=tmp_path)
    assert acted_at(trainer, "mixup") == {Event.BEFORE_FORWARD, Event.BEFORE_LOSS}
    for _, labels, _ in spy.at(Event.BEFORE_LOSS):
        assert labels.shape == (16, 4) and torch.allclose(labels.sum(1), torch.ones(16))
        assert labels.min() >= 0.2 / 4 - 1e-6  # smoothed after mixing
        assert ((labels > 0.06) & (labels < 0.8)).any()  # mixed: some mass between the two classes
    # Given num_classes, the dense labels are written at BEFORE_FORWARD already.
    trainer = run_steps(tiny_vision(), [MixUp(num_classes=4)], steps=1, tmp_path=tmp_path)
    assert acted_at(trainer, "mixup") == {Event.BEFORE_FORWARD}


@pytest.mark.parametrize("criterion", [torch.nn.CrossEntropyLoss(label_smoothing=0.1),
                                       functools.partial(F.cross_entropy, label_smoothing=0.1)],
                         ids=["module", "partial"])
def test_a_criterion_that_smooths_labels_beside_label_smoothing_is_refused_before_the_first_step(criterion, tmp_path):
    """Ported from a loop that smoothed in its criterion, LabelSmoothing added beside it smoothed the soft labels
    once more (0.19 for two of 0.1) without a word. Refused where the criterion is given, in the Trainer and in
    a loop, before any step; the same criterion without the method, or without smoothing, trains."""
    logits, targets = torch.randn(4, 3), torch.tensor([0, 2, 2, 1])
    twice = criterion(logits, smooth_labels(targets, 3, 0.1))  # what the two together trained against
    assert torch.allclose(twice, F.cross_entropy(logits, smooth_labels(targets, 3, 0.19)))
    train, _ = toy_loaders(batch_size=16, n=64)
    with pytest.raises(ValueError, match=r"loss_fn's own label_smoothing=0.1 .*\(to 0.19 together\); keep one"):
        Trainer(toy_model(), train, max_duration="2ba", methods=[LabelSmoothing(0.1)], loss_fn=criterion,
                run_dir=tmp_path, progress_bar=False)
    sk = Speedkit([LabelSmoothing(0.1)], max_duration="2ba", train_dataloader=train, loss_fn=criterion)
    with pytest.raises(ValueError, match="keep one"):
        sk.prepare_model(toy_model())
    sk = Speedkit([LabelSmoothing(0.1)], max_duration="2ba", train_dataloader=train)  # the criterion per call
    model = sk.prepare_model(toy_model())
    sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    batch = sk.batch(next(iter(train)))
    with pytest.raises(ValueError, match="keep one"):
        sk.loss(model(batch[0]), batch, loss_fn=criterion)
    assert all(p.grad is None for p in model.parameters())  # refused before any backward

    run_steps(tiny_vision(), [LabelSmoothing(0.1)], steps=1, tmp_path=tmp_path / "plain",
              loss_fn=torch.nn.CrossEntropyLoss())
    Trainer(toy_model(), train, max_duration="1ba", loss_fn=criterion, run_dir=tmp_path / "alone",
            progress_bar=False).fit()


def test_mixup_and_cutmix_are_refused_together_naming_both(tmp_path):
    with pytest.raises(IncompatibleMethodsError) as info:
        run_steps(tiny_vision(), [MixUp(), CutMix()], steps=1, tmp_path=tmp_path)
    assert "mixup" in str(info.value) and "cutmix" in str(info.value) and "label_mixing" in str(info.value)


# --------------------------------------------------------------------------------------------- cutmix

def test_cutmix_pastes_a_box_and_weights_labels_by_the_area_actually_pasted():
    n, size = 8, 10
    x = torch.arange(n, dtype=torch.float32)[:, None, None, None].expand(n, 1, size, size).clone()
    y = torch.arange(n)
    for seed in range(6):
        mixed, dense, lam, perm = cutmix_batch(x, y, alpha=1.0, num_classes=n,
                                               generator=torch.Generator().manual_seed(seed))
        own = (mixed == x).flatten(1).float().mean(1)  # fraction of each image still its own
        moved = perm != torch.arange(n)
        assert torch.allclose(own[moved], torch.full_like(own[moved], lam))
        assert torch.allclose(dense[torch.arange(n), y][moved], torch.full((int(moved.sum()),), lam))
        assert torch.allclose(dense.sum(1), torch.ones(n))
    # A box clipped by the border counts only the part inside the image.
    _, dense, lam, _ = cutmix_batch(x, y, num_classes=n, permutation=torch.arange(n).roll(1), box=(0, 3, 0, 10))
    assert lam == pytest.approx(1 - 30 / 100) and dense[0, 0] == pytest.approx(0.7)


def test_cutmix_in_the_trainer(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [CutMix(), spy], steps=2, tmp_path=tmp_path)
    assert acted_at(trainer, "cutmix") == {Event.BEFORE_FORWARD, Event.BEFORE_LOSS}
    assert all(labels.shape == (16, 4) for _, labels, _ in spy.at(Event.BEFORE_LOSS))


# --------------------------------------------------------------------------------------------- cutout

def test_cutout_zeroes_square_holes_of_the_given_side_and_leaves_the_input_alone():
    x = torch.ones(64, 2, 16, 16)
    out = cutout_batch(x, num_holes=1, length=0.5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.ones_like(x))  # not modified in place (echoed batches share tensors)
    zeros = (out[:, 0] == 0).flatten(1).sum(1)
    assert zeros.max() == 64 and zeros.min() > 0  # an 8x8 hole, clipped at the border for some samples
    assert torch.equal(out[:, 0] == 0, out[:, 1] == 0)  # same hole on every channel
    two = cutout_batch(x, num_holes=2, length=0.25, generator=torch.Generator().manual_seed(0))
    assert (two[:, 0] == 0).flatten(1).sum(1).max() <= 32


def test_cutout_in_the_trainer(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [CutOut(length=0.5), spy], steps=2, tmp_path=tmp_path)
    assert acted_at(trainer, "cutout") == {Event.AFTER_DATALOADER}
    inputs = spy.at(Event.BEFORE_FORWARD)[0][0]
    assert ((inputs == 0).flatten(1).sum(1) > 0).all()  # normalised inputs are never exactly 0 otherwise


# --------------------------------------------------------------------------------------------- colout

def test_colout_drops_the_same_rows_and_columns_for_the_whole_batch_keeping_order():
    rows, cols = torch.meshgrid(torch.arange(20.0), torch.arange(20.0), indexing="ij")
    x = (rows * 100 + cols).expand(4, 3, 20, 20)
    masks = torch.zeros(4, 20, 20, dtype=torch.long)
    out, out_masks = colout_batch(x, p_row=0.2, p_col=0.1, generator=torch.Generator().manual_seed(0), targets=masks)
    assert out.shape == (4, 3, 16, 18) and out_masks.shape == (4, 16, 18)
    kept_rows, kept_cols = out[0, 0, :, 0] // 100, out[0, 0, 0, :] % 100
    assert (kept_rows.diff() > 0).all() and (kept_cols.diff() > 0).all()  # spatial order kept
    assert torch.equal(out, out[:1].expand_as(out))  # identical for every sample and channel
    labels = torch.arange(4)
    assert torch.equal(colout_batch(x, targets=labels)[1], labels)  # class labels pass through


def test_colout_in_the_trainer(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [ColOut(), spy], steps=2, tmp_path=tmp_path)
    assert acted_at(trainer, "colout") == {Event.AFTER_DATALOADER}
    assert all(x.shape[-2:] == (14, 14) for x, _, _ in spy.at(Event.BEFORE_FORWARD))
    assert all(x.shape[-2:] == (16, 16) for x, _, _ in spy.at(Event.EVAL_BATCH_END))  # eval untouched


# ----------------------------------------------------------------------------------------- randaugment

@pytest.mark.parametrize("channels", [1, 3])
def test_every_randaugment_operation_runs_on_unit_images_and_changes_them(channels):
    x = images(4, channels, 12)
    for name in OPERATIONS:
        out = apply_operation(x, name, 1.0)
        assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1, name
        if name == "identity" or (name == "color" and channels == 1):
            assert torch.equal(out, x), name  # saturation has no effect on grayscale
        else:
            assert not torch.equal(out, x), name


def test_grouped_per_sample_application_equals_one_image_at_a_time():
    x = images(12, 3, 10)
    names = list(OPERATIONS)
    g = torch.Generator().manual_seed(0)
    op_index = torch.randint(-1, len(names), (12,), generator=g)
    level = torch.randint(0, 11, (12,), generator=g)
    negative = torch.rand(12, generator=g) < 0.5
    grouped = apply_per_sample(x, names, op_index, level, negative, 10)
    for i in range(12):
        if op_index[i] < 0:
            expected = x[i:i + 1]
        else:
            strength = (-1.0 if negative[i] else 1.0) * float(level[i]) / 10
            expected = apply_operation(x[i:i + 1], names[op_index[i]], strength)
        assert torch.allclose(grouped[i:i + 1], expected), names[op_index[i]]


@pytest.mark.parametrize("channels", [1, 3])
def test_operations_drawn_on_the_device_equal_torchvisions_image_by_image(channels):
    """RandAugment computes every operation for the whole batch with per-sample parameters (no draw read on the
    host); each image comes out as torchvision's operation at its own strength makes it, odd sizes included."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(48, channels, 17, 13, generator=g)
    names = list(OPERATIONS)
    op_index = torch.randperm(48, generator=g) % len(names)  # each operation three or four times
    strength = torch.randint(0, 31, (48,), generator=g) / 30 * torch.where(torch.rand(48, generator=g) < 0.5, -1, 1)
    out = apply_drawn_operations(x, names, op_index, strength)
    for i in range(48):
        expected = apply_operation(x[i:i + 1], names[op_index[i]], float(strength[i]))
        assert torch.allclose(out[i:i + 1], expected, atol=1e-5), (names[op_index[i]], float(strength[i]))


@pytest.mark.parametrize("channels", [1, 3])
def test_randaugment_batch_changes_most_images_and_stays_in_unit_range(channels):
    x = images(32, channels, 12)
    out = randaugment_batch(x, num_ops=2, magnitude=9, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    changed = (out != x).flatten(1).any(1)
    assert changed.float().mean() > 0.75
    assert torch.equal(randaugment_batch(x, num_ops=0), x)
    repeat = randaugment_batch(x, num_ops=2, magnitude=9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, repeat)


def test_normalisation_round_trip_uses_the_loaders_mean_and_std():
    x, y = tiny_images(8, channels=3)
    loader = BatchLoader(x, y, 8, shuffle=False, mean=(0.2, 0.3, 0.4), std=(0.5, 0.6, 0.7))
    batch = next(iter(loader))[0]
    stats = loader_normalization(loader, 3, batch.device)
    unit = to_unit_range(batch, stats, "test")
    assert torch.allclose(unit, x.float() / 255, atol=1e-6)
    assert torch.allclose(from_unit_range(unit, stats, batch), batch, atol=1e-5)
    plain = BatchLoader(x, y, 8)  # no normalisation: images already in [0, 1]
    mean, std = loader_normalization(plain, 3, "cpu")
    assert torch.equal(mean.flatten(), torch.zeros(3)) and torch.equal(std.flatten(), torch.ones(3))
    assert loader_normalization(object(), 3, "cpu") is None
    with pytest.raises(ValueError, match="mean"):
        to_unit_range(batch, None, "randaugment")  # unknown normalisation and values outside [0, 1]


def test_randaugment_in_the_trainer_keeps_normalisation(tmp_path):
    spy_plain, spy_identity, spy_aug = Spy(), Spy(), Spy()
    run_steps(tiny_vision(channels=3), [spy_plain], steps=1, tmp_path=tmp_path)
    run_steps(tiny_vision(channels=3), [RandAugment(num_ops=0), spy_identity], steps=1, tmp_path=tmp_path)
    trainer = run_steps(tiny_vision(channels=3), [RandAugment(), spy_aug], steps=1, tmp_path=tmp_path)
    assert acted_at(trainer, "randaugment") == {Event.AFTER_DATALOADER}
    plain = spy_plain.at(Event.BEFORE_FORWARD)[0][0]
    assert torch.allclose(spy_identity.at(Event.BEFORE_FORWARD)[0][0], plain, atol=1e-5)  # exact round trip
    augmented = spy_aug.at(Event.BEFORE_FORWARD)[0][0]
    assert not torch.allclose(augmented, plain)
    assert augmented.min() >= (0 - 0.3) / 0.3 - 1e-4 and augmented.max() <= (1 - 0.3) / 0.3 + 1e-4


# --------------------------------------------------------------------------------------------- augmix

@pytest.mark.parametrize("channels", [1, 3])
def test_augmix_blends_chains_with_the_original(channels):
    x = images(16, channels, 12)
    out = augmix_batch(x, severity=3, width=3, depth=-1, alpha=1.0, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert (out != x).flatten(1).any(1).float().mean() > 0.75
    # Stays close to the original: a blend, not a replacement.
    assert (out - x).abs().mean() < (torch.rand_like(x) - x).abs().mean()
    weights, blend = mixing_weights(16, 3, 1.0, torch.Generator().manual_seed(0))
    assert torch.allclose(weights.sum(1), torch.ones(16)) and ((blend >= 0) & (blend <= 1)).all()
    again = augmix_batch(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)


def test_augmix_in_the_trainer(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [AugMix(), spy], steps=1, tmp_path=tmp_path)
    assert acted_at(trainer, "augmix") == {Event.AFTER_DATALOADER}
    assert spy.at(Event.BEFORE_FORWARD)[0][0].shape == (16, 1, 16, 16)


# ----------------------------------------------------------------------------------- alternating_flip

def test_each_sample_is_flipped_in_exactly_one_of_two_consecutive_epochs():
    for epoch in range(4):
        now, after = alternating_flip_mask(1000, epoch, seed=3), alternating_flip_mask(1000, epoch + 1, seed=3)
        assert torch.equal(now ^ after, torch.ones(1000, dtype=torch.bool))
        assert 0.4 < now.float().mean() < 0.6
    # The loader flips exactly the samples the mask names.
    x, y = tiny_images(32, channels=1)
    loader = BatchLoader(x, y, 32, shuffle=False, seed=3, augment=Augment(crop_pad=0, flip="alternating"))
    for epoch in range(2):
        loader.set_epoch(epoch)
        batch = next(iter(loader))[0]
        flipped = (batch - x.float() / 255).abs().flatten(1).amax(1) > 1e-6
        assert torch.equal(flipped, alternating_flip_mask(32, epoch, seed=3))


def test_alternating_flip_switches_the_loader_and_needs_a_batch_loader(tmp_path):
    trainer = run_steps(tiny_vision(), [AlternatingFlip()], steps=2, tmp_path=tmp_path)
    assert acted_at(trainer, "alternating_flip") == {Event.FIT_START}
    augment = trainer.state.train_dataloader.augment
    assert augment.flip == "alternating" and augment.crop_pad == 1  # the crop setting is kept
    train, _ = toy_loaders(n=64)
    trainer = Trainer(toy_model(), train, methods=[AlternatingFlip()], max_duration="1ba", device="cpu",
                      run_dir=tmp_path, save_checkpoints=False)
    with pytest.raises(TypeError, match="BatchLoader"):
        trainer.fit()


# ------------------------------------------------------------------------------- progressive_resizing

def test_progressive_scale_and_resize():
    assert progressive_scale(0.0, 0.5, 0.2) == 0.5
    assert progressive_scale(0.4, 0.5, 0.2) == pytest.approx(0.75)
    assert progressive_scale(0.8, 0.5, 0.2) == 1.0 and progressive_scale(0.95, 0.5, 0.2) == 1.0
    assert progressive_scale(0.3, 0.5, 0.2, delay_fraction=0.4) == 0.5
    x = images(2, 3, 28)
    assert resize_batch(x, 0.5).shape[-2:] == (16, 16)  # 14 rounded to a multiple of 4
    assert resize_batch(x, 1.0) is x
    assert resize_batch(x, 1.25, size_increment=1).shape[-2:] == (35, 35)
    masks = torch.zeros(2, 28, 28, dtype=torch.long)
    small, small_masks = resize_batch(x, 0.6, targets=masks)
    assert small.shape[-2:] == small_masks.shape[-2:] == (16, 16) and small_masks.dtype == torch.long
    # Downsizing is antialiased: thin stripes (1 column in 4 lit) average to their mean, not to 0 or 1.
    stripes = (torch.arange(16) % 4 == 0).float().expand(1, 1, 16, 16)
    assert (resize_batch(stripes, 0.25) - 0.25).abs().max() < 0.1


def test_progressive_resizing_grows_training_images_and_evaluates_larger(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [ProgressiveResizing(eval_scale=1.25), spy], steps=6, tmp_path=tmp_path,
                        eval_interval="6ba")
    assert acted_at(trainer, "progressive_resizing") == {Event.AFTER_DATALOADER, Event.EVAL_BEFORE_FORWARD}
    sizes = [x.shape[-1] for x, _, _ in spy.at(Event.BEFORE_FORWARD)]
    assert sizes[0] == 8 and sizes[-1] == 16 and sizes == sorted(sizes)
    assert all(x.shape[-1] == 20 for x, _, _ in spy.at(Event.EVAL_BATCH_END))
    trainer = run_steps(tiny_vision(), [ProgressiveResizing()], steps=1, tmp_path=tmp_path)
    assert acted_at(trainer, "progressive_resizing") == {Event.AFTER_DATALOADER}  # eval_scale 1: eval untouched


# ----------------------------------------------------------------------------- test_time_augmentation

def test_tta_averages_the_views():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(5)).eval()
    x = images(4, 3, 8)
    with torch.no_grad():
        plain = model(x)
        mirror = 0.5 * (plain + model(x.flip(-1)))
        assert torch.allclose(tta_logits(model, x, flip=True), mirror, atol=1e-6)
        assert not torch.allclose(mirror, plain)
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
        views = [padded[..., :8, :8], padded[..., 2:, 2:]]
        shifted = torch.stack([0.5 * (model(v) + model(v.flip(-1))) for v in views]).mean(0)
        assert torch.allclose(tta_logits(model, x, shifts=2), 0.5 * mirror + 0.5 * shifted, atol=1e-6)
        assert torch.allclose(tta_logits(model, x, flip=False), plain)


def test_tta_replaces_eval_outputs(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [TestTimeAugmentation(shifts=2), spy], steps=1, tmp_path=tmp_path)
    assert acted_at(trainer, "test_time_augmentation") == {Event.EVAL_AFTER_FORWARD}
    model = trainer.state.model.eval()
    for x, _, outputs in spy.at(Event.EVAL_BATCH_END):
        with torch.no_grad():
            assert torch.allclose(outputs, tta_logits(model, x, flip=True, shifts=2), atol=1e-5)
            assert not torch.allclose(outputs, model(x), atol=1e-4)


# ------------------------------------------------------------------------------------- data_echoing

def test_echo_batches_and_the_echoing_loader_resume_exactly():
    assert list(echo_batches([1, 2, 3], 2)) == [1, 1, 2, 2, 3, 3]
    x, y = tiny_images(64)
    loader = EchoingLoader(BatchLoader(x, y, 16, seed=1, augment=Augment(crop_pad=1)), factor=3)
    assert len(loader) == 12 and loader.batch_size == 16 and loader.augment.crop_pad == 1
    loader.set_epoch(2)
    full = [b[1] for b in loader]
    assert all(torch.equal(full[3 * i], full[3 * i + 2]) for i in range(4))
    assert not torch.equal(full[0], full[3])
    for skip in range(12):
        loader.set_epoch(2)
        assert all(torch.equal(a, b[1]) for a, b in zip(full[skip:], loader.iter_from(skip), strict=True))
    switched = loader.with_options(augment=Augment(crop_pad=0))
    assert isinstance(switched, EchoingLoader) and switched.factor == 3 and switched.augment.crop_pad == 0


def _echo_run(folder, duration="1ep", load_path=None, save_interval=None):
    model, train, test = tiny_vision()
    trainer = Trainer(model, train, eval_dataloader=test, methods=[DataEchoing(factor=2)], max_duration=duration,
                      device="cpu", run_dir=folder, run_name="r", save_interval=save_interval, log_interval=1,
                      load_path=load_path, optimizers=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    trainer.fit()
    return trainer


def test_data_echoing_doubles_steps_per_epoch_and_resumes_exactly(tmp_path):
    full = _echo_run(tmp_path / "full", save_interval="3ba")
    assert acted_at(full, "data_echoing") == {Event.FIT_START}
    assert full.state.timestamp.batch == 8 and full.state.timestamp.epoch == 1  # 4 batches, each twice
    resumed = _echo_run(tmp_path / "resumed", load_path=tmp_path / "full" / "r" / "checkpoints" / "ba000000003.ckpt")
    for a, b in zip(full.state.model.parameters(), resumed.state.model.parameters()):
        assert torch.equal(a, b)


# -------------------------------------------------------------------------------- batch_size_warmup

def test_batch_size_at_grows_linearly():
    assert batch_size_at(0.0, 16, 0.25, 0.2) == 4
    assert batch_size_at(0.1, 16, 0.25, 0.2) == 10
    assert batch_size_at(0.2, 16, 0.25, 0.2) == 16 and batch_size_at(0.9, 16, 0.25, 0.2) == 16
    assert batch_size_at(0.0, 16, 0.25, 0.0) == 16


def test_batch_size_warmup_counts_the_samples_actually_used(tmp_path):
    spy = Spy()
    trainer = run_steps(tiny_vision(), [BatchSizeWarmup(warmup_fraction=1.0), spy], steps=4, tmp_path=tmp_path)
    assert acted_at(trainer, "batch_size_warmup") == {Event.AFTER_DATALOADER}
    sizes = [x.shape[0] for x, _, _ in spy.at(Event.BEFORE_FORWARD)]
    assert sizes == [4, 7, 10, 13]
    assert trainer.state.timestamp.sample == sum(sizes)
    trainer = run_steps(tiny_language(), [BatchSizeWarmup(warmup_fraction=1.0)], steps=2, tmp_path=tmp_path)
    assert trainer.state.timestamp.token == (1 + 3) * 16  # batches of 1 then 3 sequences of 16 tokens


# ------------------------------------------------------------------------------- selective_backprop

def test_per_sample_loss_matches_cross_entropy_for_index_dense_and_sequences():
    logits, targets = torch.randn(6, 5), torch.randint(0, 5, (6,))
    losses = per_sample_loss(logits, targets)
    assert torch.allclose(losses.mean(), F.cross_entropy(logits, targets))
    assert torch.allclose(per_sample_loss(logits, F.one_hot(targets, 5).float()), losses)
    seq_logits, seq_targets = torch.randn(3, 4, 7), torch.randint(0, 7, (3, 4))
    seq_targets[0, :2] = -1
    per_sequence = per_sample_loss(seq_logits, seq_targets)
    first = F.cross_entropy(seq_logits[0, 2:], seq_targets[0, 2:])
    assert per_sequence.shape == (3,) and torch.allclose(per_sequence[0], first)


def test_select_hardest_keeps_exactly_the_highest_loss_fraction():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    losses = torch.tensor([0.1, 5.0, 0.3, 4.0, 0.2, 3.0, 0.0, 2.5, 0.4, 0.05])
    kept_x, kept_y, index = select_hardest(x, y, losses, keep=0.4)
    assert index.tolist() == [1, 3, 5, 7] and kept_y.tolist() == [1, 3, 5, 7]
    assert torch.equal(kept_x.flatten(), torch.tensor([1.0, 3.0, 5.0, 7.0]))
    assert should_select(0.6, 0, 0.5, 0.9, 2) and not should_select(0.6, 1, 0.5, 0.9, 2)
    assert not should_select(0.4, 0, 0.5, 0.9, 0) and not should_select(0.95, 0, 0.5, 0.9, 0)


def test_selective_backprop_trains_on_the_hardest_half(tmp_path):
    spy = Spy()
    method = SelectiveBackprop(start=0.0, end=1.0, interrupt=0, keep=0.5)
    trainer = run_steps(tiny_vision(), [method, spy], steps=2, tmp_path=tmp_path)
    assert acted_at(trainer, "selective_backprop") == {Event.AFTER_DATALOADER}
    assert [x.shape[0] for x, _, _ in spy.at(Event.BEFORE_FORWARD)] == [8, 8]
    assert trainer.state.timestamp.sample == 16
    assert trainer.state.model.training  # the scoring pass restored train mode
    # Every interrupt-th batch is left whole; language batches are selected per sequence.
    trainer = run_steps(tiny_language(), [SelectiveBackprop(start=0.0, end=1.0, interrupt=2), Spy()], steps=4,
                        tmp_path=tmp_path)
    assert trainer.engine.events_of("selective_backprop") == {Event.AFTER_DATALOADER: 2}
    assert trainer.state.timestamp.sample == 2 + 4 + 2 + 4


# -------------------------------------------------------------------------------- together and cards

def test_batch_changing_methods_coexist_with_each_other_and_with_label_methods(tmp_path):
    methods = [ProgressiveResizing(), ColOut(), CutOut(), BatchSizeWarmup(), RandAugment(),
               SelectiveBackprop(start=0.0, end=1.0, interrupt=0), MixUp(), LabelSmoothing(),
               TestTimeAugmentation()]
    trainer = run_steps(tiny_vision(channels=3), methods, steps=3, tmp_path=tmp_path)
    assert trainer.record.status == "completed" and trainer.record.evals
    assert all(acted_at(trainer, m.name) for m in methods)


@pytest.mark.parametrize("cls, bad", [
    (MixUp, {"alpha": 0.0}), (CutMix, {"alpha": 3.0}), (CutOut, {"length": 1.5}), (ColOut, {"p_row": 0.9}),
    (RandAugment, {"magnitude": 31}), (AugMix, {"severity": 11}), (ProgressiveResizing, {"eval_scale": 2.0}),
    (ProgressiveResizing, {"initial_scale": 0.0}), (TestTimeAugmentation, {"shifts": 3}),
    (DataEchoing, {"factor": 0}), (BatchSizeWarmup, {"initial_fraction": 0.0}), (SelectiveBackprop, {"keep": 0.0}),
    (SelectiveBackprop, {"start": 0.9, "end": 0.5}),
])
def test_parameters_outside_the_card_are_refused(cls, bad):
    with pytest.raises(ValueError, match=cls.CARD.name):
        cls(**bad)
