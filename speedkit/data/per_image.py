"""``Augment`` for a per-image pipeline (torchvision transforms + a DataLoader), meaning what it means in
the in-memory :class:`~speedkit.data.BatchLoader`, so that comparing the two pipelines compares input
pipelines and not augmentations.

- ``crop_pad`` and ``pad_mode``: ``RandomCrop(size, padding=crop_pad)`` with the same border fill.
- ``flip="random"``: ``RandomHorizontalFlip()``.
- ``flip="alternating"``: each image flipped on every other epoch, the same images in the same epochs as the
  batch loader with the same seed (``alternating_flip_phase``). A transform sees one image and neither
  its index nor the epoch, so the sampler tags each index with the epoch (:class:`EpochTaggedSampler`) and the
  dataset wrapper (:class:`AlternatingFlips`) flips by both; worker processes, persistent or not, get the
  epoch with every index.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch.utils.data import Dataset, Sampler

from .batch_loader import Augment, alternating_flip_phase


def as_augment(augment: Augment | dict | None) -> Optional[Augment]:
    """A recipe's augment dict (or an Augment) checked the same way for both pipelines."""
    if augment is None or isinstance(augment, Augment):
        return augment
    if not isinstance(augment, dict):
        raise TypeError(f"augment must be a dict such as {{'crop_pad': 2, 'flip': 'random'}}, an Augment or None, "
                        f"got {type(augment).__name__}")
    unknown = set(augment) - {"crop_pad", "flip", "pad_mode"}
    if unknown:
        raise ValueError(f"augment has unknown keys {sorted(unknown)}; it takes crop_pad, flip and pad_mode")
    return Augment(**augment)


def per_image_transforms(augment: Augment | dict | None, size: int | tuple[int, int]) -> list:
    """The torchvision steps (on a PIL image or tensor, before ToTensor/Normalize) for crop and random flip.
    An alternating flip adds no step here: see :func:`alternate_flips`."""
    import torchvision.transforms as T

    augment = as_augment(augment)
    steps = []
    if augment is not None and augment.crop_pad:
        fill = {"reflect": "reflect", "zeros": "constant"}[augment.pad_mode]
        steps.append(T.RandomCrop(size, padding=augment.crop_pad, padding_mode=fill))
    if augment is not None and augment.flip == "random":
        steps.append(T.RandomHorizontalFlip())
    return steps


class EpochTaggedSampler(Sampler):
    """Yields ``(index, epoch)`` for each index of ``sampler``; ``set_epoch`` (the Trainer calls it) passes on."""

    def __init__(self, sampler: Sampler):
        self.sampler, self.epoch = sampler, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):  # a DistributedSampler shuffles by epoch
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return ((int(i), epoch) for i in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class AlternatingFlips(Dataset):
    """``dataset`` with each sample's image flipped horizontally in alternate epochs; indexed by
    ``(index, epoch)`` from an :class:`EpochTaggedSampler`. Items are (image tensor [..., H, W], target, ...)."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset = dataset
        self.phase = alternating_flip_phase(len(dataset), seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def flipped(self, index: int, epoch: int) -> bool:
        return bool((int(self.phase[index]) + epoch) % 2)

    def __getitem__(self, key):
        if not (isinstance(key, tuple) and len(key) == 2):
            raise TypeError(f"AlternatingFlips is indexed by (index, epoch), got {key!r}: give the DataLoader "
                            f"sampler=EpochTaggedSampler(...) (alternate_flips returns both)")
        index, epoch = key
        image, *rest = self.dataset[index]
        if not isinstance(image, torch.Tensor):
            raise TypeError(f"an alternating flip needs image tensors; item {index} holds a {type(image).__name__}: "
                            f"end the dataset's transform with ToTensor()")
        return (image.flip(-1) if self.flipped(index, epoch) else image, *rest)


def alternate_flips(dataset: Dataset, sampler: Sampler, seed: int) -> tuple[AlternatingFlips, EpochTaggedSampler]:
    """``(dataset, sampler)`` for a DataLoader that flips as ``Augment(flip="alternating")`` does."""
    return AlternatingFlips(dataset, seed), EpochTaggedSampler(sampler)
