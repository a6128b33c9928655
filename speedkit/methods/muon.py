"""Muon for the hidden matrices: move them from the user's optimizer into a :class:`speedkit.optim.muon.Muon`.

Muon orthogonalizes each matrix update (see ``speedkit/optim/muon.py``); it is meant for the hidden
weight matrices and conv filters only. At FIT_START this method partitions the parameters:

* to Muon: every trainable weight matrix with 2 or more dimensions (Linear weights, conv filters),
* left with the user's optimizer (AdamW / SGD): 1-D parameters (biases, norm scales), gains and scales of any
  shape (what a norm module owns, such as QK-norm's per-head ``[H, D]`` gains, and any parameter marked with
  :func:`speedkit.optim.muon.mark_not_a_matrix`), embeddings (any ``nn.Embedding``/``nn.EmbeddingBag``), and
  the output head, i.e. the last ``nn.Linear`` in module order (a GPT's ``lm_head``, a ResNet's ``fc``), plus
  anything tied to those,

What a parameter is decides, not its number of dimensions: a gain is multiplied in elementwise, so
orthogonalising its update would be meaningless (all of a ``[H, D]`` gain's rows would move by the same amount).

removes the Muon parameters (and their optimizer state) from the existing optimizers' groups and
appends the Muon optimizer to ``state.optimizers``, so schedules apply to it too (from its own lr).
"""
from __future__ import annotations

import torch

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery
from speedkit.optim.muon import Muon as MuonOptimizer
from speedkit.optim.muon import is_marked_not_a_matrix

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)
_NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.LocalResponseNorm, torch.nn.modules.batchnorm._NormBase,
          *((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()))


def is_norm_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer, whose parameters are scales and shifts, never matrices:
    torch's norms and their subclasses, and by name any class called ``...Norm`` (Hugging Face's ``LlamaRMSNorm``).
    speedkit's own QK-norm marks its gains with ``mark_not_a_matrix`` instead, so it does not rest on a name."""
    return isinstance(module, _NORMS) or type(module).__name__.endswith("Norm")


def muon_parameter_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters Muon should own: trainable, >= 2-D weight matrices; not embeddings, not the
    output head, not what a norm module owns, not a parameter marked as a gain or scale."""
    excluded: set[int] = set()
    linears = []
    for module in model.modules():
        if isinstance(module, _EMBEDDINGS) or is_norm_module(module):
            excluded.update(id(p) for p in module.parameters(recurse=False))
        if isinstance(module, torch.nn.Linear):
            linears.append(module)
    if linears:  # the output head / final classifier
        excluded.update(id(p) for p in linears[-1].parameters(recurse=False))
    return [name for name, p in model.named_parameters()
            if p.requires_grad and p.dim() >= 2 and id(p) not in excluded and not is_marked_not_a_matrix(p)]


def split_for_muon(model: torch.nn.Module, optimizers, lr: float = 0.02, momentum: float = 0.95,
                   nesterov: bool = True, ns_steps: int = 5, weight_decay: float = 0.0,
                   allow_empty: bool = False) -> tuple[MuonOptimizer | None, SurgeryReport]:
    """Move the model's hidden matrices out of ``optimizers`` (in place) into a new Muon optimizer.

    Returns ``(muon, report)``; ``muon`` is None when nothing qualified (and ``allow_empty`` is True).
    Parameters that no optimizer held are left alone.
    """
    report = SurgeryReport("muon")
    names = set(muon_parameter_names(model))
    wanted = {id(p): name for name, p in model.named_parameters() if name in names}
    moved: list[torch.Tensor] = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            keep = []
            for p in group["params"]:
                if id(p) in wanted:
                    moved.append(p)
                    optimizer.state.pop(p, None)
                    report.add("matrices to Muon", f"{wanted[id(p)]} {tuple(p.shape)}")
                else:
                    keep.append(p)
            group["params"] = keep
    report.require_changes(allow_empty, "hidden weight matrices held by the optimizer")
    if not moved:
        return None, report
    muon = MuonOptimizer(moved, lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                         weight_decay=weight_decay)
    return muon, report


class Muon(Method):
    CARD = MethodCard(
        name="muon",
        summary="Train the hidden weight matrices with Muon (orthogonalized momentum); the rest keeps its optimizer.",
        domain="any",
        events=(Event.FIT_START,),
        reads=("model", "optimizer"),
        writes=("optimizer",),
        hparams=(
            HParam("lr", float, 0.02, low=0.001, high=0.2, step=0.001, help="Muon's learning rate"),
            HParam("momentum", float, 0.95, low=0.0, high=0.99, step=0.01, help="momentum of the update"),
            HParam("nesterov", bool, True, help="Nesterov momentum"),
            HParam("ns_steps", int, 5, low=1, high=10, step=1, help="Newton-Schulz iterations"),
            HParam("weight_decay", float, 0.0, low=0.0, high=0.5, step=0.01, help="decoupled weight decay"),
            HParam("allow_empty", bool, False, help="do not fail when the model has no hidden matrices"),
        ),
        requirements=("a model with hidden Linear/conv weights held by the Trainer's optimizer(s)",
                      "a checkpoint of a Muon run resumes Muon's state only with muon on (a Lightning resume without "
                      "SpeedkitCallback goes on as a plain run, the matrices afresh in your optimizer)"),
        effect="about 1.5x sample efficiency over AdamW for GPT-2 (modded-nanogpt); "
               "used on conv filters in airbench's CIFAR-10 record",
        source="Keller Jordan 2024 'Muon: An optimizer for hidden layers'; modded-nanogpt; airbench",
    )

    def __init__(self, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 weight_decay: float = 0.0, allow_empty: bool = False):
        super().__init__(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                         weight_decay=weight_decay, allow_empty=allow_empty)

    def apply(self, event, state, logger):
        if any(isinstance(opt, MuonOptimizer) for opt in state.optimizers):
            return  # a second fit() on the same Trainer: the split is already done
        params = dict(self.params)
        allow_empty = params.pop("allow_empty")
        muon, report = split_for_muon(state.model, state.optimizers, allow_empty=allow_empty, **params)
        if muon is not None:
            state.optimizers.append(muon)
        record_surgery(logger, report)
