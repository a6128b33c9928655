"""How an image folder of class folders is split into training and validation images, written once: the in-memory
``image-folder`` task and ``speedkit data prepare`` both call :func:`split_by_class`, so a folder gets the same
validation files whichever path reads it.

The rule depends only on the image files' paths, ``val_fraction`` and ``seed``, never on the order a file system
lists them in or on which images later fail to decode: each class's files, sorted by path, are shuffled with one
``random.Random(seed)`` taken class after class in label order, and the first ``round(val_fraction * n)`` go to
validation, at least one and at most ``n - 1`` where a class holds two images or more (a class of one image trains).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence, TypeVar

# The image files an image folder is read from, in memory and streamed: one list, so both see the same files.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".gif", ".webp", ".tif", ".tiff")
VAL_NAMES = ("val", "valid", "validation", "test")  # a folder's own validation split, beside its train/
# What a shard folder's manifest records as its ``split_rule``, so a loader can tell shards split by this rule
# from shards prepared before it (see ``speedkit.data.streaming.prepare``).
SPLIT_RULE = "by-class-1"
GIVEN_SPLIT = "given"  # the folder's own train/ and val/

Sample = TypeVar("Sample", bound=tuple)


def has_given_split(root: Path) -> bool:
    """Whether ``root`` holds its own train/ and val/ (or valid/validation/test) class folders, which are kept
    as they are rather than split by :func:`split_by_class`."""
    return (root / "train").is_dir() and any((root / name).is_dir() for name in VAL_NAMES)


def split_by_class(samples: Sequence[Sample], val_fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """``(train, val)`` of ``samples``, ``(path, label)`` pairs of one folder's class folders (see the module's
    docstring); both sorted by label, then path."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    by_class: dict[int, list] = {}
    for sample in samples:
        by_class.setdefault(int(sample[1]), []).append(sample)
    rng = random.Random(seed)
    train, val = [], []
    for label in sorted(by_class):
        files = sorted(by_class[label], key=lambda sample: Path(sample[0]).as_posix())
        rng.shuffle(files)
        n_val = _validation_count(len(files), val_fraction)
        val += files[:n_val]
        train += files[n_val:]

    def order(sample):
        return int(sample[1]), Path(sample[0]).as_posix()

    return sorted(train, key=order), sorted(val, key=order)


def _validation_count(n: int, val_fraction: float) -> int:
    if n < 2 or val_fraction == 0:
        return 0
    return min(n - 1, max(1, round(val_fraction * n)))
