"""Device and precision choices: ``auto`` picks what the machine runs well."""
from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # the one list: Trainer, recipes, explorer
DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str) or device.split(":")[0] not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} (optionally 'cuda:N'), got {device!r}")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but CUDA is not available here; use device='auto' or 'cpu'")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device='mps' was asked for but MPS is not available here; use device='auto' or 'cpu'")
    return torch.device(device)


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX: bf16 matmuls and convs are then faster than fp32 on this CPU."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            raise ValueError("precision='fp16' is for GPUs; on a CPU use 'bf16' (or 'auto')")
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    return "fp16" if device.type == "mps" else "fp32"


def autocast_factory(precision: str, device: torch.device):
    """A zero-argument function returning the autocast context for forward passes."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=device.type, dtype=dtype)


def make_grad_scaler(precision: str, device: torch.device):
    """fp16 needs loss scaling to keep small gradients from flushing to zero; bf16 does not."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so a wall-clock reading means what it says."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(fn, device) -> float:
    """Seconds ``fn()`` took on ``device``, its queued device work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start
