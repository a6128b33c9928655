"""Squeeze-and-Excitation (Hu et al. 2018): after a conv, rescale each channel by a gate computed from
the global average of all channels.

    s = sigmoid(W2 relu(W1 avgpool(y)))      y = conv(x),  W1: C -> latent,  W2: latent -> C
    out = y * s

The SE block is attached to convs with at least ``min_channels`` output channels (wide, late layers,
where it helps most and costs least relative to the conv). ``latent_channels`` >= 1 is a channel count;
below 1 it is a fraction of the conv's output channels. The conv keeps its parameter names (the new
module subclasses Conv2d and adds an ``se`` child), so an original checkpoint loads with strict=False.
Composer lists it for accuracy at an inference cost; Hu et al. report -1.5% top-1 error on ResNet-50.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import adopt_state, record_surgery, replace_modules


class SqueezeExcite2d(nn.Module):
    """Channel gate: global average pool -> 1x1 conv to ``latent`` -> ReLU -> 1x1 conv back -> sigmoid."""

    def __init__(self, channels: int, latent: int, device=None, dtype=None):
        super().__init__()
        self.squeeze = nn.Conv2d(channels, latent, 1, device=device, dtype=dtype)
        self.excite = nn.Conv2d(latent, channels, 1, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean(dim=(2, 3), keepdim=True)
        return x * torch.sigmoid(self.excite(torch.relu(self.squeeze(pooled))))


class SqueezeExciteConv2d(nn.Conv2d):
    """A Conv2d followed by a SqueezeExcite2d on its output; the conv's own parameters keep their names."""

    def __init__(self, *args, latent: int = 64, **kwargs):
        super().__init__(*args, **kwargs)
        self.se = SqueezeExcite2d(self.out_channels, latent, device=self.weight.device, dtype=self.weight.dtype)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, latent: int) -> "SqueezeExciteConv2d":
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                  dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode, latent=latent, device=conv.weight.device, dtype=conv.weight.dtype)
        se = new.se
        del new.se  # adopt the conv's state first, then re-attach the fresh SE block
        adopt_state(new, conv)
        new.se = se
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se(super().forward(x))


def latent_size(channels: int, latent_channels: float) -> int:
    """``latent_channels`` >= 1 is a count; below 1 a fraction of ``channels``; at least 1 either way."""
    latent = latent_channels if latent_channels >= 1 else latent_channels * channels
    return max(1, int(round(latent)))


def apply_squeeze_excite(model: nn.Module, latent_channels: float = 64, min_channels: int = 128,
                         allow_empty: bool = False) -> SurgeryReport:
    """Attach an SE block after every ``nn.Conv2d`` with at least ``min_channels`` output channels."""
    report = SurgeryReport("squeeze_excite")
    replace_modules(
        model,
        lambda name, m: (isinstance(m, nn.Conv2d) and not isinstance(m, SqueezeExciteConv2d)
                         and m.out_channels >= min_channels),
        lambda name, m: SqueezeExciteConv2d.from_conv(m, latent_size(m.out_channels, latent_channels)),
        report, "convs")
    return report.require_changes(allow_empty, f"Conv2d layers with >= {min_channels} output channels")


class SqueezeExcite(Method):
    CARD = MethodCard(
        name="squeeze_excite",
        summary="Add squeeze-and-excitation channel gates after wide convolutions.",
        domain="vision",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("latent_channels", float, 64.0, low=0.01, high=1024, step=0.01,
                   help="width of the SE bottleneck: a channel count (>= 1) or a fraction of the conv's channels"),
            HParam("min_channels", int, 128, low=1, high=4096, step=1,
                   help="only convs with at least this many output channels get an SE block"),
            HParam("allow_empty", bool, False, help="do not fail on a model without wide convs"),
        ),
        requirements=("a model with Conv2d layers of >= min_channels outputs",),
        effect="better accuracy per step (Hu et al.: ResNet-50 top-1 error 24.8% -> 23.3%) at extra inference "
               "cost; Composer lists it for accuracy",
        source="Hu et al. 2018, Squeeze-and-Excitation Networks; Composer SqueezeExcite docs",
    )

    def apply(self, event, state, logger):
        record_surgery(logger, apply_squeeze_excite(state.model, **self.params))
