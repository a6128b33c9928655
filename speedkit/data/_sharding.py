"""What the in-memory loaders share about ranks: ``batch_size`` is the global batch, split over ranks."""
from __future__ import annotations


class GlobalBatch:
    """Mixin for a loader with ``batch_size`` (all ranks together) and ``world_size`` attributes."""

    batch_size: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        """Samples per batch over all ranks (the ``batch_size`` given)."""
        return self.batch_size

    @property
    def local_batch_size(self) -> int:
        """Samples per batch on this rank (the most, for an evaluation loader that splits unevenly)."""
        return -(-self.batch_size // self.world_size)
