"""The one seed rule: every seed a run uses is ``derive_seed(run seed, stream, ...)``, never arithmetic.

Every loader draws its randomness from its own generator, seeded from (seed, epoch), so that
an epoch's batches are a pure function of those two numbers: a run can be reproduced, and a
resumed run can jump to any batch of any epoch without replaying what came before.

Each other use of a run's seed is a named stream below, a key after the seed that no loader epoch
(a small number) and no other stream takes, so no two uses draw the same numbers. Plain arithmetic
(``seed * 1_000_003 + epoch``, ``seed + worker``) is what this replaces: it makes (seed=0, epoch=1)
and (seed=1, epoch=0) share a stream. ``tests/core/test_seeding.py`` refuses seed arithmetic
anywhere else in the package.
"""

from __future__ import annotations

import random

import numpy as np
import torch

# The streams of a run's seed: the key after it. A loader's epoch is a key below 2**31; every other use
# has a named key from 2**31 up, so that no stream is any epoch's. FLIP_PHASE keeps the value it had
# before this table (alternating flips of earlier runs are reproduced); SUBSET was 1, which is epoch 1's
# stream, and GYRO_DROPOUT 0x6E0 (epoch 1760's, for the first layer).
FLIP_PHASE = 2**31  # which half of the samples alternating_flip mirrors on even epochs
EPOCH_RNG = 2**31 + 1  # the global RNGs (torch, numpy, random) of each epoch, then the epoch
SUBSET = 2**31 + 2  # a class-balanced subset (data_fraction, eval_fraction, a folder's validation split)
GYRO_DROPOUT = 2**31 + 3  # gyro_dropout's per-layer masks under DDP, then the layer's index
STREAMS = {"SUBSET": SUBSET, "GYRO_DROPOUT": GYRO_DROPOUT, "FLIP_PHASE": FLIP_PHASE, "EPOCH_RNG": EPOCH_RNG}


def derive_seed(*keys: int) -> int:
    """Mix integer keys into one 63-bit seed: ``derive_seed(seed, epoch)``, ``derive_seed(seed, EPOCH_RNG, epoch)``.

    numpy's SeedSequence hashes the whole tuple, so nearby keys give unrelated streams. Trailing zero
    keys do not change the hash ((s, k, 0) is (s, k)), which is why a stream that takes an index puts a
    named key before it; and a key of 2**32 or more is read as two words (a derived seed fed back in, as
    ``process_seed`` does, is such a key), so stream keys stay below 2**32.
    """
    if any(int(k) < 0 for k in keys):
        raise ValueError(f"seed keys must be non-negative integers, got {keys}")
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of the global RNGs during ``epoch`` of a run seeded ``seed`` (a function of the two only,
    so a resumed run draws what an uninterrupted one drew)."""
    return derive_seed(seed, EPOCH_RNG, epoch)


def process_seed(seed: int, index: int, bits: int = 63) -> int:
    """The seed of process ``index`` of several that share ``seed`` (ranks, search workers): ``seed``
    itself for the first, so one process alone draws what it always drew; a distinct stream for every
    other, cut to ``bits`` for consumers that take smaller seeds (numpy's legacy RandomState: 32)."""
    return int(seed) if index == 0 else derive_seed(seed, index) % 2**bits


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # the legacy global RandomState takes 32 bits
    torch.manual_seed(seed)


def make_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from the keys (CPU so that results match on every device)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(derive_seed(*keys))
    return generator
