"""Rotary position embeddings (RoPE): rotate q and k by position so attention scores depend on relative offsets.

Each (x_i, x_{i+D/2}) pair of a head vector at position p is rotated by the angle p * base**(-2i/D), so
q_m . k_n depends only on m - n (Su et al. 2021, "RoFormer"). modded-nanogpt's GPT-2 speed-runs use it
instead of learned absolute positions. Applied to any attention module that calls
scaled_dot_product_attention (or any nn.MultiheadAttention) through :mod:`speedkit.methods._attention`.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods import _attention as attention
from speedkit.methods._surgery import record_surgery

ROTARY_ORDER = 10  # after normalisations (order 0), before additive biases (order 20)
_EXISTING_ROTARY_ATTRS = ("rotary", "rotary_emb", "rotary_embedding", "rope")


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[T, head_dim] rotation angles (float32): pair i of position p turns by p * base**(-2i/head_dim)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = torch.outer(positions.float(), inv_freq)
    return torch.cat([angles, angles], dim=-1)


def rotary_tables(length: int, head_dim: int, base: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, signed_sin)`` [length, head_dim] for positions 0..length-1: ``x * cos + rotate(x) * signed_sin``
    rotates ``x``, where ``rotate`` swaps its halves (``x.roll(head_dim // 2, -1)``) and the sign of the first
    half of ``signed_sin`` stands in for negating the second half of ``x``."""
    angles = rotary_angles(torch.arange(length, device=device), head_dim, base)
    sin = angles.sin()
    sin[..., : head_dim // 2].neg_()
    return angles.cos().to(dtype), sin.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` [..., T, D] by its ``positions`` [T]; the half-split pairing (x_i, x_{i+D/2})."""
    angles = rotary_angles(positions, x.shape[-1], base)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def rotate_queries_keys(q: torch.Tensor, k: torch.Tensor, base: float = 10000.0):
    """q [B, H, Tq, D], k [B, H, Tk, D] rotated; keys sit at 0..Tk-1, queries at the last Tq of those."""
    k_len = k.shape[-2]
    q_pos = attention.query_positions(q.shape[-2], k_len, q.device)
    return apply_rotary(q, q_pos, base), apply_rotary(k, torch.arange(k_len, device=k.device), base)


class RotaryTransform:
    """The attention transform: rotate q and k, leave v, the mask and causality as they are.

    One instance serves every attention layer of a model and keeps the cos/sin tables per sequence length, head
    size, device and dtype, so a step builds them once instead of in every layer at every call. Under
    torch.compile the tables are computed inside the graph instead, where the compiler folds them, and a Python
    cache would only add guards. Where q and k have one shape and dtype (self-attention without a cache of earlier
    keys) they are rotated as one stacked tensor: each op of the rotation runs once, forward and backward, instead
    of once for q and once for k.
    """

    MAX_TABLES = 16  # distinct lengths kept; sequence-length warmup and evaluation use a few

    def __init__(self, base: float = 10000.0):
        self.base = base
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, q, k, v, attn_mask, is_causal, scale):
        k_len, q_len = k.shape[-2], q.shape[-2]
        cos, sin = self.tables(k_len, k.shape[-1], k.device, k.dtype)
        if q.shape == k.shape and q.dtype == k.dtype:
            q, k = _rotate(torch.stack((q, k)), cos, sin).unbind(0)
            return q, k, v, attn_mask, is_causal, scale
        k = _rotate(k, cos, sin)
        if q_len != k_len:  # queries sit at the last q_len positions (a KV cache holds the earlier keys)
            cos, sin = self.tables(k_len, q.shape[-1], q.device, q.dtype)
            cos, sin = cos[k_len - q_len:], sin[k_len - q_len:]
        q = _rotate(q, cos, sin)
        return q, k, v, attn_mask, is_causal, scale

    def tables(self, length: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos and signed sin tables for positions 0..length-1 (see :func:`rotary_tables`)."""
        if torch.compiler.is_compiling():
            return rotary_tables(length, head_dim, self.base, device, dtype)
        # Tables made in inference mode cannot be saved for a later training step's backward: kept apart.
        key = (length, head_dim, device, dtype, torch.is_inference_mode_enabled())
        found = self._tables.get(key)
        if found is None:
            if len(self._tables) >= self.MAX_TABLES:
                self._tables.clear()
            with torch.no_grad():
                found = self._tables[key] = rotary_tables(length, head_dim, self.base, device, dtype)
        return found

    def __getstate__(self):  # a copied or pickled model rebuilds its tables where it runs
        return {"base": self.base}

    def __setstate__(self, state):
        self.__init__(state["base"])


def _has_own_rotary(module: nn.Module) -> bool:
    """A rotary attribute, or a forward that takes rotary ``position_embeddings`` (Hugging Face LLaMA-style)."""
    if any(getattr(module, name, None) is not None for name in _EXISTING_ROTARY_ATTRS):
        return True
    try:
        return "position_embeddings" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False


def apply_rotary_embeddings(model: nn.Module, base: float = 10000.0, remove_position_embeddings: bool = False,
                            allow_empty: bool = False) -> SurgeryReport:
    """Make every attention module of ``model`` rotate its q and k (positions 0..T-1).

    Modules that already rotate (a non-None ``rotary``/``rope`` attribute) are left alone. Learned
    absolute position tables stay (noted in the report) unless ``remove_position_embeddings``, which
    zeroes and freezes them.
    """
    report = SurgeryReport("rotary_embeddings")
    transform = RotaryTransform(base)  # one for the whole model: its tables serve every layer
    for name, module in attention.find_attention_modules(model):
        if _has_own_rotary(module):
            report.details.append(f"note: {name} already applies rotary positions; left alone")
        elif not attention.can_intercept(module):
            report.details.append(f"note: {name} ({type(module).__name__}) is not supported; left alone")
        else:
            switched = attention.intercept_attention(module, transform, name="rotary_embeddings",
                                                     order=ROTARY_ORDER)
            if switched:
                report.details.append(f"note: {switched}")
            report.add("attention modules", f"{name}: {type(module).__name__} rotates q, k (base {base:g})")
    attention.settle_position_embeddings(model, report, remove_position_embeddings)
    looked_for = "attention modules that call scaled_dot_product_attention"
    if any("already applies rotary" in d for d in report.details):
        looked_for += " without rotary positions of their own (the model's attention rotates already)"
    return report.require_changes(allow_empty, looked_for)


class RotaryEmbeddings(Method):
    CARD = MethodCard(
        name="rotary_embeddings",
        summary="Rotate q and k by token position inside every attention layer (RoPE).",
        domain="language",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("base", float, 10000.0, low=100.0, high=1_000_000.0, step=100.0,
                   help="RoPE's theta: the longest wavelength; larger suits longer contexts"),
            HParam("remove_position_embeddings", bool, False,
                   help="zero and freeze learned position tables (nn.Embedding named *pos* or wpe)"),
            HParam("allow_empty", bool, False, help="do not fail on a model without attention"),
        ),
        requirements=("attention modules that call F.scaled_dot_product_attention, or nn.MultiheadAttention",
                      "an even head dimension"),
        exclusive=("positions",),
        effect="modded-nanogpt's GPT-2 speed-run uses RoPE in place of learned positions; RoFormer reports "
               "faster convergence than absolute positions; no parameters, a few elementwise ops per layer",
        source="Su et al. 2021 (RoFormer); modded-nanogpt",
    )

    def apply(self, event, state, logger):
        report = apply_rotary_embeddings(state.model, self.params["base"],
                                         self.params["remove_position_embeddings"], self.params["allow_empty"])
        record_surgery(logger, report)
