"""Speed-up methods, one module each. ``REGISTRY`` maps each stable snake_case name to its Method class.

Every module in this package whose name does not start with ``_`` is a method module; its Method class
is imported here by name (editors and type checkers see every export) and listed in ``METHODS``.
"""
from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping

from speedkit.core.method import Method, MethodCard, check_free_name, show
from speedkit.methods.alibi import ALiBi
from speedkit.methods.alternating_flip import AlternatingFlip
from speedkit.methods.augmix import AugMix
from speedkit.methods.autocast import Autocast
from speedkit.methods.batch_size_warmup import BatchSizeWarmup
from speedkit.methods.blurpool import BlurPool
from speedkit.methods.budget_schedule import BudgetSchedule
from speedkit.methods.channels_last import ChannelsLast
from speedkit.methods.colout import ColOut
from speedkit.methods.cutmix import CutMix
from speedkit.methods.cutout import CutOut
from speedkit.methods.data_echoing import DataEchoing
from speedkit.methods.ema import EMA
from speedkit.methods.factorize import Factorize
from speedkit.methods.fp8 import FP8
from speedkit.methods.gated_linear_units import GatedLinearUnits
from speedkit.methods.ghost_batchnorm import GhostBatchNorm
from speedkit.methods.gradient_clipping import GradientClipping
from speedkit.methods.gyro_dropout import GyroDropout
from speedkit.methods.identity_init import IdentityInit
from speedkit.methods.label_smoothing import LabelSmoothing
from speedkit.methods.layer_freezing import LayerFreezing
from speedkit.methods.lookahead import Lookahead
from speedkit.methods.low_precision_groupnorm import LowPrecisionGroupNorm
from speedkit.methods.low_precision_layernorm import LowPrecisionLayerNorm
from speedkit.methods.mixup import MixUp
from speedkit.methods.muon import Muon
from speedkit.methods.patch_whitening import PatchWhitening
from speedkit.methods.progressive_resizing import ProgressiveResizing
from speedkit.methods.qk_norm import QKNorm
from speedkit.methods.randaugment import RandAugment
from speedkit.methods.relu_squared import ReLUSquared
from speedkit.methods.rotary_embeddings import RotaryEmbeddings
from speedkit.methods.sam import SAM
from speedkit.methods.selective_backprop import SelectiveBackprop
from speedkit.methods.seq_length_warmup import SeqLengthWarmup
from speedkit.methods.squeeze_excite import SqueezeExcite
from speedkit.methods.stochastic_depth import StochasticDepth
from speedkit.methods.swa import SWA
from speedkit.methods.test_time_augmentation import TestTimeAugmentation
from speedkit.methods.torch_compile import TorchCompile
from speedkit.methods.weight_standardization import WeightStandardization

# Every method, by class; a new method module adds its class here (tests/test_method_catalogue.py checks
# that every module of this package is listed).
METHODS: tuple[type[Method], ...] = (
    ALiBi, AlternatingFlip, AugMix, Autocast, BatchSizeWarmup, BlurPool, BudgetSchedule, ChannelsLast, ColOut,
    CutMix, CutOut, DataEchoing, EMA, Factorize, FP8, GatedLinearUnits, GhostBatchNorm, GradientClipping,
    GyroDropout, IdentityInit, LabelSmoothing, LayerFreezing, Lookahead, LowPrecisionGroupNorm,
    LowPrecisionLayerNorm, MixUp, Muon, PatchWhitening, ProgressiveResizing, QKNorm, RandAugment,
    ReLUSquared, RotaryEmbeddings, SAM, SelectiveBackprop, SeqLengthWarmup, SqueezeExcite,
    StochasticDepth, SWA, TestTimeAugmentation, TorchCompile, WeightStandardization,
)


# Old class names, kept for one release: each method's class name now spells its registry name (the same letters,
# ignoring case and underscores: ``low_precision_layernorm`` is LowPrecisionLayerNorm).
_RENAMED = {"LowPrecisionGroupNormMethod": "LowPrecisionGroupNorm",
            "LowPrecisionLayerNormMethod": "LowPrecisionLayerNorm",
            "QKNormalization": "QKNorm", "ReLUSquaredActivation": "ReLUSquared"}


def __getattr__(name: str):
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"speedkit.methods.{name} is renamed {new} (the method {globals()[new].CARD.name!r}); the old "
                      f"name goes in the next release: import {new} instead", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'speedkit.methods' has no attribute {name!r}")


def _registry(methods) -> dict[str, type[Method]]:
    registry: dict[str, type[Method]] = {}
    for cls in methods:
        if cls.CARD.name in registry:
            raise RuntimeError(f"two methods are named {cls.CARD.name!r}: {registry[cls.CARD.name]} and {cls}")
        registry[cls.CARD.name] = cls
    return dict(sorted(registry.items()))


REGISTRY: dict[str, type[Method]] = _registry(METHODS)
BUILT_IN_METHODS = frozenset(REGISTRY)  # names a user's method may not take over


def register_method(cls: type[Method], *, replace: bool = False) -> type[Method]:
    """Make a method of your own (an Method subclass with a ``CARD``, in your file or notebook) known by
    its card's name everywhere a method name is accepted: recipes and recipe files, ``make_trainer(methods=...)``,
    the explorer's grid, ``speedkit tune`` and the compatibility check. Returns the class, so it can decorate it.

    A different class under a taken name is refused unless ``replace=True``; built-in names are never replaced.
    """
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"register_method takes an Method subclass (class MyMethod(speedkit.Method)), got {show(cls)}")
    card = cls.__dict__.get("CARD")
    if not isinstance(card, MethodCard):
        raise TypeError(f"{cls.__name__} has no CARD of its own; give it CARD = MethodCard(name=..., ...) so the "
                        f"Trainer can order and check it")
    if not card.name.isidentifier() or card.name != card.name.lower():
        raise ValueError(f"method name {card.name!r} must be snake_case (lower-case letters, digits and _), "
                         f"such as 'trim_border'")
    check_free_name("method", card.name, REGISTRY.get(card.name), cls, BUILT_IN_METHODS, replace,
                    rename="your method's card")
    REGISTRY[card.name] = cls
    return cls


def unregister_method(name: str) -> None:
    """Forget a method ``register_method`` added (built-in methods stay)."""
    if name in BUILT_IN_METHODS:
        raise ValueError(f"{name!r} is a built-in method and cannot be unregistered")
    REGISTRY.pop(name, None)


def get_method(name: str, **params) -> Method:
    """Build a method by registry name; unknown names get a message listing the known ones, and
    parameters are checked against the method's card (names, types, ranges) before it is built."""
    if not isinstance(name, str):
        raise TypeError(f"a method name must be a string such as 'ema', got {type(name).__name__} {show(name)}; "
                        f"known methods: {', '.join(REGISTRY)}")
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown method {name!r}.{hint} Known methods: {', '.join(REGISTRY)}")
    cls = REGISTRY[name]
    cls.CARD.validate_params(params)  # a TypeError/ValueError naming method.parameter, whatever __init__ looks like
    return cls(**params)


def build_methods(spec) -> list[Method]:
    """Methods from ``"a,b"``, ``["a", "b"]`` or ``{"a": {params}, "b": {}}``."""
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    if isinstance(spec, Mapping):
        for name, params in spec.items():
            if params is not None and not isinstance(params, Mapping):
                raise TypeError(f"the parameters of method {name!r} must be a dict such as {{'alpha': 0.2}} (or "
                                f"empty), got {type(params).__name__} {show(params)}")
        return [get_method(name, **(params or {})) for name, params in spec.items()]
    if not isinstance(spec, (list, tuple)):
        raise TypeError(f"methods must be 'a,b', a list of names or Method objects, or a dict "
                        f"{{name: parameters}}, got {type(spec).__name__} {show(spec)}")
    return [s if isinstance(s, Method) else get_method(s) for s in spec]


def methods_table() -> str:
    """The methods table, drawn from the cards (``make readme`` writes it into docs/guide.md)."""
    rows = ["| method | domain | acts on | what it does | expected effect (source) |", "|---|---|---|---|---|"]
    for name, cls in REGISTRY.items():
        card = cls.CARD
        events = ", ".join(e.value for e in card.events)
        effect = f"{card.effect} ({card.source})".replace("|", "/")
        rows.append(f"| `{name}` | {card.domain} | {events} | {card.summary.replace('|', '/')} | {effect} |")
    return "\n".join(rows)


__all__ = ["BUILT_IN_METHODS", "METHODS", "REGISTRY", "build_methods", "get_method", "methods_table",
           "register_method", "unregister_method",
           "ALiBi", "AlternatingFlip", "AugMix", "Autocast", "BatchSizeWarmup", "BlurPool", "BudgetSchedule",
           "ChannelsLast", "ColOut", "CutMix", "CutOut", "DataEchoing", "EMA", "Factorize", "FP8", "GatedLinearUnits",
           "GhostBatchNorm", "GradientClipping", "GyroDropout", "IdentityInit", "LabelSmoothing",
           "LayerFreezing", "Lookahead", "LowPrecisionGroupNorm", "LowPrecisionLayerNorm", "MixUp",
           "Muon", "PatchWhitening", "ProgressiveResizing", "QKNorm", "RandAugment",
           "ReLUSquared", "RotaryEmbeddings", "SAM", "SelectiveBackprop", "SeqLengthWarmup",
           "SqueezeExcite", "StochasticDepth", "SWA", "TestTimeAugmentation", "TorchCompile",
           "WeightStandardization"]
