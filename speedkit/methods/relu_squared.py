"""ReLU squared: use relu(x)**2 as the transformer MLP's activation.

Primer's architecture search found squared ReLU the single most useful change to the feed-forward
block (So et al. 2021), and modded-nanogpt's GPT-2 speed-runs use it in place of GELU: cheaper than
GELU and slightly better per step. MLP blocks are found by structure (see :func:`find_mlp_blocks`),
so any d -> hidden -> d feed-forward with an activation between its two Linears qualifies.
"""
from __future__ import annotations

import dataclasses
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery

# Attribute names under which MLPs usually keep their activation (module, function or name).
ACTIVATION_ATTRS = ("activation", "act", "act_fn", "activation_fn", "nonlinearity", "act_layer")
_NOT_ELEMENTWISE = (nn.MultiheadAttention, nn.Softmax, nn.Softmin, nn.LogSoftmax, nn.Softmax2d, nn.GLU)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)**2."""
    return F.relu(x).square()


class ReLUSquaredModule(nn.Module):
    """relu(x)**2 as a module."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_squared(x)


def is_activation_module(module: nn.Module) -> bool:
    """An elementwise activation module: torch's (GELU, ReLU, SiLU, ...), Hugging Face's (``ACT2FN``'s
    NewGELUActivation, ...) or speedkit's ReLUSquaredModule."""
    if isinstance(module, ReLUSquaredModule):
        return True
    if type(module).__module__ == "transformers.activations":
        return True
    return type(module).__module__ == "torch.nn.modules.activation" and not isinstance(module, _NOT_ELEMENTWISE)


def linear_features(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a linear layer: an ``nn.Linear``, or Hugging Face's ``Conv1D`` (GPT-2's MLP and
    attention projections, a Linear whose weight is stored transposed: [in, out]); None for anything else."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(getattr(module, "nf", None), int) and \
            isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(module.nf)
    return None


@dataclasses.dataclass
class MLPBlock:
    """A feed-forward block found by structure: ``first`` (d -> h) Linear, an activation, ``second`` (h -> d).

    ``activation_kind`` says how the activation is held: "module" (a child module, e.g. nn.GELU in a
    Sequential), "function" (an attribute holding a function, e.g. nn.TransformerEncoderLayer's
    ``activation=F.relu``) or "string" (a name the module's forward interprets, e.g. speedkit GPT's
    ``MLP.activation = "gelu"``).
    """

    name: str
    module: nn.Module
    first: str
    second: str
    activation_attr: str
    activation_kind: str

    @property
    def gated(self) -> bool:
        """Already a gated block (LLaMA's gate_proj/up_proj/down_proj): another d -> h linear beside ``first``."""
        shape = linear_features(getattr(self.module, self.first))
        return any(attr != self.first and linear_features(child) == shape
                   for attr, child in self.module.named_children())

    @property
    def activation(self):
        return getattr(self.module, self.activation_attr)

    def describe_activation(self) -> str:
        act = self.activation
        if self.activation_kind == "module":
            return type(act).__name__
        if self.activation_kind == "function":
            return getattr(act, "__name__", repr(act))
        return repr(act)


def _find_activation(module: nn.Module, children: list, first_index: int, second_index: int):
    """(attribute, kind) of the activation between two Linears of ``module``, or None."""
    if isinstance(module, nn.Sequential):  # order is the data flow: the activation lies between them
        between = [(attr, c) for attr, c in children[first_index + 1:second_index] if is_activation_module(c)]
        return (between[0][0], "module") if len(between) == 1 else None
    modules = [attr for attr, c in children if is_activation_module(c)]
    if len(modules) == 1:
        return modules[0], "module"
    for attr in ACTIVATION_ATTRS:
        value = module.__dict__.get(attr)
        if isinstance(value, str):
            return attr, "string"
        if callable(value) and not isinstance(value, nn.Module):
            return attr, "function"
    return None


def find_mlp_blocks(model: nn.Module) -> list[MLPBlock]:
    """Every module with two linear children in order (``nn.Linear`` or Hugging Face ``Conv1D``), d -> h then
    h -> d, and an activation between."""
    blocks = []
    for name, module in model.named_modules():
        children = list(module.named_children())
        linear_at = [i for i, (_, c) in enumerate(children) if linear_features(c) is not None]
        for i, j in zip(linear_at, linear_at[1:]):
            (d_in, hidden), (h_in, d_out) = linear_features(children[i][1]), linear_features(children[j][1])
            if hidden != h_in or d_in != d_out:
                continue
            found = _find_activation(module, children, i, j)
            if found is not None:
                blocks.append(MLPBlock(name, module, children[i][0], children[j][0], *found))
                break
    return blocks


def class_understands(module: nn.Module, value: str) -> bool:
    """Whether the module's class, or the file defining it, spells out the activation name ``value`` (the
    string protocol: a module whose forward switches on ``self.activation`` documents the names it takes,
    e.g. speedkit GPT's config lists "gelu" | "relu2")."""
    quoted = (f'"{value}"', f"'{value}'")
    for klass in type(module).__mro__:
        if klass in (nn.Module, object):
            continue
        for where in (klass, inspect.getmodule(klass)):
            try:
                source = inspect.getsource(where)
            except (OSError, TypeError):
                continue
            if any(q in source for q in quoted):
                return True
    return False


def set_activation(block: MLPBlock, new: nn.Module, name: str) -> str:
    """Swap the block's activation for ``new`` (modules and functions) or the name ``name`` (strings);
    returns a description, or raises ValueError when a string-protocol module does not know ``name``."""
    old = block.describe_activation()
    if block.activation_kind == "string":
        if not class_understands(block.module, name):
            raise ValueError(f"{type(block.module).__name__}.{block.activation_attr} is a name its forward "
                             f"interprets, and it does not mention {name!r}")
        setattr(block.module, block.activation_attr, name)
        return f"{block.activation_attr} {old} -> {name!r}"
    # nn.Module.__setattr__ drops a plain attribute of the same name, so functions become modules too.
    setattr(block.module, block.activation_attr, new)
    if hasattr(block.module, "activation_relu_or_gelu"):
        # nn.TransformerEncoderLayer's fused inference path hard-codes relu/gelu; 0 turns it off.
        block.module.activation_relu_or_gelu = 0
    return f"{block.activation_attr} {old} -> {type(new).__name__}"


def _already_relu_squared(block: MLPBlock) -> bool:
    act = block.activation
    return isinstance(act, ReLUSquaredModule) or act is relu_squared or act == "relu2"


def apply_relu_squared(model: nn.Module, allow_empty: bool = False) -> SurgeryReport:
    """Make every MLP block of ``model`` use relu(x)**2 as its activation."""
    report = SurgeryReport("relu_squared")
    for block in find_mlp_blocks(model):
        where = block.name or type(block.module).__name__
        if _already_relu_squared(block):
            report.details.append(f"note: {where} already uses relu squared")
            continue
        try:
            change = set_activation(block, ReLUSquaredModule(), "relu2")
        except ValueError as e:
            report.details.append(f"note: {where} left alone: {e}")
            continue
        report.add("MLP activations", f"{where}: {change}")
    return report.require_changes(allow_empty, "MLP blocks (Linear d->h, activation, Linear h->d) to change")


class ReLUSquared(Method):
    CARD = MethodCard(
        name="relu_squared",
        summary="Use relu(x)**2 as the activation of every transformer MLP block.",
        domain="language",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(HParam("allow_empty", bool, False, help="do not fail on a model without MLP blocks"),),
        requirements=("MLP blocks: Linear d->h, an activation (module, function, or a name the block's forward "
                      "knows, e.g. speedkit GPT's 'relu2'), Linear h->d",),
        exclusive=("mlp_activation",),
        effect="Primer: squared ReLU was its largest single gain; modded-nanogpt uses it in its GPT-2 "
               "speed-run records; cheaper than GELU",
        source="So et al. 2021 (Primer); modded-nanogpt",
    )

    def apply(self, event, state, logger):
        record_surgery(logger, apply_relu_squared(state.model, self.params["allow_empty"]))
