"""Low-precision LayerNorm: under autocast, normalize in bf16/fp16 instead of autocast's fp32.

Every ``nn.LayerNorm`` (including a GPT's) becomes a ``LowPrecisionLayerNormModule`` subclass with the very same
parameters; without autocast it computes exactly what ``nn.LayerNorm`` does. Under autocast the output is
in the autocast dtype, which saves a round trip through fp32 (memory traffic) between matmuls. Composer
lists it for throughput under AMP (its fused-LayerNorm method was removed in favour of this one).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.method import SurgeryReport
from speedkit.methods._low_precision_norm import LowPrecisionNormMethod, low_precision_norm_card, replace_norms
from speedkit.methods._surgery import adopt_state, in_low_precision


class LowPrecisionLayerNormModule(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, (x, weight, bias), context = in_low_precision(x, self.weight, self.bias)
        if dtype is None:
            return super().forward(x)
        with context:
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def _low_precision_copy(norm: nn.LayerNorm) -> LowPrecisionLayerNormModule:
    new = LowPrecisionLayerNormModule(norm.normalized_shape, eps=norm.eps, elementwise_affine=norm.elementwise_affine,
                                bias=getattr(norm, "bias", None) is not None, device="meta")
    return adopt_state(new, norm)


def apply_low_precision_layernorm(model: nn.Module, allow_empty: bool = False) -> SurgeryReport:
    """Replace every ``nn.LayerNorm`` (exact class) by ``LowPrecisionLayerNormModule``, keeping its parameters."""
    return replace_norms(model, nn.LayerNorm, _low_precision_copy, "low_precision_layernorm", "layer norms",
                         allow_empty)


class LowPrecisionLayerNorm(LowPrecisionNormMethod):
    CARD = low_precision_norm_card("low_precision_layernorm", "LayerNorm", domain="any")
    surgery = staticmethod(apply_low_precision_layernorm)
