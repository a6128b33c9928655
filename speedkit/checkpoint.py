"""Checkpoint files: safe to load, checked before use, written atomically.

Layout of a file: a magic line, the SHA-256 of the payload, a newline, then the payload written
by ``torch.save`` holding plain containers and tensors only. Loading verifies the checksum and
uses ``torch.load(weights_only=True)``, so a file can never run code, and a truncated or edited
file is refused with a message that says so.
"""
from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path

import numpy as np
import torch

from speedkit.runs import atomic_write_bytes

MAGIC = b"SPEEDKIT-CHECKPOINT\n"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated, tampered with, or from another version."""


def save_checkpoint(path: str | os.PathLike, payload: dict) -> Path:
    buffer = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, **payload}, buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest().encode()
    atomic_write_bytes(path, MAGIC + digest + b"\n" + data)
    return Path(path)


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; check the path or drop load_path to start fresh")
    raw = path.read_bytes()
    if not raw.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a speedkit checkpoint (its header is missing); "
                              f"load plain state dicts with model.load_state_dict instead")
    header_end = len(MAGIC) + 64
    digest, data = raw[len(MAGIC):header_end], raw[header_end + 1:]
    if raw[header_end:header_end + 1] != b"\n" or hashlib.sha256(data).hexdigest().encode() != digest:
        raise CheckpointError(f"{path} is corrupt: its checksum does not match (truncated by a crash, or "
                              f"edited); use an earlier checkpoint from the same folder")
    try:
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # weights_only refuses anything that is not plain data
        raise CheckpointError(f"{path} holds objects that speedkit will not unpickle ({e}); "
                              f"only tensors and plain containers are loaded") from e
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version}, this speedkit reads {FORMAT_VERSION}; "
                              f"load it with the speedkit version that wrote it")
    return payload


# -- random number generators ------------------------------------------------------------------
def rng_state() -> dict:
    """Every RNG a run draws from, as plain data that weights_only loading accepts."""
    np_state = np.random.get_state()
    state = {
        "python": list(random.getstate()[1]) + [random.getstate()[0], random.getstate()[2]],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    *internal, version, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
