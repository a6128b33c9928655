"""Ready-made train/test loaders, and class-balanced subsets for quick runs."""

from __future__ import annotations

import os
from typing import Optional, Union

import torch

from speedkit.core.seeding import SUBSET, make_generator

from .batch_loader import Augment, BatchLoader
from .fashion_mnist import load_fashion_mnist

PathLike = Union[str, os.PathLike]


def stratified_indices(labels: torch.Tensor, fraction: float, seed: int = 0) -> torch.Tensor:
    """Sorted indices of a class-balanced subset: `fraction` of each class (at least one each).

    Keeping class proportions matters for small fractions: a plain random 1% of Fashion-MNIST
    can miss a tenth of a class's share by chance and bias both accuracy and its variance.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    labels = torch.as_tensor(labels).cpu()
    if fraction == 1.0:
        return torch.arange(len(labels))
    generator = make_generator(seed, SUBSET)
    chosen = []
    for cls in torch.unique(labels):
        members = torch.nonzero(labels == cls).flatten()
        keep = max(1, round(fraction * len(members)))
        chosen.append(members[torch.randperm(len(members), generator=generator)[:keep]])
    return torch.sort(torch.cat(chosen)).values


def fashion_mnist_loaders(
    batch_size: int = 512,
    eval_batch_size: int = 1024,
    device="cpu",
    augment: Optional[Augment] = Augment(crop_pad=2, flip="random"),
    data_fraction: float = 1.0,
    seed: int = 0,
    eval_fraction: Optional[float] = None,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    drop_last: bool = False,
    root: Optional[PathLike] = None,
    download: bool = False,
) -> tuple:
    """(train, test) BatchLoaders over Fashion-MNIST, normalised with the training mean/std.

    `data_fraction` < 1 trains on a class-balanced subset (chosen with `seed`); the test set
    stays whole unless `eval_fraction` is given. Mean/std are those of the full training set,
    so a subset run sees inputs scaled exactly like a full run.
    """
    arrays = load_fashion_mnist(root=root, download=download)
    train_x, train_y = _subset(arrays.train_x, arrays.train_y, data_fraction, seed)
    test_x, test_y = _subset(arrays.test_x, arrays.test_y, eval_fraction or 1.0, seed)
    common = dict(device=device, mean=arrays.mean, std=arrays.std, dtype=dtype, channels_last=channels_last, seed=seed)
    train = BatchLoader(train_x, train_y, batch_size, shuffle=True, drop_last=drop_last, augment=augment, **common)
    test = BatchLoader(test_x, test_y, eval_batch_size, shuffle=False, drop_last=False, augment=None, **common)
    return train, test


def _subset(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int) -> tuple:
    if fraction == 1.0:
        return x, y
    index = stratified_indices(y, fraction, seed)
    return x.index_select(0, index), y.index_select(0, index)
