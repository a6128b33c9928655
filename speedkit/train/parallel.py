"""Training on several processes with PyTorch's own ``torch.distributed``: DDP by default, FSDP2 on request.

speedkit adds no engine of its own. ``torchrun`` (or ``speedkit launch``, which calls it) starts one
process per device and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`init_distributed` reads them and opens the default process group (gloo on CPU, nccl on CUDA).
Without ``WORLD_SIZE`` (or with 1) everything here is a no-op, so the same script runs in one process.

What the Trainer does with this module (``Trainer(parallel="auto" | "ddp" | "fsdp" | None)``) lives in its
parallel plan (:func:`make_plan`: :class:`SingleProcess`, :class:`DDPPlan`, :class:`FSDPPlan`, at the end of
this file), so the training loop itself has no branch on the strategy:

* **Wrapping** (:func:`wrap_model`), after the INIT surgery and before the optimizers are built.
  ``"ddp"``: ``DistributedDataParallel``; plain ``BatchNorm1d/2d/3d`` become synchronized batch norms
  first, so every rank normalizes with the statistics of the whole global batch (that is what makes
  two ranks train like one process on the same global batch). ``"fsdp"``: FSDP2's ``fully_shard`` on
  each repeated block (the elements of every ``nn.ModuleList``, e.g. a GPT's transformer blocks), then
  on the root; parameters become sharded ``DTensor``s.
* **Data**: each rank trains on its slice of the same global batch (the in-memory loaders take
  ``rank``/``world_size``; the torch DataLoader path gets a ``DistributedSampler``), so the recipe's
  batch size stays the global batch size.
* **Numbers that must agree**: the logged train loss is :func:`all_reduce_mean`-ed; evaluation
  metrics are summed across ranks (:func:`reduce_metrics`); whether to stop is decided together
  (:func:`any_rank`), so a wall-clock budget or a stop request on one rank never leaves another
  waiting in a collective.
* **Randomness**: all ranks start from the same seed (same initial weights, same surgery), but each
  epoch's global RNGs are seeded per rank (:func:`speedkit.core.distributed.rank_seed`; rank 0 keeps the
  one-process stream), so per-sample randomness (dropout, cutout holes, mixup pairs) is not repeated on
  every rank.
  Loader randomness (order, crops, flips) comes from the loaders' own (seed, epoch) generators and is
  the same global plan on every rank, each rank taking its slice.

Methods across ranks (what the Trainer and the methods do so that every rank stays the same model):

* ema, swa, lookahead read ``state.model``, which under DDP is the plain module (the wrapper only runs
  the training forward): their averages have the module's own parameter names, are identical on every
  rank (DDP keeps the weights identical; synchronized batch norms keep the statistics identical) and
  load in one process. Under FSDP they average the local shards and are checkpointed sharded.
* sam: its second forward/backward goes through the DDP wrapper, so its gradients are all-reduced
  like the first; every rank perturbs by the same (all-reduced) gradient.
* selective_backprop: each rank keeps the hardest half of its own slice; the kept counts are equal
  and every rank still runs backward, so DDP never waits.
* ghost_batchnorm: ghost batches are taken within each rank's slice (when the ghost size divides the
  per-rank batch they are the very ghost batches one process would form); these layers are not
  synchronized, so their running statistics are averaged over ranks after every step.
* layer_freezing and stochastic_depth (mode "block", drawn per rank): the set of parameters used in
  a step varies (their cards say so: ``MethodCard.varies_parameters``), so DDP runs with
  ``find_unused_parameters=True``; FSDP refuses them.
* gyro_dropout: every rank trains the same masks (drawn from a generator seeded by the run's seed).
* A method that sets weights from this rank's data at FIT_START (patch_whitening) is overridden by
  rank 0's weights, broadcast once after FIT_START.

The helpers below work whether or not a process group is open; read the rank and world size from
them rather than from ``torch.distributed`` so that code also runs in one process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect

import torch
import torch.distributed as dist
import torch.nn as nn

from speedkit.core.distributed import (all_gather_object, all_reduce_mean, any_rank, average_buffers, broadcast_module,
                                       broadcast_object, init_distributed, is_distributed, is_initialized, is_main,
                                       launched_distributed, local_device, rank, reduce_metrics, world_size)

STRATEGIES = ("ddp", "fsdp")


# -- synchronized batch norm ---------------------------------------------------------------------
class _AllReduceSum(torch.autograd.Function):
    """A sum over ranks whose gradient is the sum over ranks of the incoming gradients."""

    @staticmethod
    def forward(ctx, tensor):
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch norm over the whole global batch for devices torch's ``SyncBatchNorm`` refuses (CPU/gloo).

    In training it all-reduces the per-channel sum, then the sum of squared deviations from the global
    mean (two passes, as exact as one process), with an all-reduce whose backward is an all-reduce
    too, so the backward pass is the one-process backward too. In eval mode, or in one process,
    it is plain batch norm. Same parameters and buffers as ``BatchNorm*d``: checkpoints load either way.
    """

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and is_distributed()):
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        xf = x.float()
        # the sample count rides along with the sums: one all-reduce for both
        sums = _AllReduceSum.apply(torch.cat([xf.sum(dims), xf.new_tensor([x.numel() // x.shape[1]])]))
        n = float(sums[-1].item())
        mean = sums[:-1] / n
        centered = xf - mean.view(shape)
        var = _AllReduceSum.apply((centered * centered).sum(dims)) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), factor)
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(x.dtype)


_PLAIN_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> int:
    """Replace every plain ``BatchNorm1d/2d/3d`` (exact class) by a synchronized one, in place; returns how
    many. CUDA gets ``torch.nn.SyncBatchNorm``, other devices :class:`CpuSyncBatchNorm`. Subclasses
    (ghost batch norm, whose point is per-virtual-batch statistics) are left as they are."""
    sync_cls = nn.SyncBatchNorm if device.type == "cuda" else CpuSyncBatchNorm
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) not in _PLAIN_BATCHNORMS:
                continue
            new = sync_cls(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            if child.affine:
                new.weight, new.bias = child.weight, child.bias  # the same Parameter objects
            if child.track_running_stats:
                new.running_mean, new.running_var = child.running_mean, child.running_var
                new.num_batches_tracked = child.num_batches_tracked
            new.train(child.training)
            setattr(parent, name, new)
            count += 1
    return count


def has_unsynchronized_batchnorm(module: nn.Module) -> bool:
    """Batch norms whose running statistics drift apart across ranks (ghost batch norm, or no sync)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm)
               and not isinstance(m, (nn.SyncBatchNorm, CpuSyncBatchNorm)) and m.track_running_stats
               for m in module.modules())


# -- wrapping ------------------------------------------------------------------------------------
def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"parallel strategy must be one of {STRATEGIES} (or None / 'auto' for the Trainer), "
                         f"got {strategy!r}")
    return strategy


def resolve_strategy(parallel: str | None) -> str | None:
    """The Trainer's ``parallel`` argument: "auto" is "ddp" when launched with WORLD_SIZE > 1, else None."""
    if parallel is None:
        return None
    if parallel == "auto":
        return "ddp" if launched_distributed() else None
    return check_strategy(parallel)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one: every element of every ``nn.ModuleList`` (transformer
    blocks) or, in a model without one, every direct child with parameters. A unit sharing a parameter
    with the rest of the model (a tied embedding) is left to the root."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    candidates = [m for lst in lists for m in lst] if lists else list(model.children())
    units = []
    for unit in candidates:
        own = {id(p) for p in unit.parameters()}
        if not own:
            continue
        inside = {id(m) for m in unit.modules()}
        shared = any(id(p) in own for m in model.modules() if id(m) not in inside
                     for p in m.parameters(recurse=False))
        if not shared:
            units.append(unit)
    return units


def wrap_model(model: nn.Module, strategy: str, device: torch.device | str, *,
               find_unused_parameters: bool = False, sync_batchnorm: bool = True) -> nn.Module:
    """Wrap ``model`` (already on ``device``) for ``strategy`` ("ddp" or "fsdp"); needs an open process group.

    "ddp" returns a ``DistributedDataParallel`` around the model (which stays reachable as ``.module``);
    "fsdp" shards the model in place with ``fully_shard`` and returns it. With ``sync_batchnorm`` plain
    batch norms are converted first (see :func:`convert_sync_batchnorm`). ``find_unused_parameters`` is
    for models whose set of parameters used per step varies (layer freezing, per-batch stochastic depth).
    """
    strategy = check_strategy(strategy)
    if not is_initialized():
        raise RuntimeError("wrap_model needs a process group: start under torchrun and call init_distributed()")
    device = torch.device(device)
    if sync_batchnorm:
        convert_sync_batchnorm(model, device)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Buffers are not broadcast before every forward: synchronized batch norms keep them equal, and the
        # Trainer averages what is left (ghost batch norm) after each step. Init still syncs from rank 0.
        sync = ({"forward_sync_buffers": False}
                if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                else {"broadcast_buffers": False})
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       find_unused_parameters=find_unused_parameters, **sync)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # DDP broadcasts rank 0's weights when it wraps; fully_shard keeps each rank's own, so make them one model.
    broadcast_module(model)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# -- the Trainer's parallel plan -------------------------------------------------------------------
@dataclasses.dataclass
class CheckpointShare:
    """What a plan gathers on this rank for a checkpoint, and who writes it (the Checkpointer writes;
    the format module knows the file)."""

    model: dict  # the model's state dict: whole (one file) or this rank's shards (sharded)
    optimizers: list  # the optimizers' state dicts, likewise
    rng_by_rank: list | None = None  # every rank's RNG state, where the ranks gathered them
    sharded: bool = False  # every rank writes its shards (a collective), rank 0 the rest
    writes: bool = True  # this rank writes the one file (when not sharded)


# Everything a training loop does differently on several processes, behind one interface, so the loop
# itself has no branches on the strategy: ``SingleProcess`` (every hook a no-op), ``DDPPlan`` and
# ``FSDPPlan``. ``make_plan`` picks one from the Trainer's ``parallel`` argument.
class SingleProcess:
    """The plan of a run in one process: nothing to wrap, reduce, pad or share."""

    name: str | None = None
    world = 1

    def __init__(self, device: torch.device):
        self.device = device

    # -- construction ------------------------------------------------------------------------
    def agree_on_run_name(self, name: str, given: bool) -> str:
        """The run's name, the same on every rank (one run folder for all)."""
        return name

    def agree_on_precision(self, precision: str) -> str:
        """Rank 0's resolved precision on every rank: "auto" times bf16 in each process, and two ranks must
        not train in two precisions because their measurements differed."""
        return precision

    def wrap(self, model: nn.Module, methods, grad_scaler) -> nn.Module:
        """Prepare ``model`` after the INIT surgery; returns the module that runs the training forward."""
        return model

    def config(self, model: nn.Module, global_batch_size: int | None) -> dict:
        """What the RunRecord's config says about processes."""
        return {"world_size": 1, "parallel": None}

    # -- the loop ----------------------------------------------------------------------------
    def after_fit_start(self, model: nn.Module) -> None:
        """After FIT_START, where a method may have set weights from this rank's data (patch whitening)."""

    def after_step(self, model: nn.Module, step_loss: torch.Tensor) -> torch.Tensor:
        """After each optimizer step; returns the step's loss as every rank should log it."""
        return step_loss

    def gradient_sync(self, train_module: nn.Module, last: bool):
        """The context of one microbatch's forward and backward; ``last``: the step's last microbatch."""
        return contextlib.nullcontext()

    def agree_to_end(self, state, end: bool) -> bool:
        """Whether the run ends now, decided by all ranks together (or one would wait in a collective)."""
        return end

    # -- evaluation --------------------------------------------------------------------------
    def before_eval(self, model: nn.Module) -> None:
        """Before an evaluation: make every rank's copy of the model the same."""

    def finish_evaluator(self, model: nn.Module, evaluator, seen: int, repeat_last) -> None:
        """After this rank's evaluation batches (``seen`` of them): pad and combine the metrics.

        ``repeat_last()`` runs the last batch again without counting it.
        """

    # -- checkpoints -------------------------------------------------------------------------
    def gather_checkpoint(self, state, logger, rng: dict, last_checkpoint: str | None) -> CheckpointShare | None:
        """What this rank contributes to a checkpoint now (``rng``: this process's RNG state), or None when
        no checkpoint can be written now (the log and the record say why; ``last_checkpoint`` is kept)."""
        return CheckpointShare(state.model.state_dict(), [opt.state_dict() for opt in state.optimizers])

    def ranks_that_see(self, found: bool) -> list[bool]:
        """``found`` (a checkpoint to resume from) as each rank has it: every rank must resume, or none."""
        return [found]

    def device_mesh(self, model: nn.Module):
        """The mesh sharded parameters live on (None when they are not sharded)."""
        return None

    def resume_rng(self, rng: dict, rng_by_rank: list | None) -> dict:
        """The RNG state this rank continues from, of a checkpoint's ``rng`` (the writer's) and ``rng_by_rank``."""
        return rng


class _SeveralProcesses(SingleProcess):
    """What DDP and FSDP share: a process group, agreement between ranks, metrics summed over ranks."""

    def __init__(self, device: torch.device):
        super().__init__(local_device(device))
        init_distributed(device=self.device)
        self.world = world_size()
        self.varying: list[str] = []
        self.averages_buffers = False  # unsynchronized batch norms (ghost batch norm): averaged after each step
        self._model_class = None

    def agree_on_run_name(self, name: str, given: bool) -> str:
        return name if given else broadcast_object(name)

    def agree_on_precision(self, precision: str) -> str:
        return broadcast_object(precision)

    def wrap(self, model, methods, grad_scaler):
        self._model_class = type(model).__name__
        self.varying = sorted(a.name for a in methods if a.varies_parameters)
        return model

    def config(self, model, global_batch_size):
        return {"world_size": self.world, "parallel": self.name, "model": self._model_class,
                "distributed": {"strategy": self.name, "world_size": self.world,
                                "backend": dist.get_backend(), "sync_batchnorm": True,
                                "find_unused_parameters": bool(self.varying) and self.name == "ddp",
                                "averaged_buffers": self.averages_buffers,
                                "global_batch_size": global_batch_size}}

    def after_step(self, model, step_loss):
        if self.averages_buffers:  # one set of running statistics for all ranks
            average_buffers(model)
        return all_reduce_mean(step_loss)  # the loss averaged over ranks

    def agree_to_end(self, state, end):
        if not any_rank(end):
            return False
        reasons = [r for r in all_gather_object(state.stop_reason if state.stop_requested else None) if r]
        if reasons and not state.stop_requested:
            state.request_stop(reasons[0])  # e.g. SIGTERM or trainer.stop() reached one rank only
        return True

    def before_eval(self, model):
        if self.averages_buffers:  # e.g. statistics a method refreshed per rank (swa's batch-norm pass)
            average_buffers(model)

    def finish_evaluator(self, model, evaluator, seen, repeat_last):
        reduce_metrics(evaluator.metrics.values())  # each rank evaluated its shard: sum the metric states

    def ranks_that_see(self, found: bool) -> list[bool]:
        return all_gather_object(found)

    def resume_rng(self, rng, rng_by_rank):
        # written by several ranks: each continues its own stream
        return rng_by_rank[rank()] if rng_by_rank and len(rng_by_rank) == self.world else rng

    @staticmethod
    def _alone(state) -> bool:
        """A failed or interrupted run may have lost its other ranks: no collectives then (they would hang)."""
        return state.record.status in ("failed", "interrupted")


class DDPPlan(_SeveralProcesses):
    """DistributedDataParallel: every rank holds the whole model; gradients are all-reduced.

    ``state.model`` stays the plain module, so methods (EMA, SWA, ...) and checkpoints see its own
    parameter names and a checkpoint written by several ranks loads in one process; the DDP wrapper
    only runs the training forward.
    """

    name = "ddp"

    def wrap(self, model, methods, grad_scaler):
        super().wrap(model, methods, grad_scaler)
        wrapped = wrap_model(model, "ddp", self.device, find_unused_parameters=bool(self.varying))
        self.averages_buffers = has_unsynchronized_batchnorm(model)
        return wrapped

    def after_fit_start(self, model):
        broadcast_module(model)  # rank 0's weights, wherever a method set them from this rank's data

    def gradient_sync(self, train_module, last):
        # Gradient accumulation all-reduces once per step: the microbatches before the last add up locally.
        return contextlib.nullcontext() if last else train_module.no_sync()

    def gather_checkpoint(self, state, logger, rng, last_checkpoint):
        # Rank 0 writes the plain module's weights with every rank's RNG (so each rank resumes its own stream).
        rng_by_rank = None
        if not self._alone(state):
            rng_by_rank = all_gather_object(rng)
            if self.averages_buffers:
                average_buffers(state.model)
        else:  # the other ranks may be gone: no collective, so their RNG states are not in this checkpoint
            _say(logger, "rank_0_rng_only", f"ddp: the checkpoint at batch {state.timestamp.batch} was "
                 f"written by rank 0 alone (the run {state.record.status}), so it holds rank 0's RNG state only: "
                 f"resumed on several ranks, every rank continues rank 0's stream until the next epoch re-seeds "
                 f"each (random draws such as dropout differ from an uninterrupted run); weights, optimizer, "
                 f"schedule and data position are complete")
        # Rank 0 writes (on a file system the ranks share).
        return CheckpointShare(state.model.state_dict(), [opt.state_dict() for opt in state.optimizers],
                               rng_by_rank=rng_by_rank, writes=is_main())


class FSDPPlan(_SeveralProcesses):
    """FSDP2: parameters sharded over the ranks; checkpoints written as shards by every rank."""

    name = "fsdp"

    def wrap(self, model, methods, grad_scaler):
        super().wrap(model, methods, grad_scaler)
        if self.varying:
            raise ValueError(f"parallel='fsdp' cannot run {', '.join(self.varying)}: it changes which blocks "
                             f"run per step, and FSDP needs every rank to run every block; use parallel='ddp'")
        if grad_scaler is not None:
            raise ValueError("parallel='fsdp' with precision='fp16' is not supported (its loss scaler would "
                             "need sharded inf checks); use precision='bf16'")
        return wrap_model(model, "fsdp", self.device)

    def finish_evaluator(self, model, evaluator, seen, repeat_last):
        # Every FSDP forward gathers shards from all ranks, so a rank whose shard of the eval set ran out
        # repeats its last batch (not counted) until the others are done.
        counts = all_gather_object(seen)
        if min(counts) == 0 < max(counts):
            raise ValueError(f"evaluator {evaluator.label!r}: some ranks have no evaluation batch "
                             f"(batches per rank: {counts}); under fsdp each rank needs at least one")
        for _ in range(max(counts) - seen):
            repeat_last()
        # FSDP2 keeps the root's parameters gathered after a forward without backward: shard them again,
        # so methods that swap weights at EVAL_END (ema) and the next step see DTensors.
        model.reshard()
        super().finish_evaluator(model, evaluator, seen, repeat_last)

    def gather_checkpoint(self, state, logger, rng, last_checkpoint):
        if self._alone(state):
            _say(logger, "checkpoint_not_written", f"fsdp: no checkpoint at batch {state.timestamp.batch}: "
                 f"the run {state.record.status}, and every rank must write its shards (the others may be gone); "
                 f"the last checkpoint, {last_checkpoint or 'none'}, is kept intact")
            return None
        from torch.distributed.checkpoint.state_dict import get_state_dict

        rng_by_rank = all_gather_object(rng)
        # Sharded state dicts keyed by parameter name: every rank writes its shards of them.
        model_sd, optim_sd = get_state_dict(state.model, [getattr(o, "base_optimizer", o) for o in state.optimizers])
        return CheckpointShare(model_sd, optim_sd, rng_by_rank=rng_by_rank, sharded=True)

    def device_mesh(self, model):
        return next((p.device_mesh for p in model.parameters() if hasattr(p, "device_mesh")), None)


def _say(logger, note: str, text: str) -> None:
    """What a checkpoint does not hold, in the log and in the record's notes."""
    logger.log_note(note, text)
    logger.log_text(text)


def make_plan(parallel: str | None, device: torch.device, microbatch_size=None) -> SingleProcess:
    """The plan for the Trainer's ``parallel`` argument: one process unless launched with several."""
    strategy = resolve_strategy(parallel)  # checked even where there is nothing to split
    if strategy is None or not launched_distributed():
        return SingleProcess(device)  # one process: "ddp"/"fsdp" have nothing to do (the config notes world_size 1)
    if microbatch_size == "auto":  # one rank halving alone would leave the others waiting in all-reduce
        raise ValueError("microbatch_size='auto' runs in one process only; under torchrun give a fixed "
                         "microbatch_size (e.g. the size a one-process run settled on, in record.notes)")
    return {"ddp": DDPPlan, "fsdp": FSDPPlan}[strategy](device)
