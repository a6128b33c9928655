"""Batch-size warmup: train on smaller batches early, growing linearly to the full batch.

Early in training the gradient is large and consistent, so a small batch estimates it almost as well as
a big one: small batches give more optimizer steps per sample seen when each sample is worth the most.
The method keeps the first ``k`` samples of each loaded batch, ``k`` growing linearly from
``initial_fraction`` of the batch to all of it over the first ``warmup_fraction`` of training. The rest of
each early batch is not used (the loader shuffles, so which samples are dropped is random). The Trainer
counts the samples (and tokens) actually trained on, so sample- and token-based durations stay honest.
The learning rate is not changed: warm it up as usual (a small batch at a warmed-up rate is noisier).
Source: modded-nanogpt (batch-size warmup in its GPT-2 speed-runs); McCandlish et al. 2018 (critical
batch size grows during training); Smith et al. 2018, "Don't decay the learning rate, increase the batch size".
"""
from __future__ import annotations

import math

import torch

from speedkit.core import distributed
from speedkit.core.batch import batch_inputs, select_samples
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard


def batch_size_at(fraction_done: float, batch_size: int, initial_fraction: float = 0.25,
                  warmup_fraction: float = 0.2) -> int:
    """Samples to use at ``fraction_done`` of training: ``initial_fraction * batch_size`` at the start,
    growing linearly to ``batch_size`` at ``warmup_fraction``; at least 1."""
    if not 0.0 < initial_fraction <= 1.0:
        raise ValueError(f"initial_fraction must be in (0, 1], got {initial_fraction}")
    if warmup_fraction <= 0.0 or fraction_done >= warmup_fraction:
        return batch_size
    fraction = initial_fraction + (1.0 - initial_fraction) * fraction_done / warmup_fraction
    return max(1, min(batch_size, int(math.ceil(fraction * batch_size - 1e-9))))


def take_first(batch, k: int):
    """The first ``k`` samples of every tensor in ``batch`` that has the batch's leading size."""
    return select_samples(batch, torch.arange(k, device=batch_inputs(batch).device))


class BatchSizeWarmup(Method):
    CARD = MethodCard(
        name="batch_size_warmup",
        summary="Use only part of each batch early, growing linearly to the full batch.",
        domain="any",
        events=(Event.AFTER_DATALOADER,),
        reads=("batch",),
        writes=("batch",),
        hparams=(
            HParam("initial_fraction", float, 0.25, low=0.05, high=1.0, step=0.05,
                   help="fraction of the batch used at the start"),
            HParam("warmup_fraction", float, 0.2, low=0.0, high=1.0, step=0.05,
                   help="fraction of training over which the batch grows to full size"),
        ),
        requirements=("batches whose first dimension is the sample dimension",),
        # On AFTER_DATALOADER methods run in reverse list order, so being listed last makes the cut first:
        # later augmentations then only process the samples that are kept.
        runs_after=("augmix", "colout", "cutout", "progressive_resizing", "randaugment", "selective_backprop"),
        effect="cheaper early steps (fewer samples each); part of modded-nanogpt's GPT-2 speed-run. Gains depend "
               "on the learning-rate schedule; measure against the same number of samples",
        source="modded-nanogpt; McCandlish et al. 2018; Smith et al. 2018",
    )

    def apply(self, event, state, logger):
        inputs = state.batch_inputs()
        size = int(inputs.shape[0])
        # samples_per_batch is the global batch; under torchrun this rank holds its 1/world_size share
        nominal = (state.samples_per_batch // distributed.world_size() or size) if state.samples_per_batch else size
        k = min(size, batch_size_at(state.fraction_done(), nominal, self.params["initial_fraction"],
                                    self.params["warmup_fraction"]))
        if k < size:
            state.batch = take_first(state.batch, k)
