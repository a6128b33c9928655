"""Seeded generators shared by the loaders, the methods that draw their own randomness, and the ranks.

Every loader draws its randomness from its own generator, seeded from (seed, epoch), so that
an epoch's batches are a pure function of those two numbers: a run can be reproduced, and a
resumed run can jump to any batch of any epoch without replaying what came before.
"""

from __future__ import annotations

import numpy as np
import torch


def derive_seed(*keys: int) -> int:
    """Mix integer keys into one 63-bit seed.

    Plain arithmetic like ``seed + epoch`` makes (seed=0, epoch=1) and (seed=1, epoch=0)
    collide; numpy's SeedSequence hashes the whole tuple, so nearby keys give unrelated streams.
    """
    if any(int(k) < 0 for k in keys):
        raise ValueError(f"seed keys must be non-negative integers, got {keys}")
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def make_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from the keys (CPU so that results match on every device)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(derive_seed(*keys))
    return generator
