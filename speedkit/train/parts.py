"""The parts a Trainer is built from: loss, evaluators, callbacks, optimizers, schedules, the record, its
logger and the config it keeps. Each turns what a user may pass (a factory, a list, a name, None) into one
kind, so the Trainer's ``__init__`` reads as a list of parts."""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from speedkit.callbacks import (CheckpointSaver, LRMonitor, NaNGuard, ProgressBar, SpeedMonitor, StopAtTarget,
                                SyncCounter, resolve_progress_bar)
from speedkit.core import Callback, Event, Interval, Time
from speedkit.core.batch import batch_targets, output_logits, output_loss
from speedkit.core.devices import cpu_bf16_speedup
from speedkit.optim import Schedule, apply_schedule, get_schedule
from speedkit.optim.follow import TORCH_SCHEDULERS, FollowSchedule, follow_user_schedule
from speedkit.record.loggers import ConsoleLogger, Logger, RecordDestination, logger_from_name
from speedkit.record.metrics import Evaluator, flatten_logits
from speedkit.record.runs import RunRecord, lower_is_better
from speedkit.train.batches import loader_length


def cross_entropy_loss(outputs, batch) -> torch.Tensor:
    """The loss the model computed itself (a Hugging Face output's ``.loss``), else cross-entropy of its logits
    against the batch's labels: index or dense (soft) labels; [B,T,V] logits flattened."""
    own = output_loss(outputs)
    if own is not None:
        return own
    logits, targets = flatten_logits(output_logits(outputs), batch_targets(batch))
    return F.cross_entropy(logits.float(), targets)


def relabelled_cross_entropy(methods: tuple[str, ...], outputs, batch) -> torch.Tensor:
    """The default loss where ``methods`` change the batch's labels (mixup, label smoothing): cross-entropy of the
    logits against those labels. A loss the model computed itself (a Hugging Face model called with ``labels=``)
    was computed from the labels it was given, never from the changed ones, so taking it would train as if the
    methods were not there (mixup: mixed inputs scored against unmixed labels): refused, at the first step."""
    if output_loss(outputs) is not None:
        raise ValueError(f"the model returned a loss of its own (its output's .loss), computed from the labels it "
                         f"was given and not from those {', '.join(methods)} made of the batch's, so the methods "
                         f"would not reach the loss; call the model without its labels (model(inputs)), so that "
                         f"speedkit's loss scores its logits against the batch's labels, or pass a loss_fn")
    return cross_entropy_loss(outputs, batch)


def is_default_loss(loss_fn: Callable) -> bool:
    """Whether ``loss_fn`` is the default cross-entropy ``make_loss`` gives (with or without label methods)."""
    return loss_fn is cross_entropy_loss or getattr(loss_fn, "func", None) is relabelled_cross_entropy


def make_loss(model: torch.nn.Module, loss_fn, methods=()) -> Callable:
    """The loss as ``fn(outputs, batch)``: the model's own ``loss``, a criterion(outputs, targets), or CE. A
    criterion that does what one of ``methods`` does (label smoothing) is refused here, before the first step."""
    if loss_fn is None:
        if callable(getattr(model, "loss", None)):
            return model.loss
        relabelling = tuple(m.name for m in methods if "labels" in m.CARD.writes)
        return functools.partial(relabelled_cross_entropy, relabelling) if relabelling else cross_entropy_loss
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {loss_fn!r}")
    for method in methods:
        method.check_criterion(loss_fn)
    return lambda outputs, batch: loss_fn(output_logits(outputs), batch_targets(batch))


@contextlib.contextmanager
def kernel_choice(deterministic: bool, device: torch.device):
    """How torch picks kernels while a run fits or evaluates. ``deterministic``: torch's deterministic kernels, and
    no cuDNN autotuning (which may pick another algorithm in each run). Otherwise, on CUDA, cuDNN's autotuner: it
    times its convolution algorithms once per input shape and keeps the fastest, and speedkit's methods bucket their
    shapes (progressive resizing in 32-px steps, ColOut's sizes fixed by the image's), so a run pays for a handful
    of tunings; under a user's own deterministic mode it stays off.

    The process's own settings come back after the block: a later run in the same process (a notebook's next one, a
    loop of the user's own, whose shapes may vary at every step) runs as the user set it, not as this run did."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda" and not before[0]:
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]


def make_record(run_folder: Path, name: str, writes: bool) -> RunRecord:
    """The run's RunRecord, saved as ``run_folder/record.json``; a process that ``writes`` nothing (a rank
    other than 0) keeps its record in memory."""
    record = RunRecord(name=name)
    record.path = str(run_folder / "record.json")
    if not writes:
        record.save = lambda path=None: Path(record.path)
    return record


def make_logger(state, destinations: list, console: bool, run_folder: Path, writes: bool) -> Logger:
    """A Logger whose first destination is the run's record, so every destination sees the same numbers.

    A destination given by name (``"tensorboard"``, ``"csv"``) writes into ``run_folder/<name>``, and only on
    the process that ``writes`` the run folder (rank 0): other ranks would write the same files.
    """
    named = [logger_from_name(d, run_folder) for d in destinations if isinstance(d, str) and writes]
    given = [d for d in destinations if not isinstance(d, str)]
    destinations = [RecordDestination(state.record), *given, *named, *([ConsoleLogger()] if console else [])]
    return Logger(state, destinations)


def apply_schedules(state) -> None:
    """Set every optimizer's learning rate (and what else a schedule drives) for the fraction of training done."""
    fraction = state.fraction_done()
    for schedule in state.schedulers:
        if isinstance(schedule, Schedule):
            for optimizer in state.optimizers:
                apply_schedule(optimizer, schedule, fraction, state.to_fraction)


def make_evaluators(model, eval_dataloader, evaluators, eval_interval) -> list[Evaluator]:
    evaluators = list(evaluators)
    if eval_dataloader is not None:
        # A model that names its own metrics (Composer-style ``metrics()``) is evaluated with them.
        own = model.metrics() if callable(getattr(model, "metrics", None)) else None
        evaluators.insert(0, Evaluator(eval_dataloader, own) if own else Evaluator(eval_dataloader))
    for ev in evaluators:
        if not isinstance(ev, Evaluator):
            raise TypeError(f"evaluators must be speedkit.record.metrics.Evaluator objects, got {type(ev).__name__}")
        ev.interval = ev.interval or Time.from_input(eval_interval)
        ev.schedule = Interval(ev.interval)
    return evaluators


def make_callbacks(callbacks, *, stop_at, nan_policy, progress_bar: bool | str, save: Callable | None,
                   save_interval) -> list[Callback]:
    """The user's callbacks between the monitors every run has and the ones its arguments ask for
    (``progress_bar="auto"``: a bar when someone is watching, see ``someone_is_watching``)."""
    callbacks = [SpeedMonitor(), LRMonitor(), *callbacks]
    if nan_policy is not None:
        callbacks.append(NaNGuard(nan_policy))
    if stop_at is not None:
        metric, value = (stop_at["metric"], stop_at["value"]) if isinstance(stop_at, dict) else stop_at
        callbacks.append(StopAtTarget(metric, value))
    if resolve_progress_bar(progress_bar):
        callbacks.append(ProgressBar())
    if save_interval is not None and save is not None:
        callbacks.append(CheckpointSaver(save, save_interval))
    return callbacks


def close_callbacks(state) -> None:
    """At every ending of a run, a failed one too: the progress bar closes, a sync counter stops counting."""
    for callback in state.callbacks:
        if isinstance(callback, (ProgressBar, SyncCounter)):
            callback.close()


def read_device_checks(state, logger) -> None:
    """Callbacks that keep a check on the device (``read_device_checks``: the NaN guard) read it now; the
    Trainer calls this at its wait points only (before an evaluation, a checkpoint and the run's end)."""
    for callback in state.callbacks:
        read = getattr(callback, "read_device_checks", None)
        if read is not None:
            read(state, logger)


def make_optimizers(optimizers, model) -> list[torch.optim.Optimizer]:
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("the model has no trainable parameters; nothing to train")
    if optimizers is None:
        optimizers = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True,
                                                    weight_decay=5e-4)
    if callable(optimizers) and not isinstance(optimizers, torch.optim.Optimizer):
        optimizers = optimizers(model.parameters())
    optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizers must be torch optimizers or a factory fn(params), got {opt!r}")
    return optimizers


def surgeons(methods) -> list[str]:
    """The names of ``methods`` that change the model at INIT (its surgery)."""
    return [m.name for m in methods if Event.INIT in m.CARD.events]


def refuse_wrapped_before_surgery(model: torch.nn.Module, methods, fix: str) -> None:
    """A model already wrapped for data parallelism (DDP, FSDP) is refused before speedkit's surgery (INIT) acts
    on it: DDP registered its parameters and its gradient buckets when it wrapped the model, so a parameter a
    surgery adds (squeeze_excite's blocks, QK-norm's gains) is never averaged across processes, and every rank
    trains its own copy without a word; FSDP has flattened or sharded what a surgery would replace. Naming ``fix``."""
    surgery, wrapper = surgeons(methods), _parallel_wrapper(model)
    if surgery and wrapper:
        raise ValueError(f"the model is already wrapped in {wrapper}, and speedkit's surgery ({', '.join(surgery)}) "
                         f"must change it before the wrapper takes its parameters: a parameter added after it would "
                         f"never be averaged across processes, and each would train its own; {fix}")


def _parallel_wrapper(model: torch.nn.Module) -> str | None:
    """The data-parallel wrapper ``model`` is (DDP) or holds (FSDP's wrapped or sharded modules), by name."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "DistributedDataParallel"
    if not torch.distributed.is_available():  # a build without it has no FSDP either
        return None
    import torch.distributed.fsdp as fsdp

    kinds = tuple(getattr(fsdp, name) for name in ("FullyShardedDataParallel", "FSDPModule") if hasattr(fsdp, name))
    sharded = next((module for module in model.modules() if isinstance(module, kinds)), None)
    return None if sharded is None else f"FSDP ({type(sharded).__name__})"


def refuse_optimizer_before_surgery(before: list[torch.Tensor], model: torch.nn.Module, optimizers, methods,
                                    fix: str) -> None:
    """An optimizer built on the model's parameters ``before`` the surgery (INIT) would never train the parameters
    a surgery added (squeeze_excite's blocks) and would step ones it replaced (factorize's layers), which the model
    no longer uses: refuse it before the first step, naming ``fix``."""
    held = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
    now = list(model.parameters())
    before_ids, now_ids = {id(p) for p in before}, {id(p) for p in now}
    untrained = sum(p.numel() for p in now if p.requires_grad and id(p) not in before_ids and id(p) not in held)
    replaced = sum(p.numel() for p in before if id(p) not in now_ids and id(p) in held)
    if untrained or replaced:
        surgery = ", ".join(surgeons(methods))
        raise ValueError(
            f"the optimizer holds the model's parameters from before speedkit's surgery"
            f"{f' ({surgery})' if surgery else ''}: "
            f"{untrained:,} parameter values the surgery added would never train and {replaced:,} it replaced would "
            f"be stepped in vain; {fix}")


def make_schedules(schedulers) -> list:
    """speedkit schedules (a Schedule, a name or a dict) and the user's torch LR schedulers, as a list."""
    if schedulers is None:
        return []
    if not isinstance(schedulers, (list, tuple)):
        schedulers = [schedulers]
    return [s if isinstance(s, TORCH_SCHEDULERS) else get_schedule(s) for s in schedulers]


def plateau_metric(schedulers, evaluators, stop_at) -> str | None:
    """The logged metric a ``ReduceLROnPlateau`` among ``schedulers`` steps on after each evaluation: the run's
    target (``stop_at``'s metric) when it has one, else the first evaluator's loss (``eval/loss``). None without
    such a scheduler. Refused before training where there is no such metric or the scheduler's ``mode`` would
    cut the rate while the metric improves."""
    plateaus = [s for s in schedulers if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau)]
    if not plateaus:
        return None
    if not evaluators:
        raise ValueError("schedulers: ReduceLROnPlateau steps on an evaluation metric after each evaluation, and "
                         "this Trainer evaluates nothing; pass eval_dataloader= (or evaluators=), or a scheduler "
                         "that steps by itself")
    if stop_at is not None:
        metric = stop_at["metric"] if isinstance(stop_at, dict) else stop_at[0]
    else:
        metric = f"{_logged_as(evaluators[0])}/loss"
    known = [f"{_logged_as(ev)}/{name}" for ev in evaluators for name in ev.metrics]
    if metric not in known:
        raise ValueError(f"schedulers: ReduceLROnPlateau steps on stop_at's metric, else the evaluation loss "
                         f"({metric}), which no evaluator logs (they log: {', '.join(known)}); give the first "
                         f"evaluator a 'loss' metric, or pass stop_at=(metric, target) naming the one to step on")
    mode = "min" if lower_is_better(metric) else "max"
    for scheduler in plateaus:
        if scheduler.mode != mode:
            better = "lower" if mode == "min" else "higher"
            raise ValueError(f"schedulers: ReduceLROnPlateau(mode={scheduler.mode!r}) steps on {metric}, where "
                             f"{better} is better: it would cut the learning rate while the run improves; build "
                             f"it with mode={mode!r}")
    return metric


def _logged_as(evaluator: Evaluator) -> str:
    """The prefix of an evaluator's logged metrics: ``eval`` for the main one, else ``eval/<label>``."""
    return "eval" if evaluator.label == "eval" else f"eval/{evaluator.label}"


def follow_schedules(state, given: list[torch.optim.Optimizer]) -> FollowSchedule | None:
    """The groups a method added at FIT_START (Muon's) follow the lr of the optimizers the user ``given``, which
    the user's torch schedulers (or code) set; None where none was added or speedkit's own schedules set every
    group, the added ones included."""
    if any(isinstance(s, Schedule) for s in state.schedulers):
        return None
    return follow_user_schedule(given, state.optimizers)


def step_torch_schedulers(state, follow: FollowSchedule | None) -> None:
    """After each optimizer step the user's torch schedulers step (a ``ReduceLROnPlateau`` steps after
    evaluations instead), and the groups a method added follow."""
    for scheduler in state.schedulers:
        if isinstance(scheduler, TORCH_SCHEDULERS) and not isinstance(scheduler,
                                                                       torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step()
    if follow is not None:
        follow()


def step_plateau_schedulers(state, metric: str | None, evaluated, follow: FollowSchedule | None) -> None:
    """After an evaluation of the ``evaluated`` evaluators: each ``ReduceLROnPlateau`` steps on ``metric`` where
    that evaluation computed it, and the groups a method added follow."""
    label, _, name = (metric or "").rpartition("/")
    if metric is None or label not in {_logged_as(ev) for ev in evaluated}:
        return
    value = state.eval_metrics[label][name]
    for scheduler in state.schedulers:
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(value)
    if follow is not None:
        follow()


def describe_run(state, *, precision: str, eval_interval, microbatch_size, grad_accum: int,
                 deterministic: bool, extra: dict | None) -> dict:
    """The RunRecord's config: what was asked for and what it resolved to."""
    loader = state.train_dataloader
    optimizer = state.optimizers[0]
    return {
        "model": type(state.model).__name__,
        "parameters": parameter_count(state.model),
        "optimizer": {"name": type(optimizer).__name__,
                      **{k: v for k, v in optimizer.defaults.items() if isinstance(v, (int, float, bool, str))}},
        "schedules": [s.to_dict() if isinstance(s, Schedule) else type(s).__name__ for s in state.schedulers],
        "max_duration": str(state.original_max_duration),
        "schedule_scale": state.schedule_scale,
        "precision": precision, "precision_resolved": state.precision, "device": str(state.device),
        "batch_size": getattr(loader, "batch_size", None), "microbatch_size": microbatch_size,
        "grad_accum": grad_accum, "seed": state.seed, "deterministic": deterministic,
        "eval_interval": str(eval_interval), "train_loader": type(loader).__name__ if loader is not None else None,
        **auto_precision_evidence(precision, state.device),
        **(extra or {}),
    }


def parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters as it counts them itself where it does (``GPT.num_params`` leaves out its
    vocabulary's pad rows, so a run recorded before the GPT padded its rows names the same model and resumes)."""
    own = getattr(model, "num_params", None)
    return own() if callable(own) else sum(p.numel() for p in model.parameters())


def auto_precision_evidence(precision: str, device) -> dict:
    """What "auto" chose from on a CPU: the bf16 speed-up it measured there (GPUs report their bf16 support)."""
    if precision != "auto" or device.type != "cpu":
        return {}
    return {"bf16_speedup_measured": round(cpu_bf16_speedup(torch.get_num_threads()), 3)}


def global_batch_size(loader, world: int) -> int | None:
    """Samples per step over all ranks: a sharded loader says so, a DataLoader's batch is per rank."""
    per_rank = getattr(loader, "batch_size", None)
    return getattr(loader, "global_batch_size", None) or (per_rank * world if per_rank else None)


def measure_loader(state, world: int) -> None:
    """Set ``state``'s epoch length and global batch size (samples, tokens) from its train loader."""
    loader = state.train_dataloader
    state.batches_per_epoch = loader_length(loader)
    if state.batches_per_epoch == 0:
        raise ValueError("train_dataloader is empty: it yields no batches")
    state.samples_per_batch = global_batch_size(loader, world)
    state.tokens_per_batch = getattr(loader, "tokens_per_batch", None)


def step_optimizers(state, closure) -> None:
    """Step every optimizer; those that evaluate the loss again (``needs_closure``) get ``closure``."""
    scaler = state.grad_scaler
    for optimizer in state.optimizers:
        if getattr(optimizer, "needs_closure", False):
            optimizer.step(closure)
        elif scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
    if scaler is not None:
        scaler.update()
