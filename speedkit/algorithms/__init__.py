"""Speed-up methods, one module each. ``REGISTRY`` maps each stable snake_case name to its Algorithm class.

Every module in this package whose name does not start with ``_`` is a method module; its Algorithm
subclasses (those with a ``CARD``) are registered under their card's name.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Mapping

from speedkit.core.algorithm import Algorithm, _show


def _discover() -> dict[str, type[Algorithm]]:
    registry: dict[str, type[Algorithm]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Algorithm) and cls.__module__ == module.__name__ and "CARD" in cls.__dict__:
                if cls.CARD.name in registry:
                    raise RuntimeError(f"two methods are named {cls.CARD.name!r}: {registry[cls.CARD.name]} and {cls}")
                registry[cls.CARD.name] = cls
    return dict(sorted(registry.items()))


REGISTRY: dict[str, type[Algorithm]] = _discover()


def get_algorithm(name: str, **params) -> Algorithm:
    """Build a method by registry name; unknown names get a message listing the known ones, and
    parameters are checked against the method's card (names, types, ranges) before it is built."""
    if not isinstance(name, str):
        raise TypeError(f"a method name must be a string such as 'ema', got {type(name).__name__} {_show(name)}; "
                        f"known methods: {', '.join(REGISTRY)}")
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown method {name!r}.{hint} Known methods: {', '.join(REGISTRY)}")
    cls = REGISTRY[name]
    cls.CARD.validate_params(params)  # a TypeError/ValueError naming method.parameter, whatever __init__ looks like
    return cls(**params)


def build_algorithms(spec) -> list[Algorithm]:
    """Methods from ``"a,b"``, ``["a", "b"]`` or ``{"a": {params}, "b": {}}``."""
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    if isinstance(spec, Mapping):
        for name, params in spec.items():
            if params is not None and not isinstance(params, Mapping):
                raise TypeError(f"the parameters of method {name!r} must be a dict such as {{'alpha': 0.2}} (or "
                                f"empty), got {type(params).__name__} {_show(params)}")
        return [get_algorithm(name, **(params or {})) for name, params in spec.items()]
    if not isinstance(spec, (list, tuple)):
        raise TypeError(f"methods must be 'a,b', a list of names or Algorithm objects, or a dict "
                        f"{{name: parameters}}, got {type(spec).__name__} {_show(spec)}")
    return [s if isinstance(s, Algorithm) else get_algorithm(s) for s in spec]




def methods_table() -> str:
    """The README's methods table, drawn from the cards (``make readme`` writes it into README.md)."""
    rows = ["| method | domain | acts on | what it does | expected effect (source) |", "|---|---|---|---|---|"]
    for name, cls in REGISTRY.items():
        card = cls.CARD
        events = ", ".join(e.value for e in card.events)
        effect = f"{card.effect} ({card.source})".replace("|", "/")
        rows.append(f"| `{name}` | {card.domain} | {events} | {card.summary.replace('|', '/')} | {effect} |")
    return "\n".join(rows)


globals().update({cls.__name__: cls for cls in REGISTRY.values()})
__all__ = ["REGISTRY", "build_algorithms", "get_algorithm", "methods_table",
           *(cls.__name__ for cls in REGISTRY.values())]
