"""Identity initialization: make every residual block start as (close to) the identity.

Two parts, each optional:
  * Dirac init (airbench): every conv with as many input as output channels (groups 1) and an odd
    square-or-not kernel gets ``torch.nn.init.dirac_`` weights (output channel i copies input channel i
    through the kernel's centre), plus optional Gaussian noise of std ``noise``, so it starts as an identity.
  * Zero-init of the last norm of every residual branch (Goyal et al. 2017, "Accurate, Large Minibatch
    SGD"): the branch then outputs 0 and the block computes relu(shortcut(x)). Blocks are found by structure
    (``find_residual_blocks``), so speedkit and torchvision ResNets both work.

Deep nets initialized like this train stably at high learning rates from the first step; Goyal et al.
used zero-gamma to train ResNet-50 with batch 8k without accuracy loss, and airbench uses Dirac init.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import find_residual_blocks, record_surgery

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _dirac_ready(conv: nn.Module) -> bool:
    return (isinstance(conv, _CONVS) and conv.in_channels == conv.out_channels and conv.groups == 1
            and all(k % 2 == 1 for k in conv.kernel_size))


@torch.no_grad()
def apply_identity_init(model: nn.Module, dirac: bool = True, zero_branch: bool = True, noise: float = 0.0,
                        allow_empty: bool = False) -> SurgeryReport:
    """Dirac-init square odd-kernel convs and zero the scale of every residual branch's last norm."""
    report = SurgeryReport("identity_init")
    if dirac:
        for name, conv in model.named_modules():
            if _dirac_ready(conv):
                nn.init.dirac_(conv.weight)
                if noise > 0:
                    conv.weight.add_(torch.randn_like(conv.weight) * noise)
                if conv.bias is not None:
                    conv.bias.zero_()
                report.add("dirac convs", f"{name}: dirac{' + noise' if noise > 0 else ''}")
    if zero_branch:
        for block in find_residual_blocks(model):
            if block.last_norm is not None:
                block.last_norm.weight.zero_()
                report.add("zeroed branch norms", f"{block.name}: last norm scale = 0")
    return report.require_changes(allow_empty, "convs with in == out channels and odd kernels, or residual "
                                  "branches ending in a norm")


class IdentityInit(Method):
    CARD = MethodCard(
        name="identity_init",
        summary="Dirac-init square convs and zero each residual branch's last norm, so blocks start as identities.",
        domain="vision",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("dirac", bool, True, help="Dirac-init convs with in == out channels and odd kernels"),
            HParam("zero_branch", bool, True, help="zero the scale of the last norm of every residual branch"),
            HParam("noise", float, 0.0, low=0.0, high=0.1, step=0.001, help="std of noise added to Dirac weights"),
            HParam("allow_empty", bool, False, help="do not fail on a model with nothing to initialize"),
        ),
        requirements=("convs and/or residual blocks (branch/shortcut or torchvision-style)",
                      "acts on the initial weights: put it before loading pretrained weights, not after"),
        effect="stable training at high learning rates from the start; ResNet-50 batch 8k without accuracy "
               "loss (Goyal et al. 2017); part of airbench's CIFAR-10 speed-run",
        source="Goyal et al. 2017, Accurate, Large Minibatch SGD; airbench (Keller Jordan 2024)",
    )

    def apply(self, event, state, logger):
        record_surgery(logger, apply_identity_init(state.model, **self.params))
