"""speedkit: faster PyTorch training by composing proven speed-up methods.

The names below are imported on first use, so ``import speedkit`` (and ``speedkit --version``) does not pay for
torch and the catalogue until a name is asked for.
"""
from __future__ import annotations

import importlib

from speedkit.version import __version__

_PUBLIC = {  # name -> the module it lives in
    "Callback": "speedkit.core", "Event": "speedkit.core", "Method": "speedkit.core", "MethodCard": "speedkit.core",
    "State": "speedkit.core", "Time": "speedkit.core", "Timestamp": "speedkit.core",
    "Evaluator": "speedkit.record.metrics", "RunRecord": "speedkit.record.runs",
    "DataRequest": "speedkit.tasks.task", "Task": "speedkit.tasks.task", "Trainer": "speedkit.train.trainer",
}
__all__ = [*sorted(_PUBLIC), "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'speedkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
