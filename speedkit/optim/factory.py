"""Optimizers from data: ``{"name": "sgd", "lr": 0.1, ...}`` -> a factory ``fn(params) -> optimizer``."""
from __future__ import annotations

import torch

OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW, "adam": torch.optim.Adam}


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
    except (TypeError, ValueError) as e:
        raise type(e)(f"bad parameters for optimizer {name!r}: {e}") from e
    return lambda params: cls(params, **spec)
