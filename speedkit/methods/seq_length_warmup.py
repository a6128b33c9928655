"""Sequence-length warmup: train a language model on short sequences first and lengthen them linearly.

Early in training short contexts carry most of what a model can learn, and they are cheaper per
token (attention is quadratic) and more stable. The length grows linearly from ``min_seq_length`` to
the full length over the first ``duration`` of training, in multiples of ``step_size`` (Li et al. 2022,
"The Stability-Efficiency Dilemma"; Composer SeqLengthWarmup), and of at least 64 tokens: each new length is a
new input shape, a recompile of a compiled model and a new choice of attention kernel on a GPU, so a run of a
1,024-token model sees at most 16 lengths, not 128. A context under 256 tokens steps by the largest power of
two up to a quarter of it instead. Either truncate each sequence (fewer tokens per step) or cut it into several
shorter ones (same tokens per step, more sequences).
"""
from __future__ import annotations

import torch

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard


MIN_STEP = 64  # the shortest step between lengths where the context allows it


def length_step(full_length: int, step_size: int = 8) -> int:
    """The step between warmup lengths: ``step_size``, at least 64 tokens, or for a context under 256 tokens at
    least the largest power of two up to a quarter of it."""
    quarter = max(1, full_length // 4)
    return max(step_size, min(MIN_STEP, 1 << (quarter.bit_length() - 1)))


def seq_length_at(fraction_done: float, full_length: int, min_seq_length: int = 8, duration: float = 0.3,
                  step_size: int = 8) -> int:
    """The sequence length at ``fraction_done`` of training: linear from ``min_seq_length`` to
    ``full_length`` over the first ``duration``, rounded down to a multiple of ``length_step(full_length,
    step_size)``, never below ``min_seq_length`` nor above ``full_length``."""
    if full_length < 1:
        raise ValueError(f"full_length must be positive, got {full_length}")
    start = min(min_seq_length, full_length)
    if duration <= 0 or fraction_done >= duration:
        return full_length
    progress = max(0.0, fraction_done) / duration
    length = start + (full_length - start) * progress
    step = length_step(full_length, step_size)
    length = int(length // step) * step
    return max(start, min(full_length, length))


def _map_sequences(batch, fn):
    """Apply ``fn`` to every tensor of a batch that has a sequence dimension (dim >= 2)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch) if batch.dim() >= 2 else batch
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_sequences(b, fn) for b in batch)
    if isinstance(batch, dict):
        return {k: _map_sequences(v, fn) for k, v in batch.items()}
    return batch


def truncate_sequences(batch, length: int):
    """Keep the first ``length`` positions of inputs and targets ([B, T, ...] -> [B, length, ...])."""
    if length < 1:
        raise ValueError(f"length must be positive, got {length}")
    return _map_sequences(batch, lambda t: t[:, :length])


def split_sequences(batch, length: int):
    """Re-cut a batch [B, T, ...] into [N, length, ...] sequences, N = (B * T) // length.

    The tokens are laid end to end (row after row) and cut every ``length`` positions, so inputs and
    targets stay aligned position by position and at most ``length - 1`` tokens of the batch are
    dropped: the tokens per step stay the same (exactly, when ``length`` divides B * T). A cut may join
    the end of one row to the start of the next, as packed-document training does anyway.
    """
    if length < 1:
        raise ValueError(f"length must be positive, got {length}")

    def split(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
        pieces = flat.shape[0] // length
        if pieces == 0:
            return t[:, :length]
        return flat[:pieces * length].reshape(pieces, length, *t.shape[2:])

    return _map_sequences(batch, split)


class SeqLengthWarmup(Method):
    CARD = MethodCard(
        name="seq_length_warmup",
        summary="Start training on short sequences and grow them linearly to the full length.",
        domain="language",
        events=(Event.AFTER_DATALOADER,),
        reads=("batch", "schedule"),
        writes=("batch",),
        hparams=(
            HParam("min_seq_length", int, 8, low=1, high=4096, step=8, help="length at the start of training"),
            HParam("duration", float, 0.3, low=0.0, high=1.0, step=0.05,
                   help="fraction of training over which the length grows to the full length"),
            HParam("step_size", int, 8, low=1, high=512, step=8,
                   help="lengths are multiples of this and of at least 64 tokens (less for contexts under 256): "
                        "few distinct shapes for torch.compile and the attention kernels"),
            HParam("truncate", bool, True,
                   help="True: cut sequences short (fewer tokens per step); False: re-cut them into more, "
                        "shorter sequences (same tokens per step)"),
        ),
        requirements=("language batches (idx [B, T], targets [B, T] or [B, T, V])",
                      "a model that accepts shorter sequences (any causal LM)"),
        effect="Composer: about 1.5x faster to equal perplexity for GPT-2 125M (1.7x with ALiBi); "
               "Li et al. report stabler training at larger batch sizes and learning rates",
        source="Li et al. 2022 (The Stability-Efficiency Dilemma); Composer SeqLengthWarmup docs",
    )

    def apply(self, event, state, logger):
        inputs = state.batch_inputs()
        if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or inputs.is_floating_point():
            # Acting on nothing would be a silent no-op (an image model): refuse at the first batch, before its step.
            shown = (f"a {inputs.dtype} tensor of shape {tuple(inputs.shape)}" if isinstance(inputs, torch.Tensor)
                     else type(inputs).__name__)
            raise ValueError(f"seq_length_warmup needs language batches whose inputs are token ids [B, T] "
                             f"(integers), but the training batch's inputs are {shown}, so it would do nothing; "
                             f"remove it (it is for language models)")
        p = self.params
        length = seq_length_at(state.fraction_done(), inputs.shape[1], p["min_seq_length"], p["duration"],
                               p["step_size"])
        if length < inputs.shape[1]:
            state.batch = (truncate_sequences if p["truncate"] else split_sequences)(state.batch, length)
