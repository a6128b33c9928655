"""One view of a batch, whatever shape the loader yields it in.

Three shapes are understood:

* a tensor: inputs only;
* a tuple or list ``(inputs, targets, extra...)``: the model is called with ``inputs``; extra items
  travel along untouched (or sliced with the batch when they are per-sample tensors);
* a dict (Hugging Face style): the model is called with ``**batch``; the inputs are the first of
  ``INPUT_KEYS`` present, the targets are ``batch["labels"]``.

The Trainer and every method that reads or writes inputs or labels go through these functions, so
a new batch shape is taught here once.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

INPUT_KEYS = ("input_ids", "pixel_values", "inputs", "x")  # the tensor a dict batch's inputs are, in order
LABELS_KEY = "labels"


class BatchShapeError(ValueError):
    """A batch this code cannot read or change, with what it is and what would work."""


def is_dict_batch(batch) -> bool:
    return isinstance(batch, Mapping)


def _inputs_key(batch: Mapping) -> str:
    for key in INPUT_KEYS:
        if key in batch:
            return key
    raise BatchShapeError(f"a dict batch needs its inputs under one of {list(INPUT_KEYS)}; this one has keys "
                          f"{sorted(map(str, batch))}; rename the inputs' key")


def batch_inputs(batch):
    """What the model's input tensor is: ``batch[0]``, a dict's input key, or the tensor itself."""
    if isinstance(batch, (tuple, list)):
        if not batch:
            raise BatchShapeError("an empty tuple is not a batch; yield (inputs, targets)")
        return batch[0]
    if is_dict_batch(batch):
        return batch[_inputs_key(batch)]
    return batch


def batch_targets(batch):
    """The labels: ``batch[1]``, a dict's ``"labels"``, or None for a batch without them."""
    if isinstance(batch, (tuple, list)):
        return batch[1] if len(batch) > 1 else None
    if is_dict_batch(batch):
        return batch.get(LABELS_KEY)
    return None


def with_inputs(batch, inputs):
    """``batch`` with its inputs replaced (the same shape of batch: tuple, list, dict or tensor)."""
    if isinstance(batch, (tuple, list)):
        return type(batch)((inputs, *batch[1:]))
    if is_dict_batch(batch):
        return {**batch, _inputs_key(batch): inputs}
    return inputs


def with_targets(batch, targets):
    """``batch`` with its labels replaced; a batch without labels cannot take new ones."""
    if isinstance(batch, (tuple, list)) and len(batch) > 1:
        return type(batch)((batch[0], targets, *batch[2:]))
    if is_dict_batch(batch) and LABELS_KEY in batch:
        return {**batch, LABELS_KEY: targets}
    raise BatchShapeError(f"this batch has no labels to replace ({describe_shape(batch)}); yield "
                          f"(inputs, targets) or a dict with a {LABELS_KEY!r} key")


def select_samples(batch, indices: torch.Tensor):
    """The samples ``indices`` of every per-sample tensor in the batch (others are kept as they are)."""
    size = batch_size(batch)

    def pick(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
            return value.index_select(0, indices)
        return value

    if isinstance(batch, (tuple, list)):
        return type(batch)(pick(v) for v in batch)
    if is_dict_batch(batch):
        return {k: pick(v) for k, v in batch.items()}
    return pick(batch)


def batch_size(batch) -> int:
    """Samples in the batch: the first dimension of its inputs."""
    inputs = batch_inputs(batch)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
        raise BatchShapeError(f"a batch's inputs must be a tensor [batch, ...]; got {describe_shape(batch)}")
    return int(inputs.shape[0])


def batch_tokens(batch) -> int:
    """Tokens in a language-model batch (integer inputs); 0 for images and other float inputs."""
    inputs = batch_inputs(batch)
    return inputs.numel() if isinstance(inputs, torch.Tensor) and not inputs.is_floating_point() else 0


def to_device(batch, device: torch.device):
    """``batch`` with every tensor in it on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def call_model(model, batch):
    """The forward pass for this shape of batch: ``model(**batch)`` for dicts, else ``model(inputs)``."""
    return model(**batch) if is_dict_batch(batch) else model(batch_inputs(batch))


def output_logits(outputs):
    """The logits in a model's output: the tensor itself or its ``.logits`` (Hugging Face outputs)."""
    return outputs if isinstance(outputs, torch.Tensor) else getattr(outputs, "logits", outputs)


def output_classes(model, logits: torch.Tensor) -> int:
    """How many of the logits' last columns are classes: all of them, unless the model names fewer in its
    ``output_classes`` (a GPT whose vocabulary is padded to a multiple of 64 for its matmuls: the pad columns are
    no class, so a target must give them no probability). Asked of the module inside a DDP wrapper; a compiled
    model answers for its original."""
    from speedkit.core.distributed import unwrap

    named = getattr(unwrap(model), "output_classes", None)
    return logits.shape[-1] if named is None else min(int(named), logits.shape[-1])


def output_loss(outputs) -> torch.Tensor | None:
    """The loss a model computed itself (Hugging Face outputs' ``.loss``), or None."""
    return None if isinstance(outputs, torch.Tensor) else getattr(outputs, "loss", None)


def require_tuple_batch(batch, method: str, why: str) -> None:
    """Refuse, naming ``method``, a batch that is not ``(inputs, targets, ...)``."""
    if isinstance(batch, (tuple, list)) and len(batch) > 1:
        return
    raise BatchShapeError(f"{method} cannot act on this batch ({describe_shape(batch)}): {why}; "
                          f"yield (inputs, targets) tuples or remove {method}")


def describe_shape(batch: Any) -> str:
    """A short description of a batch's shape for messages."""
    if isinstance(batch, torch.Tensor):
        return f"a tensor {list(batch.shape)}"
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__} of {len(batch)} item(s)"
    if is_dict_batch(batch):
        return f"a dict with keys {sorted(map(str, batch))}"
    return type(batch).__name__
