"""Small models, data and methods shared by the tests."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from speedkit.core import Event, Method, MethodCard


def toy_classification(n: int = 256, features: int = 8, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w).argmax(dim=1)
    return x, y


def toy_loaders(batch_size: int = 32, n: int = 256, shuffle: bool = True):
    x, y = toy_classification(n)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)
    test = DataLoader(TensorDataset(x, y), batch_size=128)
    return train, test


def toy_model(dropout: float = 0.0, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(32, 3))


def make_card(name: str, events=tuple(Event), writes=(), domain="any", **kwargs) -> MethodCard:
    return MethodCard(name=name, summary=f"test method {name}", domain=domain, events=tuple(events),
                      writes=tuple(writes), **kwargs)


class Recorder(Method):
    """Acts on every event and remembers (event, microbatch index) in order."""

    CARD = make_card("recorder")

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[Event, int]] = []

    def apply(self, event, state, logger):
        self.seen.append((event, state.microbatch_index))


def method_class(name: str, writes=(), events=(Event.BATCH_START, Event.AFTER_FORWARD), log=None, **card_kwargs):
    """An Method class with its own card that appends its name to ``log`` when it runs."""

    class _Method(Method):
        CARD = make_card(name, events=events, writes=writes, **card_kwargs)

        def apply(self, event, state, logger):
            if log is not None:
                log.append((event, name))

    _Method.__name__ = f"Method_{name}"
    return _Method


# Real-data tests skip where the data is missing, with the install command as the reason; under CI=true they
# fail instead (tests/support/prerequisites.py), so a green CI means they ran.
needs_fmnist = pytest.mark.prerequisite("fashion-mnist")
needs_python_docs = pytest.mark.prerequisite("python-docs")


def load_script(name: str):
    """A script under ``scripts/`` imported as a module (scripts are not a package), e.g. ``gpu_check``."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def leave_torchrun() -> None:
    """End a torchrun worker whose results are written: every rank here, then out without Python's finalization.

    torch's gloo threads drop a finished collective's tensors a moment after its caller has moved on, and a
    barrier's work holds the collectives that were pending before it. A tensor Python owns, dropped while the
    interpreter finalizes, asks for the GIL there, and the thread is ended inside a destructor: SIGABRT,
    "terminate called without an active exception" (gdb on distributed_worker.py: a barrier's work releasing an
    all_gather's tensors during Py_FinalizeEx). destroy_process_group does not stop those threads while a DDP model
    built in the process holds the group, so only not finalizing is certain.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
