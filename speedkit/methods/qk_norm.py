"""QK-norm: RMS-normalise queries and keys per head before their dot product.

Bounded q and k keep attention logits from growing without limit, the instability that caps the
learning rate of large transformers (Dehghani et al. 2023, ViT-22B); modded-nanogpt's GPT-2
speed-runs normalise q and k the same way. Each head gets a learnable gain (initialised to 1) for q
and one for k, so the model can still sharpen attention. The gains are added to every attention
module at INIT, so they are in the state_dict and in optimizers built afterwards.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods import _attention as attention
from speedkit.methods._surgery import record_surgery
from speedkit.optim.muon import mark_not_a_matrix

QK_NORM_ORDER = 0  # normalise first: rotations and biases act on the normalised q, k
GAIN_ATTR = "qk_norm"


def rms_normalize_heads(x: torch.Tensor, gain: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x [B, H, T, D] divided by its RMS over D, times ``gain`` [H, D] if given."""
    x = F.rms_norm(x, (x.shape[-1],), eps=eps)
    return x if gain is None else x * gain.to(x.dtype).unsqueeze(1)  # [H, 1, D] broadcasts over batch and positions


def rms_normalize_queries_and_keys(q: torch.Tensor, k: torch.Tensor, q_gain: torch.Tensor, k_gain: torch.Tensor,
                                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_normalize_heads` of q with ``q_gain`` and of k with ``k_gain``. Where q and k have the same shape
    (no grouped keys, no cache of earlier keys) they are normalised as one tensor, their heads side by side, so a
    step runs each op of the norm and the gain once, forward and backward, instead of once for q and once for k."""
    if q.shape != k.shape:
        return rms_normalize_heads(q, q_gain, eps), rms_normalize_heads(k, k_gain, eps)
    heads = q.shape[1]
    both = rms_normalize_heads(torch.cat((q, k), dim=1), torch.cat((q_gain, k_gain)), eps)
    q, k = both.split(heads, dim=1)
    return q, k


class QKNormModule(nn.Module):
    """Per-head gains for q and k ([H, D] each, initialised to 1) and the attention transform that
    normalises q and k with them. Lives as a submodule of the attention module it serves."""

    def __init__(self, num_heads: int, head_dim: int, eps: float = 1e-6, device=None):
        super().__init__()
        self.num_heads, self.head_dim, self.eps = num_heads, head_dim, eps
        # Gains, not matrices, though [H, D]: Muon must leave them with the user's optimizer.
        self.q_gain = mark_not_a_matrix(nn.Parameter(torch.ones(num_heads, head_dim, device=device)))
        self.k_gain = mark_not_a_matrix(nn.Parameter(torch.ones(num_heads, head_dim, device=device)))

    def forward(self, q, k, v, attn_mask, is_causal, scale):
        if q.shape[1] != self.num_heads or q.shape[-1] != self.head_dim or k.shape[1] != self.num_heads:
            raise ValueError(f"qk_norm was set up for {self.num_heads} heads of size {self.head_dim}, but "
                             f"attention got q {tuple(q.shape)}, k {tuple(k.shape)}")
        q, k = rms_normalize_queries_and_keys(q, k, self.q_gain, self.k_gain, self.eps)
        return q, k, v, attn_mask, is_causal, scale

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, eps={self.eps}"


def apply_qk_norm(model: nn.Module, eps: float = 1e-6, allow_empty: bool = False) -> SurgeryReport:
    """Add a :class:`QKNormModule` (as ``<attention>.qk_norm``) to every attention module of ``model``.

    The number of heads and head size are read from the module (``num_heads``/``n_head``/...,
    ``head_dim`` or ``embed_dim``/``n_embd`` divided by heads); modules where they cannot be found are
    left alone and named in the report.
    """
    report = SurgeryReport("qk_norm")
    for name, module in attention.find_attention_modules(model):
        if isinstance(getattr(module, GAIN_ATTR, None), QKNormModule):
            report.details.append(f"note: {name} already has qk_norm")
            continue
        heads, head_dim = attention.attention_geometry(module)
        if heads is None or head_dim is None or not attention.can_intercept(module):
            report.details.append(f"note: {name} ({type(module).__name__}): head count/size unknown or "
                                  f"unsupported; left alone")
            continue
        if hasattr(module, GAIN_ATTR):
            report.details.append(f"note: {name} already has an attribute {GAIN_ATTR!r}; left alone")
            continue
        reference = next(module.parameters(), None)
        norm = QKNormModule(heads, head_dim, eps, device=reference.device if reference is not None else None)
        module.add_module(GAIN_ATTR, norm)
        switched = attention.intercept_attention(module, norm, name="qk_norm", order=QK_NORM_ORDER)
        if switched:
            report.details.append(f"note: {switched}")
        report.add("attention modules", f"{name}: {type(module).__name__} RMS-normalises q, k "
                                        f"({heads} heads x {head_dim}, learnable gains)")
    return report.require_changes(allow_empty, "attention modules that call scaled_dot_product_attention")


class QKNorm(Method):
    CARD = MethodCard(
        name="qk_norm",
        summary="RMS-normalise queries and keys per head (learnable gains) before attention.",
        domain="language",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("eps", float, 1e-6, low=1e-8, high=1e-3, log=True,
                   help="added to the mean square before the root"),
            HParam("allow_empty", bool, False, help="do not fail on a model without attention"),
        ),
        requirements=("attention modules that call F.scaled_dot_product_attention, or nn.MultiheadAttention",
                      "head count and size readable from the module (num_heads/n_head, head_dim/embed_dim)"),
        effect="stabler training at higher learning rates (Dehghani et al. 2023 needed it to train ViT-22B); "
               "part of modded-nanogpt's GPT-2 speed-run record; 2 * H * D parameters per layer",
        source="Dehghani et al. 2023 (Scaling ViT to 22B); Henry et al. 2020 (Query-Key Normalization); "
               "modded-nanogpt",
    )

    def apply(self, event, state, logger):
        report = apply_qk_norm(state.model, self.params["eps"], self.params["allow_empty"])
        record_surgery(logger, report)
