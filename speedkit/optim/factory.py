"""Optimizers from data: ``{"name": "sgd", "lr": 0.1, ...}`` -> a factory ``fn(params) -> optimizer``.

The optimizer runs as few kernels a step as its device allows: torch's fused kernels where every parameter is on
a CUDA device (one kernel per parameter group for the whole update), its multi-tensor (``foreach``) form
elsewhere. torch's own default is the per-parameter loop on a CPU, a dozen ops per parameter. A spec that names
``fused`` or ``foreach`` itself keeps its choice.
"""
from __future__ import annotations

import torch

OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW, "adam": torch.optim.Adam}
_KERNEL_CHOICES = ("fused", "foreach")


def make_optimizer_factory(spec: dict):
    """Checked now (unknown names, bad parameters) rather than mid-run."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: {sorted(OPTIMIZERS)}")
    cls = OPTIMIZERS[name]
    if "betas" in spec:
        spec["betas"] = tuple(spec["betas"])
    try:
        cls([torch.zeros(1, requires_grad=True)], **spec)
    except (TypeError, ValueError, RuntimeError) as e:
        raise type(e)(f"bad parameters for optimizer {name!r}: {e}") from e

    def build(params):
        if isinstance(params, torch.Tensor):  # torch's own error names what it takes
            return cls(params, **spec)
        # Listed once: a generator (``model.parameters()``, a group's) would be used up by the choice.
        params = [dict(item, params=list(item["params"])) if isinstance(item, dict) else item for item in params]
        return cls(params, **spec, **kernel_choice(params, spec))

    return build


def kernel_choice(params, spec: dict) -> dict:
    """``{"fused": True}`` where every parameter is a floating-point CUDA tensor, ``{"foreach": True}`` otherwise;
    nothing where ``spec`` already chose (``fused`` or ``foreach``)."""
    if any(spec.get(key) is not None for key in _KERNEL_CHOICES):
        return {}
    tensors = list(_flat_params(params))
    if tensors and all(p.is_cuda and p.is_floating_point() for p in tensors):
        return {"fused": True}
    return {"foreach": True}


def _flat_params(params):
    for item in params:
        if isinstance(item, dict):  # parameter groups
            yield from item["params"]
        else:
            yield item
