"""Low-precision GroupNorm: under autocast, normalize in bf16/fp16 instead of autocast's fp32.

Every ``nn.GroupNorm`` becomes a ``LowPrecisionGroupNorm`` subclass with the very same parameters; without
autocast it computes exactly what ``nn.GroupNorm`` does. Under autocast the output is in the autocast
dtype, saving the fp32 round trip. Composer lists it for throughput under AMP.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.algorithms._surgery import adopt_state, in_low_precision, record_surgery, replace_modules
from speedkit.core.algorithm import Algorithm, HParam, MethodCard, SurgeryReport
from speedkit.core.event import Event


class LowPrecisionGroupNorm(nn.GroupNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, (x, weight, bias), context = in_low_precision(x, self.weight, self.bias)
        if dtype is None:
            return super().forward(x)
        with context:
            return F.group_norm(x, self.num_groups, weight, bias, self.eps)


def _low_precision_copy(norm: nn.GroupNorm) -> LowPrecisionGroupNorm:
    new = LowPrecisionGroupNorm(norm.num_groups, norm.num_channels, eps=norm.eps, affine=norm.affine, device="meta")
    return adopt_state(new, norm)


def apply_low_precision_groupnorm(model: nn.Module, allow_empty: bool = False) -> SurgeryReport:
    """Replace every ``nn.GroupNorm`` (exact class) by ``LowPrecisionGroupNorm``, keeping its parameters."""
    report = SurgeryReport("low_precision_groupnorm")
    replace_modules(model, lambda name, m: type(m) is nn.GroupNorm, lambda name, m: _low_precision_copy(m),
                    report, "group norms")
    return report.require_changes(allow_empty, "nn.GroupNorm layers")


class LowPrecisionGroupNormMethod(Algorithm):
    CARD = MethodCard(
        name="low_precision_groupnorm",
        summary="Run GroupNorm in the autocast dtype (bf16/fp16) instead of fp32; unchanged without autocast.",
        domain="vision",
        events=(Event.INIT,),
        reads=("model", "precision"),
        writes=("model",),
        hparams=(HParam("allow_empty", bool, False, help="do not fail on a model without GroupNorm"),),
        requirements=("autocast precision (bf16 or fp16) to have an effect", "nn.GroupNorm layers"),
        effect="higher throughput under AMP by skipping fp32 casts around each GroupNorm (Composer); numerics "
               "slightly less precise",
        source="Composer LowPrecisionGroupNorm docs",
    )

    def apply(self, event, state, logger):
        report = apply_low_precision_groupnorm(state.model, **self.params)
        if state.precision not in ("bf16", "fp16"):
            report.details.append(f"note: precision is {state.precision}; the norms act only under autocast")
        record_surgery(state, logger, report)
