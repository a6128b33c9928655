"""Speed-up methods. ``REGISTRY`` maps each stable snake_case name to its Algorithm class."""
from __future__ import annotations

from speedkit.algorithms.channels_last import ChannelsLast
from speedkit.algorithms.label_smoothing import LabelSmoothing
from speedkit.core.algorithm import Algorithm

REGISTRY: dict[str, type[Algorithm]] = {cls.CARD.name: cls for cls in (ChannelsLast, LabelSmoothing)}


def get_algorithm(name: str, **params) -> Algorithm:
    """Build a method by registry name; unknown names get a message listing the known ones."""
    if name not in REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown method {name!r}.{hint} Known methods: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](**params)


def build_algorithms(spec) -> list[Algorithm]:
    """Methods from ``"a,b"``, ``["a", "b"]`` or ``{"a": {params}, "b": {}}``."""
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    if isinstance(spec, dict):
        return [get_algorithm(name, **(params or {})) for name, params in spec.items()]
    return [s if isinstance(s, Algorithm) else get_algorithm(s) for s in spec]


__all__ = ["REGISTRY", "ChannelsLast", "LabelSmoothing", "build_algorithms", "get_algorithm"]
