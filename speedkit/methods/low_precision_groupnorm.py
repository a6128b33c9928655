"""Low-precision GroupNorm: under autocast, normalize in bf16/fp16 instead of autocast's fp32.

Every ``nn.GroupNorm`` becomes a ``LowPrecisionGroupNormModule`` subclass with the very same parameters; without
autocast it computes exactly what ``nn.GroupNorm`` does. Under autocast the output is in the autocast
dtype, saving the fp32 round trip. Composer lists it for throughput under AMP.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.method import SurgeryReport
from speedkit.methods._low_precision_norm import LowPrecisionNormMethod, low_precision_norm_card, replace_norms
from speedkit.methods._surgery import adopt_state, in_low_precision


class LowPrecisionGroupNormModule(nn.GroupNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, (x, weight, bias), context = in_low_precision(x, self.weight, self.bias)
        if dtype is None:
            return super().forward(x)
        with context:
            return F.group_norm(x, self.num_groups, weight, bias, self.eps)


def _low_precision_copy(norm: nn.GroupNorm) -> LowPrecisionGroupNormModule:
    new = LowPrecisionGroupNormModule(norm.num_groups, norm.num_channels, eps=norm.eps, affine=norm.affine,
                                      device="meta")
    return adopt_state(new, norm)


def apply_low_precision_groupnorm(model: nn.Module, allow_empty: bool = False) -> SurgeryReport:
    """Replace every ``nn.GroupNorm`` (exact class) by ``LowPrecisionGroupNormModule``, keeping its parameters."""
    return replace_norms(model, nn.GroupNorm, _low_precision_copy, "low_precision_groupnorm", "group norms",
                         allow_empty)


class LowPrecisionGroupNorm(LowPrecisionNormMethod):
    CARD = low_precision_norm_card("low_precision_groupnorm", "GroupNorm", domain="vision")
    surgery = staticmethod(apply_low_precision_groupnorm)
