"""Augmentation means the same in both input pipelines: the per-image one (torchvision + DataLoader) flips the
same images in the same epochs as the in-memory BatchLoader when the flip is alternating."""
from __future__ import annotations

import pytest
import torch
from helpers import needs_fmnist
from torch.utils.data import DataLoader, Dataset, SequentialSampler

from speedkit.data import Augment, BatchLoader
from speedkit.data.per_image import AlternatingFlips, alternate_flips, as_augment, per_image_transforms
from speedkit.train.batches import set_loader_epoch

N, SEED = 40, 7


class Images(Dataset):
    """Asymmetric random images as float tensors, the way ToTensor() leaves them (values 0..255 here)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (N, 1, 6, 6), generator=g, dtype=torch.uint8)
        self.y = torch.arange(N)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i].float(), self.y[i]


def flipped_in_epoch(loader, plain_loader, epoch: int) -> list[bool]:
    """Per sample (in order): is ``loader``'s image the mirror of ``plain_loader``'s in this epoch?"""
    flips = []
    for loader_ in (loader, plain_loader):
        set_loader_epoch(loader_, epoch)  # what the Trainer calls at each epoch start
    for (x, _), (plain, _) in zip(loader, plain_loader):
        for a, b in zip(x, plain):
            assert torch.equal(a, b) or torch.equal(a, b.flip(-1))
            flips.append(not torch.equal(a, b))
    return flips


def memory_flips(epoch: int) -> list[bool]:
    data = Images()
    make = lambda flip: BatchLoader(data.x, data.y, 8, shuffle=False, seed=SEED,  # noqa: E731
                                    augment=Augment(crop_pad=0, flip=flip))
    return flipped_in_epoch(make("alternating"), make(None), epoch)


def dataloader_flips(epoch: int) -> list[bool]:
    dataset, sampler = alternate_flips(Images(), SequentialSampler(range(N)), SEED)
    return flipped_in_epoch(DataLoader(dataset, batch_size=8, sampler=sampler), DataLoader(Images(), batch_size=8), epoch)


def test_alternating_flip_is_the_same_in_both_pipelines_epoch_by_epoch():
    previous = None
    for epoch in range(4):
        flips = memory_flips(epoch)
        assert dataloader_flips(epoch) == flips, epoch
        assert 0.25 * N < sum(flips) < 0.75 * N  # a random half, not all or none
        if previous is not None:
            assert flips == [not f for f in previous]  # every image flipped in exactly one of two epochs
        previous = flips


def test_persistent_workers_see_each_new_epoch():
    # A worker process holds its own copy of the dataset from the first epoch; the epoch comes with each index.
    dataset, sampler = alternate_flips(Images(), SequentialSampler(range(N)), SEED)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=1, persistent_workers=True)
    plain = DataLoader(Images(), batch_size=8)
    assert flipped_in_epoch(loader, plain, 0) == memory_flips(0)
    assert flipped_in_epoch(loader, plain, 1) == memory_flips(1)


def test_per_image_steps_follow_the_augment():
    import torchvision.transforms as T

    kinds = lambda augment: [type(s).__name__ for s in per_image_transforms(augment, 28)]  # noqa: E731
    assert kinds({"crop_pad": 2, "flip": "random"}) == ["RandomCrop", "RandomHorizontalFlip"]
    assert kinds({"crop_pad": 0, "flip": "alternating"}) == []  # the flip is the dataset wrapper's
    assert kinds({"crop_pad": 0, "flip": None}) == [] and kinds(None) == []
    (crop,) = per_image_transforms({"crop_pad": 1, "flip": None, "pad_mode": "zeros"}, 28)
    assert isinstance(crop, T.RandomCrop) and crop.padding_mode == "constant"  # as the batch loader fills


def test_bad_augment_and_indexing_are_refused_clearly():
    with pytest.raises(ValueError, match="flip must be one of"):
        as_augment({"flip": "sometimes"})
    with pytest.raises(ValueError, match=r"unknown keys \['flips'\]"):
        as_augment({"flips": "random"})
    with pytest.raises(TypeError, match=r"indexed by \(index, epoch\).*EpochTaggedSampler"):
        AlternatingFlips(Images(), SEED)[3]


@needs_fmnist
@pytest.mark.parametrize("flip, wrapped, flip_step", [("alternating", True, False), ("random", False, True),
                                                       (None, False, False)])
def test_fashion_mnist_dataloader_path_flips_as_the_recipe_says(flip, wrapped, flip_step):
    import torchvision.transforms as T

    from speedkit.tasks.builtin import fashion_mnist_torch_loader

    loader = fashion_mnist_torch_loader(32, {"crop_pad": 0, "flip": flip}, data_fraction=0.01, seed=SEED)
    dataset = loader.dataset
    assert isinstance(dataset, AlternatingFlips) == wrapped
    inner = dataset.dataset if wrapped else dataset
    transforms = inner.dataset.transform.transforms  # Subset -> FashionMNIST
    assert any(isinstance(t, T.RandomHorizontalFlip) for t in transforms) == flip_step
    if wrapped:  # each image mirrored between consecutive epochs; a batch through the loader as the Trainer runs it
        for i in range(5):
            assert torch.equal(dataset[(i, 0)][0].flip(-1), dataset[(i, 1)][0])
        set_loader_epoch(loader, 1)
        x, y = next(iter(loader))
        assert x.shape == (32, 1, 28, 28) and y.shape == (32,)
