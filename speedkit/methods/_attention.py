"""Model-agnostic attention surgery: find attention modules by structure and rewrite their SDPA calls.

Attention methods (rotary embeddings, ALiBi, QK-norm) all change what reaches
``torch.nn.functional.scaled_dot_product_attention`` (SDPA): q and k, the mask, the scale. Instead of
knowing one library's attention class, speedkit finds modules whose code calls SDPA (or any
``nn.MultiheadAttention``) and runs their forward inside a :class:`torch.overrides.TorchFunctionMode`
that catches each SDPA call made *inside that module's forward* and passes its arguments through a
chain of transforms::

    transform(q, k, v, attn_mask, is_causal, scale) -> (q, k, v, attn_mask, is_causal, scale)

with q, k, v shaped [B, H, T, D]. The wrapper is an instance attribute (``module.forward``), so
parameters and state_dict keys are unchanged, and :func:`remove_interception` restores the module.

Notes:
  * ``nn.MultiheadAttention`` calls SDPA only with ``need_weights=False`` and only from inside
    ``F.multi_head_attention_forward``, a Python function with its own torch-function dispatch (a
    mode sees that call, not the SDPA inside it). An intercepted MHA therefore runs
    :func:`multihead_attention_through_sdpa`, the same computation with a direct SDPA call, and
    returns ``None`` attention weights (a one-time warning if a caller asked for them).
    ``add_bias_kv`` / ``add_zero_attn`` are not supported (:func:`can_intercept` says so).
  * PyTorch's fused "fast path" of TransformerEncoderLayer (eval mode, no grad) skips the attention
    module's forward entirely; a no-op forward pre-hook on the attention module disables it (the
    layer refuses its fast path when any submodule has hooks).
  * Transforms are objects (not closures), so ``copy.deepcopy`` of the model rewires them to the copy.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Callable, Iterator, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SDPA_NAME = "scaled_dot_product_attention"
# Hugging Face attention modules call SDPA through this registry (``ALL_ATTENTION_FUNCTIONS.get_interface``)
# when their config's ``_attn_implementation`` is "sdpa"; their own code never names SDPA.
HF_ATTENTION_REGISTRY = "ALL_ATTENTION_FUNCTIONS"
_TRANSFORMS_ATTR = "_speedkit_attention_transforms"
_HOOK_ATTR = "_speedkit_attention_hook"


class AttentionArgs(NamedTuple):
    """The SDPA arguments a transform may change; q, k, v are [B, H, T, D]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None


AttentionTransform = Callable[..., tuple]  # (q, k, v, attn_mask, is_causal, scale) -> same six


# -- finding attention modules ----------------------------------------------------------------------

def _code_names(code) -> Iterator[str]:
    """Every global/attribute name a code object (and the functions nested in it) refers to."""
    yield from code.co_names
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _code_names(const)


def _class_calls_sdpa(cls: type) -> bool:
    """Whether any method of ``cls`` (or its bases below nn.Module) mentions SDPA, or Hugging Face's attention
    registry: bytecode names first (works for classes defined anywhere; decorated methods are unwrapped), then
    the source text (catches e.g. ``getattr`` tricks)."""
    for klass in cls.__mro__:
        if klass in (nn.Module, object) or klass.__module__.startswith("torch.nn"):
            continue
        for value in vars(klass).values():
            func = getattr(value, "__func__", value)  # staticmethod / classmethod
            try:
                func = inspect.unwrap(func)  # transformers decorates forward (deprecate_kwarg, ...)
            except ValueError:
                pass
            code = getattr(func, "__code__", None)
            if code is not None and {SDPA_NAME, HF_ATTENTION_REGISTRY} & set(_code_names(code)):
                return True
        try:
            if SDPA_NAME in inspect.getsource(klass):
                return True
        except (OSError, TypeError):  # classes built in a REPL or by exec have no source
            pass
    return False


def is_attention_module(module: nn.Module) -> bool:
    """An ``nn.MultiheadAttention``, or a module whose class's code calls scaled_dot_product_attention."""
    return isinstance(module, nn.MultiheadAttention) or _class_calls_sdpa(type(module))


def find_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every innermost attention module: one that matches :func:`is_attention_module`
    and has no matching module below it (so a block that calls attention through a child is skipped)."""
    matching = [(name, m) for name, m in model.named_modules() if is_attention_module(m)]
    names = [name for name, _ in matching]

    def has_matching_descendant(name: str) -> bool:
        prefix = f"{name}." if name else ""
        return any(other != name and other.startswith(prefix) for other in names)

    return [(name, m) for name, m in matching if not has_matching_descendant(name)]


# -- the interception -------------------------------------------------------------------------------

def _bind_sdpa_args(args: tuple, kwargs: dict) -> dict:
    """SDPA's arguments by name, whether the caller passed them by position or keyword."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs or {})
    return bound


class _AttentionTransformMode(TorchFunctionMode):
    """Rewrites every SDPA call made while it is active with the module's transforms, in order."""

    def __init__(self, transforms):
        super().__init__()
        self.transforms = transforms

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        call = _bind_sdpa_args(args, kwargs)
        current = AttentionArgs(call.pop("query"), call.pop("key"), call.pop("value"),
                                call.pop("attn_mask", None), bool(call.pop("is_causal", False)),
                                call.pop("scale", None))
        for _, _, transform in self.transforms:
            current = AttentionArgs(*transform(*current))
        if current.attn_mask is not None and current.is_causal:
            raise ValueError("an attention transform returned both attn_mask and is_causal=True; SDPA "
                             "accepts only one: fold the causal mask into attn_mask")
        # Inside __torch_function__ the mode is off, so this calls the real kernel.
        return func(current.q, current.k, current.v, attn_mask=current.attn_mask,
                    is_causal=current.is_causal, scale=current.scale, **call)


class _InterceptedForward:
    """The instance-level ``forward`` of an intercepted module: the original forward inside the mode.

    A small object rather than a closure: deepcopy/pickle of the model copy it with the module.
    """

    def __init__(self, module: nn.Module, previous):
        self.module = module
        self.previous = previous  # an earlier instance-level forward, or None for the class's
        self._warned = False

    def __call__(self, *args, **kwargs):
        module = self.module
        with _AttentionTransformMode(getattr(module, _TRANSFORMS_ATTR)):
            if isinstance(module, nn.MultiheadAttention):
                return self._multihead_forward(*args, **kwargs)
            if self.previous is not None:
                return self.previous(*args, **kwargs)
            # the class's forward given the module, not bound to it with __get__: TorchDynamo (torch 2.11) cannot
            # trace a function's __get__ and breaks the graph there, twice in every attention layer
            return type(module).forward(module, *args, **kwargs)

    def _multihead_forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                           attn_mask=None, average_attn_weights=True, is_causal=False):
        if need_weights and not self._warned:
            warnings.warn("speedkit attention interception: nn.MultiheadAttention now runs through SDPA "
                          "(need_weights=False); it returns None for the attention weights", stacklevel=3)
            self._warned = True
        return multihead_attention_through_sdpa(self.module, query, key, value, key_padding_mask,
                                                attn_mask, is_causal), None


def _as_additive(mask: torch.Tensor | None, dtype, masked_value_is_true: bool) -> torch.Tensor | None:
    """A boolean mask (True = excluded when ``masked_value_is_true``) or a float mask, as a float bias."""
    if mask is None:
        return None
    if mask.is_floating_point():
        return mask.to(dtype)
    excluded = mask if masked_value_is_true else ~mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(excluded, float("-inf"))


def multihead_attention_through_sdpa(mha: nn.MultiheadAttention, query, key, value, key_padding_mask=None,
                                     attn_mask=None, is_causal=False) -> torch.Tensor:
    """``nn.MultiheadAttention``'s output computed with a direct F.scaled_dot_product_attention call.

    Why: MHA's own path goes through ``F.multi_head_attention_forward``, a Python function with its
    own torch-function dispatch, so a mode sees that call and never the SDPA inside it. This follows
    MHA's conventions: boolean masks mark *excluded* positions, ``attn_mask`` is [L, S] or [N*H, L, S],
    ``key_padding_mask`` is [N, S], inputs are sequence-first unless ``batch_first``.
    """
    if mha.bias_k is not None or mha.add_zero_attn:
        raise NotImplementedError("attention interception does not support nn.MultiheadAttention with "
                                  "add_bias_kv=True or add_zero_attn=True")
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = (t.unsqueeze(0) for t in (query, key, value))
        key_padding_mask = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
    elif not mha.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    batch, q_len, k_len, heads = query.shape[0], query.shape[1], key.shape[1], mha.num_heads
    if mha._qkv_same_embed_dim:
        weights = mha.in_proj_weight.chunk(3)
    else:
        weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
    biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None, None, None)
    q, k, v = (F.linear(x, w, b).view(batch, x.shape[1], heads, -1).transpose(1, 2)
               for x, w, b in zip((query, key, value), weights, biases))

    mask = _as_additive(attn_mask, q.dtype, masked_value_is_true=True)
    if mask is not None:
        mask = mask.view(batch, heads, q_len, k_len) if mask.dim() == 3 and mask.shape[0] > 1 else mask
    padding = _as_additive(key_padding_mask, q.dtype, masked_value_is_true=True)
    if padding is not None:
        padding = padding.view(batch, 1, 1, k_len)
        if is_causal and mask is None:
            mask = causal_additive_mask(q_len, k_len, q.device, q.dtype)
        mask = padding if mask is None else mask + padding
    # MHA treats is_causal as a hint that attn_mask is the causal mask; SDPA takes one or the other.
    is_causal = bool(is_causal) and mask is None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                         dropout_p=mha.dropout if mha.training else 0.0)
    out = F.linear(out.transpose(1, 2).reshape(batch, q_len, -1), mha.out_proj.weight, mha.out_proj.bias)
    if unbatched:
        return out.squeeze(0)
    return out if mha.batch_first else out.transpose(0, 1)


def _no_op_pre_hook(module, args):
    """Present only so TransformerEncoderLayer refuses its fused fast path (which bypasses SDPA)."""
    return None


def hf_attention_implementation(module: nn.Module) -> str | None:
    """A Hugging Face attention module's ``config._attn_implementation`` ("sdpa", "eager", ...), else None."""
    config = getattr(module, "config", None)
    value = getattr(config, "_attn_implementation", None)
    return value if isinstance(value, str) else None


def can_intercept(module: nn.Module) -> bool:
    """Whether :func:`intercept_attention` supports this module: all but MHA with extra k/v tokens, and Hugging
    Face attention whose implementation is a fused kernel that never calls SDPA (flash-attention, flex)."""
    if isinstance(module, nn.MultiheadAttention) and (module.bias_k is not None or module.add_zero_attn):
        return False
    return hf_attention_implementation(module) in (None, "sdpa", "eager")


def route_through_sdpa(module: nn.Module) -> str | None:
    """Make a Hugging Face attention module whose implementation is "eager" call SDPA (the same maths), so
    interception sees its attention; returns a note for the surgery report when it changed anything.

    The implementation lives on the model's config, which its modules share: the whole model switches."""
    if hf_attention_implementation(module) != "eager":
        return None
    module.config._attn_implementation = "sdpa"
    return f"{type(module).__name__}: config._attn_implementation 'eager' -> 'sdpa' (the same attention, through SDPA)"


def intercept_attention(module: nn.Module, transform: AttentionTransform, *, name: str | None = None,
                        order: int = 0) -> str | None:
    """Run ``transform`` on every SDPA call inside ``module``'s forward; returns a note for the surgery report
    when the module had to be switched to SDPA first (Hugging Face "eager" attention), else None.

    Several transforms may be installed on one module; they run by ``order`` (lower first: e.g.
    normalisation 0, positions 10, biases 20), then in installation order. Installing a transform
    under a ``name`` that is already present replaces it, so applying a method twice does not stack.
    """
    if not can_intercept(module):
        raise NotImplementedError(f"cannot intercept {type(module).__name__}: nn.MultiheadAttention with "
                                  f"add_bias_kv/add_zero_attn, or a Hugging Face attention implementation "
                                  f"({hf_attention_implementation(module)!r}) that never calls SDPA")
    switched = route_through_sdpa(module)
    transforms = getattr(module, _TRANSFORMS_ATTR, None)
    if transforms is None:
        transforms = []
        object.__setattr__(module, _TRANSFORMS_ATTR, transforms)
        module.forward = _InterceptedForward(module, module.__dict__.get("forward"))
        object.__setattr__(module, _HOOK_ATTR, module.register_forward_pre_hook(_no_op_pre_hook))
    name = name or type(transform).__name__
    transforms[:] = [t for t in transforms if t[1] != name]
    transforms.append((order, name, transform))
    transforms.sort(key=lambda t: t[0])  # stable: equal orders keep installation order
    return switched


def intercepted_transforms(module: nn.Module) -> list[str]:
    """Names of the transforms installed on ``module``, in the order they run."""
    return [name for _, name, _ in getattr(module, _TRANSFORMS_ATTR, [])]


def remove_interception(module: nn.Module, name: str | None = None) -> bool:
    """Remove the transform called ``name`` (or all of them); the original forward returns when none
    is left. Returns whether anything was removed. Submodules a method added (e.g. QK-norm gains) stay."""
    transforms = getattr(module, _TRANSFORMS_ATTR, None)
    if transforms is None:
        return False
    before = len(transforms)
    transforms[:] = [] if name is None else [t for t in transforms if t[1] != name]
    removed = len(transforms) < before
    if not transforms:
        wrapper = module.__dict__.get("forward")
        if isinstance(wrapper, _InterceptedForward):
            if wrapper.previous is None:
                del module.forward
            else:
                module.forward = wrapper.previous
        getattr(module, _HOOK_ATTR).remove()
        object.__delattr__(module, _HOOK_ATTR)
        object.__delattr__(module, _TRANSFORMS_ATTR)
    return removed


# -- helpers shared by attention methods ------------------------------------------------------------

def query_positions(q_len: int, k_len: int, device) -> torch.Tensor:
    """Absolute positions of the queries: the last ``q_len`` of ``k_len`` (a KV cache puts keys first)."""
    return torch.arange(k_len - q_len, k_len, device=device)


def mask_as_additive(attn_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """An SDPA mask as a float bias: SDPA's boolean masks (True = attend) become 0 / -inf."""
    return _as_additive(attn_mask, dtype, masked_value_is_true=False)


def causal_additive_mask(q_len: int, k_len: int, device, dtype) -> torch.Tensor:
    """[q_len, k_len] with -inf where the key lies after the query (SDPA's is_causal, KV-cache aware)."""
    key_pos = torch.arange(k_len, device=device)
    future = key_pos[None, :] > query_positions(q_len, k_len, device)[:, None]
    return torch.zeros(q_len, k_len, device=device, dtype=dtype).masked_fill(future, float("-inf"))


_HEAD_COUNT_ATTRS = ("num_heads", "n_head", "n_heads", "nhead", "heads", "num_attention_heads")
_HEAD_DIM_ATTRS = ("head_dim", "d_head", "head_size", "dim_head")
_WIDTH_ATTRS = ("embed_dim", "n_embd", "d_model", "hidden_size", "dim")


def attention_geometry(module: nn.Module) -> tuple[int | None, int | None]:
    """(number of heads, head dimension) read from the usual attribute names (the width may also come
    from the first Linear child's input size), None where unknown. A wrong guess fails loudly at the
    first forward, where the transform checks q's shape."""
    def first_int(names):
        for n in names:
            value = getattr(module, n, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    heads, head_dim = first_int(_HEAD_COUNT_ATTRS), first_int(_HEAD_DIM_ATTRS)
    config = getattr(module, "config", None)  # Hugging Face attention (LLaMA) keeps its head count there
    if heads is None and isinstance(getattr(config, "num_attention_heads", None), int):
        heads = config.num_attention_heads
    width = first_int(_WIDTH_ATTRS)
    if width is None:  # fall back on the input width of the first projection (q or a fused qkv)
        width = next((m.in_features for m in module.children() if isinstance(m, nn.Linear)), None)
    if head_dim is None and heads and width and width % heads == 0:
        head_dim = width // heads
    return heads, head_dim


def find_position_embeddings(model: nn.Module) -> list[tuple[str, nn.Embedding]]:
    """Learned absolute position tables: any nn.Embedding whose own name contains "pos" or is "wpe"."""
    found = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        if isinstance(module, nn.Embedding) and ("pos" in leaf or leaf == "wpe"):
            found.append((name, module))
    return found


def settle_position_embeddings(model: nn.Module, report, remove: bool) -> None:
    """After a position method rewrote attention: zero and freeze learned position tables, or note that
    they stay (nothing to do when no attention module was changed)."""
    if not report.total:
        return
    if remove:
        disable_position_embeddings(model, report)
    else:
        note_position_embeddings_kept(model, report)


def disable_position_embeddings(model: nn.Module, report) -> None:
    """Zero and freeze learned position tables (a zero table adds nothing); record each in ``report``."""
    for name, table in find_position_embeddings(model):
        with torch.no_grad():
            table.weight.zero_()
        table.weight.requires_grad_(False)
        report.add("position embeddings zeroed and frozen", f"{name}: {tuple(table.weight.shape)} zeroed, frozen")


def note_position_embeddings_kept(model: nn.Module, report) -> None:
    """Say (in the report's details, not its change counts) which learned position tables remain."""
    for name, _ in find_position_embeddings(model):
        report.details.append(f"note: learned position embedding {name} kept "
                              f"(pass remove_position_embeddings=True to zero and freeze it)")
