"""Gated linear units in the MLP: act(x W) * (x V) replaces act(x W) (GeGLU / SwiGLU).

Shazeer 2020 ("GLU Variants Improve Transformer") found gated feed-forward blocks better per step
than GELU/ReLU ones at the same parameter count, by shrinking the hidden size to 2/3 (two input
projections instead of one). Composer's GatedLinearUnits does this for BERT. Here any MLP block found
by structure (see :func:`speedkit.methods.relu_squared.find_mlp_blocks`) is converted: its first
Linear becomes a :class:`GatedLinearUnit` (d -> h, gated), its second a Linear h -> d, and the old
activation becomes the identity.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery
from speedkit.methods.relu_squared import MLPBlock, class_understands, find_mlp_blocks, linear_features

GATE_ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu}


class GatedLinearUnit(nn.Module):
    """x -> act(x W_gate) * (x W_value), both projections in one Linear d -> 2h (one matmul)."""

    def __init__(self, in_features: int, hidden_features: int, activation: str = "gelu", bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if activation not in GATE_ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(GATE_ACTIVATIONS)}, got {activation!r}")
        self.in_features, self.out_features, self.activation = in_features, hidden_features, activation
        self.proj = nn.Linear(in_features, 2 * hidden_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.proj(x).chunk(2, dim=-1)
        return GATE_ACTIVATIONS[self.activation](gate) * value

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, activation={self.activation}"


def gated_linear_unit(x: torch.Tensor, gate_weight: torch.Tensor, value_weight: torch.Tensor,
                      activation: str = "gelu") -> torch.Tensor:
    """act(x @ gate_weight.T) * (x @ value_weight.T): the functional form of one gated unit."""
    return GATE_ACTIVATIONS[activation](F.linear(x, gate_weight)) * F.linear(x, value_weight)


def _like(new: nn.Linear, old: nn.Linear) -> nn.Linear:
    """Initialise ``new`` at the scale of the layer it replaces (the model's own init choice)."""
    with torch.no_grad():
        new.weight.normal_(0.0, float(old.weight.std()))
        if new.bias is not None:
            new.bias.zero_()
    return new


class _GatedMLPForward:
    """Instance forward for string-protocol MLPs whose class has no identity activation:
    second(first(x)), then the block's dropout(s). An object, not a closure, so deepcopy rewires it."""

    def __init__(self, module: nn.Module, first: str, second: str):
        self.module, self.first, self.second = module, first, second

    def __call__(self, x):
        module = self.module
        x = getattr(module, self.second)(getattr(module, self.first)(x))
        for child in module.children():
            if isinstance(child, nn.Dropout):
                x = child(x)
        return x


def convert_to_glu(block: MLPBlock, activation: str = "gelu", hidden_fraction: float = 2 / 3) -> str:
    """Turn one MLP block into a gated one in place; returns a description of the change."""
    module = block.module
    first, second = getattr(module, block.first), getattr(module, block.second)
    (d_in, old_hidden), (_, d_out) = linear_features(first), linear_features(second)  # nn.Linear or HF Conv1D
    hidden = max(1, round(old_hidden * hidden_fraction))
    factory = dict(device=first.weight.device, dtype=first.weight.dtype)
    glu = GatedLinearUnit(d_in, hidden, activation, bias=getattr(first, "bias", None) is not None, **factory)
    _like(glu.proj, first)
    out = _like(nn.Linear(hidden, d_out, bias=getattr(second, "bias", None) is not None, **factory), second)
    setattr(module, block.first, glu)
    setattr(module, block.second, out)
    if block.activation_kind == "string":
        if class_understands(module, "identity"):
            setattr(module, block.activation_attr, "identity")
        else:
            # Its forward would apply its own activation after the gate; run first -> second instead.
            module.forward = _GatedMLPForward(module, block.first, block.second)
    else:
        setattr(module, block.activation_attr, nn.Identity())
        if hasattr(module, "activation_relu_or_gelu"):
            module.activation_relu_or_gelu = 0  # TransformerEncoderLayer's fused path assumes relu/gelu
    return (f"{block.first} {type(first).__name__} {d_in}->{old_hidden} -> GatedLinearUnit "
            f"{d_in}->{hidden} ({activation}); {block.second} -> Linear {hidden}->{d_out}")


def apply_gated_linear_units(model: nn.Module, activation: str = "gelu", hidden_fraction: float = 2 / 3,
                             allow_empty: bool = False) -> SurgeryReport:
    """Convert every MLP block of ``model`` into a gated linear unit block (GeGLU or SwiGLU).

    With ``hidden_fraction=2/3`` the parameter count stays the same as the d -> 4d -> d original.
    New weights are initialised at the scale of the ones they replace; build optimizers afterwards.
    """
    report = SurgeryReport("gated_linear_units")
    for block in find_mlp_blocks(model):
        where = block.name or type(block.module).__name__
        if block.gated:
            report.details.append(f"note: {where} is gated already ({type(block.module).__name__}); left alone")
            continue
        report.add("MLP blocks", f"{where}: {convert_to_glu(block, activation, hidden_fraction)}")
    looked_for = "MLP blocks (Linear d->h, activation, Linear h->d)"
    if any("is gated already" in d for d in report.details):
        looked_for += " that are not gated already (the model's MLPs are gated)"
    return report.require_changes(allow_empty, looked_for)


class GatedLinearUnits(Method):
    CARD = MethodCard(
        name="gated_linear_units",
        summary="Replace each MLP's first Linear and activation by a gated linear unit (GeGLU / SwiGLU).",
        domain="language",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("activation", str, "gelu", choices=("gelu", "silu"), help="gelu: GeGLU; silu: SwiGLU"),
            HParam("hidden_fraction", float, 2 / 3, low=0.25, high=1.0, step=1 / 12,
                   help="gated hidden size as a fraction of the old one; 2/3 keeps the parameter count"),
            HParam("allow_empty", bool, False, help="do not fail on a model without MLP blocks"),
        ),
        requirements=("MLP blocks: Linear d->h, an activation, Linear h->d",
                      "optimizers built after INIT (the Trainer's factory form): new parameters"),
        exclusive=("mlp_activation",),
        effect="Shazeer 2020: GeGLU/SwiGLU reach lower perplexity per step than ReLU/GELU at equal parameters; "
               "Composer reports better convergence per step for BERT, at some throughput cost",
        source="Shazeer 2020 (GLU Variants Improve Transformer); Composer GatedLinearUnits docs",
    )

    def apply(self, event, state, logger):
        p = self.params
        report = apply_gated_linear_units(state.model, p["activation"], p["hidden_fraction"], p["allow_empty"])
        record_surgery(logger, report)
