"""Ranks and collectives that work in one process too: the rank and world size, seeds per rank, shards of
a data set, and sums, means and broadcasts across ranks (no-ops without a process group).

``torchrun`` (or ``speedkit launch``) starts one process per device and sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` reads them and opens the
default process group (gloo on CPU, nccl on CUDA). Read the rank and world size from these helpers rather
than from ``torch.distributed`` so that code also runs in one process. How the Trainer wraps a model for
several processes (DDP, FSDP2) is ``speedkit.train.parallel``.
"""
from __future__ import annotations

import datetime
import functools
import os
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from speedkit.core.seeding import process_seed


# -- where am I ----------------------------------------------------------------------------------
def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be a whole number") from None


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Processes in the run: the process group's size, else ``WORLD_SIZE`` from torchrun, else 1."""
    return dist.get_world_size() if is_initialized() else _env_int("WORLD_SIZE", 1)


def rank() -> int:
    """This process's global rank (0 in a single process)."""
    return dist.get_rank() if is_initialized() else _env_int("RANK", 0)


def local_rank() -> int:
    """This process's rank on its machine (``LOCAL_RANK``), which picks its GPU."""
    return _env_int("LOCAL_RANK", 0)


def is_main() -> bool:
    """Rank 0: the process that logs, writes the RunRecord and (outside FSDP) the checkpoints."""
    return rank() == 0


def is_distributed() -> bool:
    """A process group with more than one process is open."""
    return is_initialized() and dist.get_world_size() > 1


def launched_distributed() -> bool:
    """Started by torchrun (or similar) with more than one process, whether or not the group is open yet."""
    return world_size() > 1


def local_device(device: str | torch.device = "auto") -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` when CUDA is used, else the device as given (CPU)."""
    if isinstance(device, str) and device in ("auto", "cuda"):
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank() % torch.cuda.device_count())
        if device == "cuda":
            raise ValueError("device='cuda' was asked for but CUDA is not available here")
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", local_rank() % torch.cuda.device_count())
    return device


def init_distributed(backend: str | None = None, device: str | torch.device | None = None,
                     timeout_s: float | None = None) -> bool:
    """Open the default process group from torchrun's environment; returns whether one is open.

    A no-op (returning False) when ``WORLD_SIZE`` is unset or 1, and when a group is already open
    (returning True). ``backend`` defaults to nccl for a CUDA device and gloo otherwise.
    """
    if is_initialized():
        return True
    if _env_int("WORLD_SIZE", 1) <= 1:
        return False
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} is not set; start "
                         f"the script with torchrun (or `speedkit launch -n N script.py`), which sets them")
    device = local_device(device or "auto")
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kwargs = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(backend, **kwargs)
    return True


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place, so its model is already the module)."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def rank_seed(seed: int) -> int:
    """The seed of this rank's global RNGs: ``seed`` itself on rank 0, a distinct stream on every other."""
    return process_seed(abs(int(seed)) if rank() else seed, rank())


# -- data sharding -------------------------------------------------------------------------------
def resolve_shard(rank_: int | None = None, world_size_: int | None = None) -> tuple[int, int]:
    """A loader's (rank, world_size): as given, else this process's (from torchrun's environment)."""
    world = world_size() if world_size_ is None else int(world_size_)
    if rank_ is not None:
        r = int(rank_)
    else:  # this process's rank, unless an explicit world size says the loader is not this run's split
        r = rank() if world == world_size() else 0
    if world < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size_}")
    if not 0 <= r < world:
        raise ValueError(f"rank must be in [0, world_size={world}), got {r}")
    return r, world


def shard_span(start: int, stop: int, rank_: int, world_size_: int) -> tuple[int, int]:
    """This rank's contiguous part of positions [start, stop): sizes differ by at most one, the first
    ranks taking the extra ones (``torch.tensor_split``'s rule); the parts cover the range exactly once."""
    size = stop - start
    base, extra = divmod(size, world_size_)
    lo = start + rank_ * base + min(rank_, extra)
    return lo, lo + base + (1 if rank_ < extra else 0)


# -- collectives (identity in one process) -------------------------------------------------------
def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over all ranks (a new tensor; ``tensor`` itself when not distributed)."""
    if not is_distributed():
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over all ranks (``tensor`` itself when not distributed)."""
    return all_reduce_sum(tensor) / dist.get_world_size() if is_distributed() else tensor


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (decisions all ranks must share)."""
    if not is_distributed():
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_object(obj, src: int = 0):
    """``obj`` as rank ``src`` has it, on every rank (pickled over the wire, never read from a file)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _collective_device() -> torch.device:
    """nccl only moves CUDA tensors; gloo only CPU ones."""
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@torch.no_grad()
def reduce_metrics(metrics: Iterable) -> None:
    """Sum every metric's additive state (``Metric.sum_states``) over the ranks, in one all-reduce.

    Each rank has evaluated its own shard of the eval set; after this every rank holds the state of
    the whole set, so ``compute()`` gives the one-process value. A metric that synchronizes itself in
    ``compute()`` (``syncs_itself``: a torchmetrics metric) is left to do so; any other metric without
    ``sum_states`` cannot be combined and is refused with a message naming it.
    """
    metrics = [m for m in metrics if not getattr(m, "syncs_itself", False)]
    if not is_distributed() or not metrics:
        return
    for m in metrics:
        if not getattr(m, "sum_states", None):
            raise TypeError(f"metric {type(m).__name__} cannot be reduced across ranks: give it `sum_states`, "
                            f"the names of its additive attributes (as speedkit.record.metrics.Accuracy does), or use "
                            f"a torchmetrics.Metric, which synchronizes itself")
    # States may be device tensors (speedkit's metrics keep them there): stacked, not read one by one.
    device = _collective_device()
    states = [getattr(m, name) for m in metrics for name in m.sum_states]
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device).reshape(()) for v in states])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    flat = iter(t.tolist())
    for m in metrics:
        for name in m.sum_states:
            old = getattr(m, name)
            value = next(flat)
            integer = isinstance(old, int) or (isinstance(old, torch.Tensor) and not old.is_floating_point())
            setattr(m, name, int(round(value)) if integer else value)


@torch.no_grad()
def average_buffers(module: nn.Module) -> None:
    """Average floating-point buffers (running statistics of unsynchronized batch norms) over ranks,
    and give integer buffers rank 0's values, so evaluation and weight averages see one model."""
    if not is_distributed():
        return
    buffers = [b for b in module.buffers() if b.numel() and not is_dtensor(b)]
    floats = [b for b in buffers if b.is_floating_point()]
    others = [b for b in buffers if not b.is_floating_point()]
    for group, op in ((floats, "mean"), (others, "broadcast")):
        for dtype in _dtypes(group):  # the same order on every rank
            same = [b for b in group if b.dtype == dtype]
            flat = torch.cat([b.reshape(-1) for b in same]).to(_collective_device())
            if op == "mean":
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat /= dist.get_world_size()
            else:
                dist.broadcast(flat, src=0)
            offset = 0
            for b in same:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()


@torch.no_grad()
def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Give every rank rank ``src``'s parameters and buffers (after a method changed weights per rank)."""
    if not is_distributed():
        return
    tensors = [t for t in list(module.parameters()) + list(module.buffers()) if t.numel() and not is_dtensor(t)]
    for dtype in _dtypes(tensors):  # the same order on every rank
        same = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in same]).to(_collective_device())
        dist.broadcast(flat, src=src)
        offset = 0
        for t in same:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def _dtypes(tensors) -> list:
    """The dtypes among ``tensors`` in a fixed order (a set's order differs between processes)."""
    return sorted({t.dtype for t in tensors}, key=str)


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor: FSDP's sharded parameters and gradients."""
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(t, dtensor)


@functools.cache
def _dtensor_class():
    """DTensor's class, looked up once: the NaN guard asks of every gradient at every step."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return None
    return DTensor
