"""Device and precision choices: ``auto`` picks what the machine runs well."""
from __future__ import annotations

import contextlib
import functools
import os
import time

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # the one list: Trainer, recipes, explorer
DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The device a run trains on (``auto``: CUDA, else MPS, else the CPU). It changes no setting of torch's: the
    Trainer turns cuDNN's autotuner on for its own fit (``speedkit.train.parts.kernel_choice``)."""
    return device if isinstance(device, torch.device) else _named_device(device)


def _named_device(device: str) -> torch.device:
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


# bf16 must beat fp32 by this much on the probe before "auto" picks it: a tie is not worth bf16's rounding.
BF16_MIN_SPEEDUP = 1.15


@functools.cache
def cpu_bf16_speedup(threads: int | None = None) -> float:
    """fp32 seconds / bf16-autocast seconds of a small training step, measured on this CPU now.

    CPU flags say what a processor can run, not how fast torch runs it there: bf16 is emulated (and
    several times slower) without AVX-512 BF16 or AMX, and even with them a kernel may not use them. So
    "auto" times the same convolution and matmul, forward and backward, in both precisions (about a
    third of a second, once per process and thread count; ``threads`` keys the cache) and keeps the
    better of three interleaved tries of each, which a busy core slows less than it slows one try.
    """
    del threads  # only a cache key: the measurement runs at torch's current thread count
    generator = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    linear = torch.nn.Linear(256, 1024)
    images = torch.randn(32, 64, 16, 16, generator=generator).contiguous(memory_format=torch.channels_last)
    conv = conv.to(memory_format=torch.channels_last)
    tokens = torch.randn(1024, 256, generator=generator)

    def step(dtype):  # grad on: the first caller may be inside no_grad (an optimizer's step)
        with torch.enable_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = conv(images).float().square().mean() + linear(tokens).float().square().mean()
        loss.backward()

    best = {None: float("inf"), torch.bfloat16: float("inf")}
    for dtype in best:  # the first call of each pays for kernel selection; not timed
        step(dtype)
    for _ in range(3):
        for dtype in best:
            start = time.perf_counter()
            step(dtype)
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[None] / best[torch.bfloat16]


def cpu_has_fast_bf16() -> bool:
    """Measured, not read from the flags: bf16 autocast trains faster than fp32 here (see ``cpu_bf16_speedup``)."""
    return cpu_bf16_speedup(torch.get_num_threads()) >= BF16_MIN_SPEEDUP


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


MAX_LOADER_WORKERS = 16


def loader_workers(num_workers: int | None, device: torch.device) -> int:
    """Data-loading worker processes for a run: ``num_workers`` where given; else none on a CPU, whose cores
    run the step itself, and on a GPU its share of the usable cores (one process per GPU under torchrun) less
    one for the training loop, up to 16: decoding images on one core cannot feed a GPU, which then waits."""
    if num_workers is not None:
        return num_workers
    if device.type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(MAX_LOADER_WORKERS, cores // processes - 1))


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


# Functions called with a kind ("device_sync", "host_read") each time speedkit itself waits on the device, so
# a sync counter (speedkit.callbacks.SyncCounter) sees these waits on a CPU too, where they cost nothing.
SYNC_LISTENERS: list = []


def note_sync(kind: str) -> None:
    for listener in SYNC_LISTENERS:
        listener(kind)


def to_host(tensor: torch.Tensor) -> list | float | int | bool:
    """``tensor``'s values as Python numbers: the one way speedkit reads the device on purpose.

    One read of a stacked tensor costs one wait, however many values it holds; read as few times as
    possible (at the logging interval, once per evaluation). On a GPU the copy to the host is the wait, and
    a sync counter sees that copy; on a CPU it is told here, so the same count holds on both.
    """
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        note_sync("host_read")
        return tensor.tolist()
    return tensor.to("cpu").tolist()


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so a wall-clock reading means what it says."""
    note_sync("device_sync")
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
