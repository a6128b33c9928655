"""Low-precision LayerNorm: under autocast, normalize in bf16/fp16 instead of autocast's fp32.

Every ``nn.LayerNorm`` (including a GPT's) becomes a ``LowPrecisionLayerNorm`` subclass with the very same
parameters; without autocast it computes exactly what ``nn.LayerNorm`` does. Under autocast the output is
in the autocast dtype, which saves a round trip through fp32 (memory traffic) between matmuls. Composer
lists it for throughput under AMP (its fused-LayerNorm method was removed in favour of this one).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.algorithms._surgery import adopt_state, in_low_precision, record_surgery, replace_modules
from speedkit.core.algorithm import Algorithm, HParam, MethodCard, SurgeryReport
from speedkit.core.event import Event


class LowPrecisionLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, (x, weight, bias), context = in_low_precision(x, self.weight, self.bias)
        if dtype is None:
            return super().forward(x)
        with context:
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def _low_precision_copy(norm: nn.LayerNorm) -> LowPrecisionLayerNorm:
    new = LowPrecisionLayerNorm(norm.normalized_shape, eps=norm.eps, elementwise_affine=norm.elementwise_affine,
                                bias=getattr(norm, "bias", None) is not None, device="meta")
    return adopt_state(new, norm)


def apply_low_precision_layernorm(model: nn.Module, allow_empty: bool = False) -> SurgeryReport:
    """Replace every ``nn.LayerNorm`` (exact class) by ``LowPrecisionLayerNorm``, keeping its parameters."""
    report = SurgeryReport("low_precision_layernorm")
    replace_modules(model, lambda name, m: type(m) is nn.LayerNorm, lambda name, m: _low_precision_copy(m),
                    report, "layer norms")
    return report.require_changes(allow_empty, "nn.LayerNorm layers")


class LowPrecisionLayerNormMethod(Algorithm):
    CARD = MethodCard(
        name="low_precision_layernorm",
        summary="Run LayerNorm in the autocast dtype (bf16/fp16) instead of fp32; unchanged without autocast.",
        domain="any",
        events=(Event.INIT,),
        reads=("model", "precision"),
        writes=("model",),
        hparams=(HParam("allow_empty", bool, False, help="do not fail on a model without LayerNorm"),),
        requirements=("autocast precision (bf16 or fp16) to have an effect", "nn.LayerNorm layers"),
        effect="higher throughput under AMP by skipping fp32 casts around each LayerNorm (Composer); numerics "
               "slightly less precise",
        source="Composer LowPrecisionLayerNorm docs",
    )

    def apply(self, event, state, logger):
        report = apply_low_precision_layernorm(state.model, **self.params)
        if state.precision not in ("bf16", "fp16"):
            report.details.append(f"note: precision is {state.precision}; the norms act only under autocast")
        record_surgery(state, logger, report)
