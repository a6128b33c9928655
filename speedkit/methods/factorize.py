"""Factorize: replace large convs and linears by low-rank pairs to cut FLOPs.

    Conv2d  C -> O, k x k     ->  Conv2d C -> r, k x k (same stride/padding)  then  Conv2d r -> O, 1 x 1
    Linear  I -> O            ->  Linear I -> r (no bias)                    then  Linear r -> O

Only layers with at least ``min_channels`` input and output channels (features) are factorized, with
r = ``latent_fraction`` x min(in, out) (or ``latent_channels`` if given), and only when the pair costs
fewer multiply-adds than the original. Both factors are initialized from the truncated SVD of the original
weight, W ~ U_r S_r V_r^T (each factor takes sqrt(S_r)), so the output stays as close as a rank-r layer
can be; at full rank it is the same function. Tied weights (e.g. a GPT's lm_head) are never split.

Honest note: Composer's own tests found factorization NEGATIVE for time to accuracy (the accuracy lost
costs more steps than the FLOPs saved); it is here for completeness and for inference-size experiments.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery, replace_modules, shared_parameter_ids


def _svd_factors(weight_2d: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(left [O, r], right [r, I]) with left @ right the best rank-r approximation of ``weight_2d``."""
    u, s, vh = torch.linalg.svd(weight_2d.detach().float(), full_matrices=False)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


class FactorizedConv2d(nn.Module):
    """k x k conv to ``latent`` channels followed by a 1x1 conv to the output channels."""

    def __init__(self, conv: nn.Conv2d, latent: int):
        super().__init__()
        self.in_channels, self.out_channels, self.latent_channels = conv.in_channels, conv.out_channels, latent
        w = conv.weight
        self.conv1 = nn.Conv2d(conv.in_channels, latent, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                               dilation=conv.dilation, bias=False, padding_mode=conv.padding_mode,
                               device=w.device, dtype=w.dtype)
        self.conv2 = nn.Conv2d(latent, conv.out_channels, 1, bias=conv.bias is not None, device=w.device, dtype=w.dtype)
        left, right = _svd_factors(w.reshape(w.shape[0], -1), latent)
        with torch.no_grad():
            self.conv1.weight.copy_(right.reshape(latent, *w.shape[1:]))
            self.conv2.weight.copy_(left[:, :, None, None])
            if conv.bias is not None:
                self.conv2.bias.copy_(conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class FactorizedLinear(nn.Module):
    """Linear to ``latent`` features (no bias) followed by a Linear to the output features."""

    def __init__(self, linear: nn.Linear, latent: int):
        super().__init__()
        self.in_features, self.out_features, self.latent_features = linear.in_features, linear.out_features, latent
        w = linear.weight
        self.linear1 = nn.Linear(linear.in_features, latent, bias=False, device=w.device, dtype=w.dtype)
        self.linear2 = nn.Linear(latent, linear.out_features, bias=linear.bias is not None,
                                 device=w.device, dtype=w.dtype)
        left, right = _svd_factors(w, latent)
        with torch.no_grad():
            self.linear1.weight.copy_(right)
            self.linear2.weight.copy_(left)
            if linear.bias is not None:
                self.linear2.bias.copy_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.linear1(x))


def _latent(n_in: int, n_out: int, latent_fraction: float, latent_channels: int | None) -> int:
    latent = latent_channels if latent_channels else int(latent_fraction * min(n_in, n_out))
    return max(1, latent)


def conv_saves_flops(conv: nn.Conv2d, latent: int) -> bool:
    """Per output pixel: O*C*k*k multiply-adds before, r*C*k*k + O*r after."""
    fan_in = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
    return latent * (fan_in + conv.out_channels) < conv.out_channels * fan_in


def linear_saves_flops(linear: nn.Linear, latent: int) -> bool:
    return latent * (linear.in_features + linear.out_features) < linear.in_features * linear.out_features


def apply_factorization(model: nn.Module, factorize_convs: bool = True, factorize_linears: bool = True,
                        min_channels: int = 256, latent_fraction: float = 0.25, latent_channels: int | None = None,
                        allow_empty: bool = False) -> SurgeryReport:
    """Factorize every large enough ``nn.Conv2d`` (groups 1) and ``nn.Linear`` where it saves FLOPs."""
    report = SurgeryReport("factorize")
    tied = shared_parameter_ids(model)

    def conv_latent(m):
        return _latent(m.in_channels, m.out_channels, latent_fraction, latent_channels)

    def linear_latent(m):
        return _latent(m.in_features, m.out_features, latent_fraction, latent_channels)

    if factorize_convs:
        replace_modules(
            model,
            lambda name, m: (type(m) is nn.Conv2d and m.groups == 1 and id(m.weight) not in tied
                             and min(m.in_channels, m.out_channels) >= min_channels
                             and conv_saves_flops(m, conv_latent(m))),
            lambda name, m: FactorizedConv2d(m, conv_latent(m)), report, "convs")
    if factorize_linears:
        replace_modules(
            model,
            lambda name, m: (type(m) is nn.Linear and id(m.weight) not in tied
                             and min(m.in_features, m.out_features) >= min_channels
                             and linear_saves_flops(m, linear_latent(m))),
            lambda name, m: FactorizedLinear(m, linear_latent(m)), report, "linears")
    return report.require_changes(allow_empty, f"Conv2d/Linear layers with >= {min_channels} channels whose "
                                  "factorization saves FLOPs")


class Factorize(Method):
    CARD = MethodCard(
        name="factorize",
        summary="Split large convs and linears into low-rank pairs initialized by SVD (fewer FLOPs).",
        domain="any",
        events=(Event.INIT,),
        # MLP surgeries find their blocks by the Linear -> activation -> Linear shape that factorizing
        # would break, so they go first and factorize then splits whatever Linears they leave.
        runs_after=("gated_linear_units", "relu_squared"),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("factorize_convs", bool, True, help="factorize Conv2d layers"),
            HParam("factorize_linears", bool, True, help="factorize Linear layers"),
            HParam("min_channels", int, 256, low=1, high=65536, step=1,
                   help="only layers with at least this many input and output channels"),
            HParam("latent_fraction", float, 0.25, low=0.01, high=1.0, step=0.01,
                   help="latent rank as a fraction of min(in, out)"),
            HParam("allow_empty", bool, False, help="do not fail on a model with nothing large enough"),
        ),
        requirements=("Conv2d/Linear layers with >= min_channels channels",),
        effect="NEGATIVE in Composer's own tests (accuracy lost outweighs the FLOPs saved); fewer FLOPs and "
               "parameters per factorized layer",
        source="Composer Factorize docs (Jaderberg et al. 2014 / Zhang et al. 2015 style low-rank factorization)",
    )

    def apply(self, event, state, logger):
        record_surgery(logger, apply_factorization(state.model, **self.params))
