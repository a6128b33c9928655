"""Batches and loaders as the Trainer handles them: batches moved to a device, counted and split into
microbatches; loaders measured, set to an epoch and started part-way; a partial last batch run eager.

A batch is a tensor, a tuple/list ``(inputs, targets, ...)`` or a dict; ``speedkit.core.batch`` reads it.
"""
from __future__ import annotations

import contextlib

import torch

from speedkit.core.batch import BatchShapeError, batch_size


def split_batch(batch, n: int) -> list:
    """Split every tensor of a batch (tensor, tuple, list or dict) into ``n`` chunks along the first dimension."""
    if n == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n))
    if isinstance(batch, dict):
        chunks = {k: split_batch(v, n) if isinstance(v, torch.Tensor) else [v] * n for k, v in batch.items()}
        return [{k: c[i] for k, c in chunks.items()} for i in range(min(len(c) for c in chunks.values()))]
    parts = [split_batch(b, n) if isinstance(b, torch.Tensor) else [b] * n for b in batch]
    return [type(batch)(p[i] for p in parts) for i in range(min(len(p) for p in parts))]


def microbatches(batch, microbatch_size: int | None) -> list:
    """``batch`` in pieces of at most ``microbatch_size`` samples (the whole batch when None)."""
    total = batch_size(batch)
    n = max(1, -(-total // microbatch_size)) if microbatch_size else 1
    return split_batch(batch, n)


def loader_length(loader) -> int | None:
    """Batches per epoch, or None for a loader without a length."""
    try:
        return len(loader) if hasattr(loader, "__len__") else None
    except TypeError:  # a DataLoader over an IterableDataset without __len__ has __len__ and raises
        return None


def set_loader_epoch(loader, epoch: int) -> None:
    """Tell a loader (and its samplers) which epoch starts, so its order is a function of (seed, epoch)."""
    for obj in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None),
                                                                  "sampler", None)):
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)


def iterate_from(loader, skip: int):
    """An iterator over an epoch of ``loader`` that starts after its first ``skip`` batches."""
    if skip and hasattr(loader, "iter_from"):
        return loader.iter_from(skip)
    iterator = iter(loader)
    for _ in range(skip):  # generic fast-forward: replays the loader to the same place
        next(iterator, None)
    return iterator


class PartialBatchesEager:
    """Runs an epoch's or an evaluation pass's last batch, where it has fewer samples than the widest before it (it
    is partial), with TorchDynamo's stance at ``force_eager``: the arithmetic is the same, compiled or not.

    A compiled graph is guarded on its input's shape, so a partial last batch would compile a graph of its own, in
    training time and about as long as the first batch's compile; and seeing a second batch size, TorchDynamo marks
    the batch dimension dynamic, so every graph compiled after it (evaluation's, the next size's of progressive
    resizing) would take a symbolic batch size. One eager step costs far less. Only the last batch: a loader whose
    batches vary in size by design (a token budget per batch) keeps every batch compiled. Where nothing is compiled
    the stance changes nothing. One instance per stream of batches: the run's training batches (from
    AFTER_DATALOADER on, where a method may run the model: selective backprop's scoring forward), or one evaluation
    pass (evaluators may batch differently)."""

    def __init__(self):
        self.widest = 0

    @contextlib.contextmanager
    def around(self, batch, index: int, batches: int | None):
        """Runs its block eager where ``batch``, number ``index`` (from 0) of the ``batches`` of its epoch or pass
        (None: a loader without a length), is the last one and narrower than the widest."""
        if self._narrower(batch) and index + 1 == batches:
            with torch.compiler.set_stance("force_eager"):
                yield
        else:
            yield

    def _narrower(self, batch) -> bool:
        try:
            rows = batch_size(batch)
        except BatchShapeError:  # inputs that are not one tensor: nothing to compare
            return False
        if rows < self.widest:
            return True
        self.widest = rows
        return False
