"""Gradient clipping: by global norm, by value, or adaptively per unit (AGC, Brock et al. 2021).

* ``"norm"``: scale all gradients together so their global L2 norm is at most the threshold.
* ``"value"``: clamp every gradient entry into ``[-threshold, threshold]``.
* ``"adaptive"``: for each unit (a row of a weight: one output neuron or filter; a whole tensor for
  1-D parameters) clip when ``||g|| / max(||w||, eps) > threshold``, scaling the unit's gradient to
  ``threshold * max(||w||, eps)``. Brock et al. used it to train normalizer-free ResNets at large batch.

In the Trainer the clip happens once per optimizer step, after the last microbatch's backward, on
unscaled gradients: with fp16 loss scaling the method calls ``grad_scaler.unscale_(optimizer)``
first. torch's GradScaler records that per optimizer, so the ``scaler.step`` that follows does not
unscale a second time.
"""
from __future__ import annotations

from typing import Iterable

import torch

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard

CLIPPING_TYPES = ("norm", "value", "adaptive")


def _unit_norms(t: torch.Tensor) -> torch.Tensor:
    """L2 norm per unit: per row (dim 0) for matrices and filters, of the whole tensor otherwise."""
    if t.dim() <= 1:
        return torch.linalg.vector_norm(t)
    return torch.linalg.vector_norm(t, dim=tuple(range(1, t.dim())), keepdim=True)


@torch.no_grad()
def adaptive_clip_grad_(parameters: Iterable[torch.Tensor], clipping_threshold: float = 0.01,
                        eps: float = 1e-3) -> None:
    """AGC in place: cap each unit's gradient norm at ``clipping_threshold * max(||w_unit||, eps)``."""
    for p in parameters:
        if p.grad is None:
            continue
        weight_norm = _unit_norms(p.detach().float()).clamp_min(eps)
        grad_norm = _unit_norms(p.grad.float())
        max_norm = weight_norm * clipping_threshold
        factor = torch.where(grad_norm > max_norm, max_norm / grad_norm.clamp_min(1e-6), torch.ones_like(grad_norm))
        p.grad.mul_(factor.to(p.grad.dtype))


def apply_gradient_clipping(parameters: Iterable[torch.Tensor], clipping_type: str = "norm",
                            clipping_threshold: float = 1.0) -> None:
    """Clip the gradients of ``parameters`` in place (``clipping_type``: "norm", "value" or "adaptive")."""
    if clipping_type not in CLIPPING_TYPES:
        raise ValueError(f"clipping_type must be one of {CLIPPING_TYPES}, got {clipping_type!r}")
    if not clipping_threshold > 0:
        raise ValueError(f"clipping_threshold must be > 0, got {clipping_threshold}")
    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        return
    if clipping_type == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, clipping_threshold)
    elif clipping_type == "value":
        torch.nn.utils.clip_grad_value_(parameters, clipping_threshold)
    else:
        adaptive_clip_grad_(parameters, clipping_threshold)


class GradientClipping(Method):
    CARD = MethodCard(
        name="gradient_clipping",
        summary="Clip gradients by global norm, by value, or per unit relative to the weights (AGC).",
        domain="any",
        events=(Event.AFTER_BACKWARD,),
        reads=("gradients",),
        writes=("gradients",),
        hparams=(
            HParam("clipping_type", str, "norm", choices=CLIPPING_TYPES,
                   help="norm: global L2 norm; value: per entry; adaptive: per unit vs weight norm (AGC)"),
            HParam("clipping_threshold", float, 1.0, low=0.001, high=100.0, step=0.001,
                   help="max norm / max value / max ratio ||g||/||w|| (AGC: about 0.01-0.16)"),
        ),
        requirements=("with fp16 loss scaling, gradients are unscaled first (grad_scaler.unscale_)",),
        effect="stability at high learning rates and large batches; no speed cost to speak of",
        source="Pascanu et al. 2013 (norm); Brock et al. 2021 'High-Performance Large-Scale Image Recognition "
               "Without Normalization' (AGC); Composer GradientClipping docs",
    )

    def __init__(self, clipping_type: str = "norm", clipping_threshold: float = 1.0):
        super().__init__(clipping_type=clipping_type, clipping_threshold=clipping_threshold)

    def match(self, event, state) -> bool:
        # once per optimizer step: after the last microbatch has added its gradient; not when the step is skipped
        return (event is Event.AFTER_BACKWARD and state.microbatch_index == state.num_microbatches - 1
                and not state.skip_step)

    def apply(self, event, state, logger):
        if state.grad_scaler is not None:
            for optimizer in state.optimizers:
                state.grad_scaler.unscale_(optimizer)
        apply_gradient_clipping(state.model.parameters(), self.params["clipping_type"],
                                self.params["clipping_threshold"])
