"""ALiBi: attention with linear biases in place of position embeddings.

Each head h of H adds -m_h * |i - j| to the logit of query i on key j, with slopes m_h = 2**(-8h/H)
(h = 1..H), on top of the causal mask; learned position embeddings are removed (Press et al. 2022,
"Train Short, Test Long"). Because the bias extrapolates, one can train on shorter sequences than one
evaluates on: ``train_sequence_length_scaling`` < 1 truncates training batches (Composer's ALiBi).
Works on any attention module that calls scaled_dot_product_attention, and on nn.MultiheadAttention.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods import _attention as attention
from speedkit.methods._surgery import record_surgery
from speedkit.methods.seq_length_warmup import truncate_sequences

ALIBI_ORDER = 20  # additive biases come after normalisation and rotations


def alibi_slopes(num_heads: int, device=None) -> torch.Tensor:
    """[H] slopes 2**(-8h/H) for h = 1..H: a geometric sequence from 2**(-8/H) down to 2**-8."""
    heads = torch.arange(1, num_heads + 1, dtype=torch.float32, device=device)
    return torch.pow(2.0, -8.0 * heads / num_heads)


def alibi_bias(num_heads: int, q_len: int, k_len: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[H, Tq, Tk] bias -slope_h * |i - j| (queries are the last Tq positions of Tk)."""
    q_pos = attention.query_positions(q_len, k_len, device).float()
    distance = (q_pos[:, None] - torch.arange(k_len, device=device).float()[None, :]).abs()
    return (-alibi_slopes(num_heads, device)[:, None, None] * distance).to(dtype)


class ALiBiTransform:
    """Fold the ALiBi bias (and the causal mask, and any mask given) into one additive attn_mask.

    The mask is 4-D, [1, H, Tq, Tk]: SDPA sends a 3-D float mask to its unfused math kernel (every T x T
    score stored for the backward), and a 4-D one to the fused kernels that take a bias.
    """

    def __call__(self, q, k, v, attn_mask, is_causal, scale):
        heads, q_len, k_len = q.shape[1], q.shape[-2], k.shape[-2]
        mask = alibi_mask(heads, q_len, k_len, is_causal, q.device, q.dtype)
        given = attention.mask_as_additive(attn_mask, q.dtype)
        if given is not None:
            mask = mask + given
        return q, k, v, mask, False, scale


def alibi_mask(heads: int, q_len: int, k_len: int, causal: bool, device, dtype) -> torch.Tensor:
    """[1, H, Tq, Tk] ALiBi bias (plus the causal mask), built once per shape and shared by every layer and step."""
    key = (heads, q_len, k_len, causal, torch.device(device), dtype)
    if torch.compiler.is_compiling():  # traced: the graph builds it (and a cached tensor must not be a fake one)
        return _build_alibi_mask(*key)
    mask = _MASKS.get(key)
    if mask is None:
        with torch.inference_mode(False), torch.no_grad():  # usable by training when first built in evaluation
            mask = _build_alibi_mask(*key)
        _MASKS.clear()  # one shape at a time: a [1, H, T, T] mask at GPT-2's sizes is tens of MB
        _MASKS[key] = mask
    return mask


_MASKS: dict[tuple, torch.Tensor] = {}


def _build_alibi_mask(heads, q_len, k_len, causal, device, dtype) -> torch.Tensor:
    mask = alibi_bias(heads, q_len, k_len, device, dtype)
    if causal:
        mask = mask + attention.causal_additive_mask(q_len, k_len, device, dtype)
    return mask.unsqueeze(0)


def apply_alibi(model: nn.Module, remove_position_embeddings: bool = True, allow_empty: bool = False) -> SurgeryReport:
    """Add ALiBi biases to every attention module of ``model``; zero and freeze learned position tables."""
    report = SurgeryReport("alibi")
    for name, module in attention.find_attention_modules(model):
        if not attention.can_intercept(module):
            report.details.append(f"note: {name} ({type(module).__name__}) is not supported; left alone")
            continue
        switched = attention.intercept_attention(module, ALiBiTransform(), name="alibi", order=ALIBI_ORDER)
        if switched:
            report.details.append(f"note: {switched}")
        report.add("attention modules", f"{name}: {type(module).__name__} adds linear distance biases")
    attention.settle_position_embeddings(model, report, remove_position_embeddings)
    return report.require_changes(allow_empty, "attention modules that call scaled_dot_product_attention")


class ALiBi(Method):
    CARD = MethodCard(
        name="alibi",
        summary="Replace position embeddings by per-head linear distance biases on the attention logits.",
        domain="language",
        events=(Event.INIT, Event.AFTER_DATALOADER),
        reads=("model", "batch"),
        writes=("model", "batch"),
        hparams=(
            HParam("remove_position_embeddings", bool, True,
                   help="zero and freeze learned position tables (nn.Embedding named *pos* or wpe)"),
            HParam("train_sequence_length_scaling", float, 1.0, low=0.125, high=1.0, step=0.125,
                   help="train on this fraction of each sequence (ALiBi extrapolates to the full length)"),
            HParam("allow_empty", bool, False, help="do not fail on a model without attention"),
        ),
        requirements=("attention modules that call F.scaled_dot_product_attention, or nn.MultiheadAttention",
                      "language batches (idx [B, T], targets [B, T]) when train_sequence_length_scaling < 1"),
        exclusive=("positions",),
        effect="Composer: GPT-2 125M about 1.19x faster to equal perplexity; with sequence-length warmup 1.7x. "
               "A float bias replaces is_causal: SDPA runs a kernel that takes a bias, not its flash kernel",
        source="Press et al. 2022 (Train Short, Test Long); Composer ALiBi docs",
    )

    def match(self, event, state):
        if event is Event.AFTER_DATALOADER:
            return self.params["train_sequence_length_scaling"] < 1.0
        return super().match(event, state)

    def apply(self, event, state, logger):
        if event is Event.INIT:
            report = apply_alibi(state.model, self.params["remove_position_embeddings"], self.params["allow_empty"])
            record_surgery(logger, report)
            return
        inputs = state.batch_inputs()
        if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 and not inputs.is_floating_point():
            length = max(1, int(inputs.shape[1] * self.params["train_sequence_length_scaling"]))
            state.batch = truncate_sequences(state.batch, length)
