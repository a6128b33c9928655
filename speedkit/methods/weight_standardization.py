"""Weight standardization (Qiao et al. 2019): each conv filter is used as (w - mean) / std over its fan-in.

Standardizing the weights smooths the loss landscape and pairs well with GroupNorm (small batches,
segmentation). It is a ``torch.nn.utils.parametrize`` parametrization, so the stored weight is the raw
one (``<conv>.parametrizations.weight.original`` in the state dict) and gradients flow through the
standardization. The last ``n_last_layers_ignore`` convs (in module order) can be left alone, e.g. a
segmentation head. Frozen convs (weights without requires_grad, such as patch
whitening's) are left alone. Composer reports +0.7 mIoU on ADE20k segmentation.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


class StandardizeWeight(nn.Module):
    """Parametrization: zero mean and unit variance over each output filter's fan-in."""

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        fan_in_dims = tuple(range(1, weight.dim()))
        var, mean = torch.var_mean(weight, dim=fan_in_dims, keepdim=True, unbiased=False)
        return (weight - mean) / torch.sqrt(var + self.eps)


def _is_standardized(conv: nn.Module) -> bool:
    return parametrize.is_parametrized(conv, "weight") and any(
        isinstance(p, StandardizeWeight) for p in conv.parametrizations.weight)


def apply_weight_standardization(model: nn.Module, n_last_layers_ignore: int = 0, eps: float = 1e-5,
                                 allow_empty: bool = False) -> SurgeryReport:
    """Standardize the weights of every Conv1d/2d/3d except the last ``n_last_layers_ignore`` ones."""
    report = SurgeryReport("weight_standardization")
    convs = [(name, m) for name, m in model.named_modules() if isinstance(m, _CONVS)]
    if n_last_layers_ignore > 0:
        convs = convs[:-n_last_layers_ignore]
    for name, conv in convs:
        # frozen filters (e.g. patch whitening's) are fixed on purpose: standardizing them would change them
        if not _is_standardized(conv) and conv.weight.requires_grad:
            parametrize.register_parametrization(conv, "weight", StandardizeWeight(eps))
            report.add("convs", f"{name}: weight standardized")
    return report.require_changes(allow_empty, "convolutions (after leaving out the last "
                                  f"{n_last_layers_ignore})")


class WeightStandardization(Method):
    CARD = MethodCard(
        name="weight_standardization",
        summary="Use conv filters standardized to zero mean, unit variance over their fan-in.",
        domain="vision",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("n_last_layers_ignore", int, 0, low=0, high=100, step=1,
                   help="leave the last n convs (in module order) unstandardized"),
            HParam("allow_empty", bool, False, help="do not fail on a model without convolutions"),
        ),
        requirements=("a model with Conv1d/2d/3d layers; best with GroupNorm",),
        effect="+0.7 mIoU on ADE20k segmentation (Composer); smoother optimisation with small-batch norms "
               "(Qiao et al. 2019)",
        source="Qiao et al. 2019, Micro-Batch Training with Batch-Channel Normalization and Weight "
               "Standardization; Composer WeightStandardization docs",
    )

    def apply(self, event, state, logger):
        record_surgery(logger, apply_weight_standardization(state.model, **self.params))
