"""The Trainer: a training loop whose every step is a named event that methods can act on.

Reading order: ``__init__`` (resolve device, precision, methods; INIT), ``fit`` (resume, the epoch
loop, clean endings), ``_train_batch`` (microbatches, forward, loss, backward, step), ``eval``.
Every run writes a RunRecord and, unless told not to, a final checkpoint into its run folder.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from speedkit import distributed
from speedkit.callbacks import CheckpointSaver, LRMonitor, NaNGuard, ProgressBar, SpeedMonitor, StopAtTarget
from speedkit.algorithms import build_algorithms
from speedkit.checkpoint import (CheckpointError, load_checkpoint, load_sharded_checkpoint, rng_state, save_checkpoint,
                                 save_sharded_checkpoint, set_rng_state)
from speedkit.core import Algorithm, Callback, Engine, Event, Interval, State, Time, Timestamp, TimeUnit
from speedkit.devices import autocast_factory, make_grad_scaler, resolve_device, resolve_precision, synchronize
from speedkit.loggers import ConsoleLogger, InMemoryLogger, JSONLFileLogger, Logger, RecordDestination
from speedkit.metrics import Evaluator, flatten_logits
from speedkit.optim import Schedule, apply_schedule, get_schedule
from speedkit.optim.factory import make_optimizer_factory
from speedkit.recipes import resolve_recipe
from speedkit.runs import RunRecord, environment
from speedkit.validation import (check_first_batch, check_first_loss, check_first_outputs, check_trainer_arguments,
                                 explain_first_batch_error, is_out_of_memory)

LATEST = "latest.ckpt"
SIGTERM_REASON = "SIGTERM"
SIGTERM_EXIT_CODE = 128 + int(signal.SIGTERM)  # 143: what shells, Slurm and Kubernetes report for it
_NOT_INSTALLED = object()
EVAL_EVENTS = tuple(event for event in Event if event.is_eval)


def cross_entropy_loss(outputs: torch.Tensor, batch) -> torch.Tensor:
    """Cross-entropy against ``batch[1]``: index labels or dense (soft) labels; [B,T,V] logits flattened."""
    outputs, targets = flatten_logits(outputs, batch[1])
    return F.cross_entropy(outputs.float(), targets)


def _resolve_loss(model: torch.nn.Module, loss_fn) -> Callable:
    """The loss as ``fn(outputs, batch)``: the model's own ``loss``, a criterion(outputs, targets), or CE."""
    if loss_fn is None:
        return model.loss if callable(getattr(model, "loss", None)) else cross_entropy_loss
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {loss_fn!r}")
    return lambda outputs, batch: loss_fn(outputs, batch[1])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _split_batch(batch, n: int) -> list:
    """Split every tensor of a batch into ``n`` chunks along the first dimension."""
    if n == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n))
    parts = [_split_batch(b, n) if isinstance(b, torch.Tensor) else [b] * n for b in batch]
    return [type(batch)(p[i] for p in parts) for i in range(min(len(p) for p in parts))]


def _batch_size(batch) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0])


def _tokens_in(batch) -> int:
    """Token count of a language-model batch (integer inputs); 0 for images."""
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return first.numel() if isinstance(first, torch.Tensor) and not first.is_floating_point() else 0


class TrainClock:
    """Training wall clock that pauses during evaluation and checkpointing.

    What methods add to an evaluation is added to ``offset`` afterwards (see ``Trainer._count_eval_methods``).
    """

    def __init__(self, offset: float = 0.0):
        self.offset, self._started = offset, None

    def start(self):
        if self._started is None:
            self._started = time.perf_counter()

    def pause(self):
        if self._started is not None:
            self.offset += time.perf_counter() - self._started
            self._started = None

    def elapsed(self) -> float:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self.offset + running


class Trainer:
    """Train ``model`` on ``train_dataloader`` with speed-up ``algorithms``.

    Durations (``max_duration``, ``eval_interval``, ``save_interval``) take strings such as ``"3ep"``,
    ``"500ba"``, ``"0.25dur"`` or ``"90s"``. ``optimizers`` is an optimizer, a list of them, or a factory
    ``fn(params) -> optimizer`` (use a factory when methods change the model at INIT).
    ``schedulers`` are speedkit schedules (functions of the fraction done) or torch LR schedulers.
    ``stop_at=("eval/accuracy", 0.92)`` ends the run when the target is reached (time to accuracy).
    ``recipe="mild"`` (or ``"fashion-mnist:mild"``, or a Recipe) supplies the duration, optimizer,
    schedule, methods and precision that are not given explicitly.
    Each run lives in ``run_dir/run_name``: ``record.json``, ``log.jsonl`` and ``checkpoints/`` (or
    ``save_folder``), where a final checkpoint is always written unless ``save_checkpoints=False``.
    ``microbatch_size="auto"`` starts with the whole batch and halves the microbatch on out-of-memory.
    A SIGTERM during ``fit`` (main thread) stops at the next batch, saves, then exits with code 143.
    Under torchrun (or ``speedkit launch -n N``), ``parallel="auto"`` trains with DDP and ``"fsdp"`` shards the
    model with FSDP2; each rank takes its slice of every global batch (see ``speedkit.distributed``).
    """

    _auto_microbatch = False  # microbatch_size="auto": halve the microbatch when a step runs out of memory
    _sigterm_received = False
    _first_batch_checked = False  # the first training step checks the batch against the model, once
    parallel: str | None = None  # "ddp" or "fsdp" under torchrun (speedkit.distributed), else None
    _world = 1
    _ddp_model = None  # the DDP wrapper that runs the training forward; state.model stays the plain module
    _rng_by_rank = None
    _average_buffers = False

    def __init__(self, model: torch.nn.Module, train_dataloader: Iterable | None = None, *,
                 eval_dataloader: Iterable | None = None, evaluators: Sequence[Evaluator] = (),
                 max_duration: str | Time | None = None, optimizers=None, schedulers=None, loss_fn=None,
                 algorithms: Sequence[Algorithm] | None = None, callbacks: Sequence[Callback] = (), loggers=(),
                 precision: str | None = None, device: str | torch.device = "auto", recipe=None,
                 microbatch_size: int | None = None, grad_accum: int = 1,
                 seed: int = 0, deterministic: bool = False,
                 eval_interval: str | Time = "1ep", log_interval: int = 10,
                 run_name: str | None = None, run_dir: str | os.PathLike = "runs",
                 save_folder: str | os.PathLike | None = None, save_interval: str | Time | None = None,
                 save_checkpoints: bool = True, keep_checkpoints: int = 3,
                 load_path: str | os.PathLike | None = None, autoresume: bool = False,
                 stop_at: tuple[str, float] | dict | None = None, nan_policy: str | None = "stop",
                 schedule_scale: float = 1.0, progress_bar: bool = False, console: bool = False,
                 config: dict | None = None, parallel: str | None = "auto"):
        # Every argument checked first (speedkit.validation); a refusal names the argument and what it expects.
        check_trainer_arguments(locals())
        if recipe is not None:  # the recipe fills in what was not given explicitly
            recipe = resolve_recipe(recipe, model)
            max_duration = max_duration or recipe.duration
            optimizers = optimizers or make_optimizer_factory(recipe.optimizer)
            schedulers = recipe.schedule if schedulers is None else schedulers
            algorithms = build_algorithms(recipe.methods) if algorithms is None else algorithms
            precision = precision or recipe.precision
            config = {"recipe": recipe.name, "recipe_spec": recipe.to_dict(), **(config or {})}
        max_duration = Time.from_input(max_duration or "1ep")
        precision = precision or "fp32"
        algorithms = list(algorithms or ())
        if max_duration.unit is TimeUnit.DURATION:
            raise ValueError(f"max_duration={max_duration} is a fraction of itself; use ep, ba, sp, tok or s")

        self.deterministic = deterministic
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.benchmark = False
        seed_everything(seed)

        device = resolve_device(device)
        # Several processes (torchrun): open the process group, take this rank's device (speedkit.distributed).
        self.parallel = distributed.resolve_strategy(parallel)  # checked even where there is nothing to split
        if not distributed.launched_distributed():
            self.parallel = None  # one process: "ddp"/"fsdp" have nothing to do (the config notes world_size 1)
        self._world = 1
        if self.parallel:
            if microbatch_size == "auto":  # one rank halving alone would leave the others waiting in all-reduce
                raise ValueError("microbatch_size='auto' runs in one process only; under torchrun give a fixed "
                                 "microbatch_size (e.g. the size a one-process run settled on, in record.notes)")
            device = distributed.local_device(device)
            distributed.init_distributed(device=device)
            self._world = distributed.world_size()
        resolved_precision = resolve_precision(precision, device)
        self.microbatch_size, self.grad_accum = microbatch_size, grad_accum
        self.run_name = run_name or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        if self.parallel and run_name is None:
            self.run_name = distributed.broadcast_object(self.run_name)  # one run folder for all ranks
        self.run_folder = Path(run_dir) / self.run_name
        self.checkpoint_folder = Path(save_folder) if save_folder else self.run_folder / "checkpoints"
        self.save_checkpoints, self.keep_checkpoints = save_checkpoints, keep_checkpoints
        self.load_path, self.autoresume = load_path, autoresume

        record = RunRecord(name=self.run_name)
        record.path = str(self.run_folder / "record.json")
        if not distributed.is_main():  # only rank 0 writes the RunRecord; the others keep theirs in memory
            record.save = lambda path=None: Path(record.path)
        self.state = state = State(
            model=model.to(device), loss_fn=_resolve_loss(model, loss_fn), max_duration=max_duration,
            device=device, precision=resolved_precision, seed=seed, algorithms=algorithms,
            train_dataloader=train_dataloader, record=record, schedule_scale=float(schedule_scale))
        state.log_every = log_interval
        state.autocast = autocast_factory(resolved_precision, device)
        state.grad_scaler = make_grad_scaler(resolved_precision, device)
        state.evaluators = self._make_evaluators(model, eval_dataloader, evaluators, eval_interval)
        state.callbacks = self._make_callbacks(callbacks, stop_at, nan_policy, progress_bar and distributed.is_main(),
                                               save_interval)

        self.memory_logger = InMemoryLogger()
        destinations = [RecordDestination(record), self.memory_logger, *loggers]
        if console and distributed.is_main():
            destinations.append(ConsoleLogger())
        self.logger = Logger(state, destinations)
        self.engine = Engine(state, self.logger)
        self._log_file: JSONLFileLogger | None = None

        # Methods that change the model act now, before optimizers are built on its parameters.
        self.engine.run_event(Event.INIT)
        self._wrap_model()  # after the surgery, before the optimizers: FSDP replaces the parameters
        state.optimizers = self._make_optimizers(optimizers, state.model)
        state.schedulers = self._make_schedules(schedulers)
        record.config = self._describe(precision, eval_interval, config)
        record.config.update(self._parallel_config())
        record.methods = [{"name": a.name, "params": dict(a.params)} for a in state.algorithms]
        record.environment = environment(device)
        self._clock = TrainClock()
        self._resume_rng: dict | None = None
        self._fit_started = False

    # -- construction helpers -------------------------------------------------------------
    @staticmethod
    def _make_evaluators(model, eval_dataloader, evaluators, eval_interval) -> list[Evaluator]:
        evaluators = list(evaluators)
        if eval_dataloader is not None:
            # A model that names its own metrics (Composer-style ``metrics()``) is evaluated with them.
            own = model.metrics() if callable(getattr(model, "metrics", None)) else None
            evaluators.insert(0, Evaluator(eval_dataloader, own) if own else Evaluator(eval_dataloader))
        for ev in evaluators:
            if not isinstance(ev, Evaluator):
                raise TypeError(f"evaluators must be speedkit.metrics.Evaluator objects, got {type(ev).__name__}")
            ev.interval = ev.interval or Time.from_input(eval_interval)
            ev.schedule = Interval(ev.interval)
        return evaluators

    def _make_callbacks(self, callbacks, stop_at, nan_policy, progress_bar, save_interval) -> list[Callback]:
        callbacks = [SpeedMonitor(), LRMonitor(), *callbacks]
        if nan_policy is not None:
            callbacks.append(NaNGuard(nan_policy))
        if stop_at is not None:
            metric, value = (stop_at["metric"], stop_at["value"]) if isinstance(stop_at, dict) else stop_at
            callbacks.append(StopAtTarget(metric, value))
        if progress_bar:
            callbacks.append(ProgressBar())
        if save_interval is not None and self.save_checkpoints:
            callbacks.append(CheckpointSaver(self.save_checkpoint, save_interval))
        return callbacks

    @staticmethod
    def _make_optimizers(optimizers, model) -> list[torch.optim.Optimizer]:
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

    # Methods whose set of parameters used in a step varies (by epoch, or at random per rank): DDP must
    # look for unused parameters after each forward, and FSDP cannot run them (every rank must run every block).
    _VARYING_PARAMETERS = {"layer_freezing": lambda params: True,
                           "stochastic_depth": lambda params: params.get("mode", "block") == "block"}

    def _wrap_model(self) -> None:
        """Under torchrun, wrap the model for DDP or shard it with FSDP2 (see speedkit.distributed).

        ``state.model`` stays the plain module under DDP, so methods (EMA, SWA, ...) and checkpoints see
        its own parameter names and a checkpoint written by several ranks loads in one process; the DDP
        wrapper only runs the training forward. FSDP2 shards the module in place.
        """
        self._ddp_model, self._average_buffers, self._varying = None, False, []
        if not self.parallel:
            return
        state = self.state
        self._model_class = type(state.model).__name__
        self._varying = sorted(a.name for a in state.algorithms
                               if a.name in self._VARYING_PARAMETERS and self._VARYING_PARAMETERS[a.name](a.params))
        if self.parallel == "fsdp":
            if self._varying:
                raise ValueError(f"parallel='fsdp' cannot run {', '.join(self._varying)}: it changes which blocks "
                                 f"run per step, and FSDP needs every rank to run every block; use parallel='ddp'")
            if state.grad_scaler is not None:
                raise ValueError("parallel='fsdp' with precision='fp16' is not supported (its loss scaler would "
                                 "need sharded inf checks); use precision='bf16'")
        wrapped = distributed.wrap_model(state.model, self.parallel, state.device,
                                         find_unused_parameters=bool(self._varying))
        if self.parallel == "ddp":
            self._ddp_model = wrapped
            # ghost batch norm keeps per-rank statistics: averaged after every step (speedkit.distributed)
            self._average_buffers = distributed.has_unsynchronized_batchnorm(state.model)

    def _parallel_config(self) -> dict:
        """What the RunRecord's config says about processes: world size and strategy."""
        if not self.parallel:
            return {"world_size": 1, "parallel": None}
        config = {"world_size": self._world, "parallel": self.parallel, "model": self._model_class,
                  "distributed": {"strategy": self.parallel, "world_size": self._world,
                                  "backend": torch.distributed.get_backend(), "sync_batchnorm": True,
                                  "find_unused_parameters": bool(self._varying) and self.parallel == "ddp",
                                  "averaged_buffers": self._average_buffers,
                                  "global_batch_size": self._global_batch_size()}}
        return config

    def _global_batch_size(self) -> int | None:
        loader = self.state.train_dataloader
        per_rank = getattr(loader, "batch_size", None)
        return getattr(loader, "global_batch_size", None) or (per_rank * self._world if per_rank else None)

    @staticmethod
    def _make_schedules(schedulers) -> list:
        if schedulers is None:
            return []
        if not isinstance(schedulers, (list, tuple)):
            schedulers = [schedulers]
        return [s if isinstance(s, torch.optim.lr_scheduler.LRScheduler) else get_schedule(s) for s in schedulers]

    def _describe(self, precision: str, eval_interval, extra: dict | None) -> dict:
        state = self.state
        loader = state.train_dataloader
        optimizer = state.optimizers[0]
        return {
            "model": type(state.model).__name__,
            "parameters": sum(p.numel() for p in state.model.parameters()),
            "optimizer": {"name": type(optimizer).__name__,
                          **{k: v for k, v in optimizer.defaults.items() if isinstance(v, (int, float, bool, str))}},
            "schedules": [s.to_dict() if isinstance(s, Schedule) else type(s).__name__ for s in state.schedulers],
            "max_duration": str(state.original_max_duration),
            "schedule_scale": state.schedule_scale,
            "precision": precision, "precision_resolved": state.precision, "device": str(state.device),
            "batch_size": getattr(loader, "batch_size", None), "microbatch_size": self.microbatch_size,
            "grad_accum": self.grad_accum, "seed": state.seed, "deterministic": self.deterministic,
            "eval_interval": str(eval_interval), "train_loader": type(loader).__name__ if loader is not None else None,
            **(extra or {}),
        }

    # -- public API -----------------------------------------------------------------------
    @property
    def record(self) -> RunRecord:
        return self.state.record

    def stop(self, reason: str = "stopped") -> None:
        """End the run at the next batch boundary, with a checkpoint and a complete record. Thread-safe."""
        self.state.request_stop(reason)

    def fit(self) -> RunRecord:
        """Train to ``max_duration`` (or a stop); returns the RunRecord, also saved as ``record.json``.

        Every ending leaves a complete record: ``completed``/``stopped``/``target_reached`` with a final
        checkpoint; ``interrupted`` (KeyboardInterrupt) with a checkpoint; ``terminated`` (SIGTERM) with a
        checkpoint, then ``SystemExit(143)``; ``failed`` with the error, the last checkpoint left untouched.
        """
        state, record = self.state, self.state.record
        if state.train_dataloader is None:
            raise ValueError("Trainer.fit needs train_dataloader")
        if self.microbatch_size == "auto":
            self._auto_microbatch, self.microbatch_size = True, None  # the whole batch first
        previous_sigterm = self._catch_sigterm()
        try:
            try:
                self._fit_start()
                self._remove_partial_writes()
                self._resume_auto_microbatch()
                while not self._should_end():
                    self._run_epoch()
                if state.stop_reason == SIGTERM_REASON:
                    # Suspended, not ended: no final evaluation (the grace period before SIGKILL is short)
                    # and no FIT_END (averaging methods would swap their weights in), so the checkpoint
                    # resumes exactly where the run was.
                    record.status = "terminated"
                    self.logger.log_text(f"SIGTERM: stopped after batch {state.timestamp.batch}; saving a "
                                         f"checkpoint and the record, then exiting with code {SIGTERM_EXIT_CODE}")
                else:
                    self._final_eval()
                    record.status = {"target_reached": "target_reached", None: "completed"}.get(
                        state.stop_reason, "stopped")
                record.stop_reason = state.stop_reason
                if record.status != "terminated":
                    self.engine.run_event(Event.FIT_END)
                self._finish(save=self.save_checkpoints)  # inside: a failed final save marks the run failed
            except KeyboardInterrupt:
                self._end_abnormally("interrupted", "KeyboardInterrupt", save=True)
                raise
            except BaseException as e:
                self._end_abnormally("failed", f"{type(e).__name__}: {e}", save=False)
                raise
        finally:
            self._restore_sigterm(previous_sigterm)
        if self._sigterm_received:
            if callable(previous_sigterm):  # someone else's handler (a job launcher's requeue, say) decides
                previous_sigterm(signal.SIGTERM, None)
                return record
            # Exit as SIGTERM would have, now that the work is saved: the script's code after fit() must not
            # run as if training had finished, and a job controller must see a terminated (restartable) job.
            raise SystemExit(SIGTERM_EXIT_CODE)
        return record

    # -- SIGTERM ----------------------------------------------------------------------------
    def _catch_sigterm(self):
        """Route SIGTERM to a stop at the next batch boundary while fit runs; returns the previous handler.

        torchrun, Slurm and Kubernetes send SIGTERM, then SIGKILL after a grace period. Only the main
        thread can set handlers (a run in a worker thread keeps the default), and a SIGTERM that is
        ignored (SIG_IGN) or handled outside Python is left alone.
        """
        self._sigterm_received = False
        if threading.current_thread() is not threading.main_thread():
            return _NOT_INSTALLED
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None or previous is signal.SIG_IGN:
            return _NOT_INSTALLED
        signal.signal(signal.SIGTERM, self._on_sigterm)
        return previous

    def _on_sigterm(self, signum, frame) -> None:
        # Only a flag: the handler interrupts the main thread anywhere (inside a lock, a log write), so the
        # stop itself is requested at the next batch boundary, by _should_end.
        self._sigterm_received = True

    @staticmethod
    def _restore_sigterm(previous) -> None:
        if previous is not _NOT_INSTALLED:
            signal.signal(signal.SIGTERM, previous)

    def _remove_partial_writes(self) -> None:
        """Delete temp files that a killed save left behind (they never replaced a checkpoint)."""
        if not self.autoresume or not self.checkpoint_folder.is_dir():
            return
        for pattern in (".ba*.ckpt.*.tmp", f".{LATEST}.link"):
            for leftover in self.checkpoint_folder.glob(pattern):
                leftover.unlink(missing_ok=True)

    # -- fit: start, loop, end ------------------------------------------------------------
    def _fit_start(self) -> None:
        state = self.state
        self._measure_loader()
        if distributed.is_main():  # the run folder's files are rank 0's to write
            self.run_folder.mkdir(parents=True, exist_ok=True)
            self._log_file = JSONLFileLogger(self.run_folder / "log.jsonl")
            self.logger.destinations.append(self._log_file)
        state.record.status = "running"
        # Methods may rebuild optimizers, wrap modules or replace the loader at FIT_START; resuming after
        # it loads the checkpoint into the same structure it was saved from.
        fit_start_s = self._timed(self._run_fit_start)
        self._measure_loader()
        self._maybe_resume()
        if state.timestamp.batch == 0:
            # What methods do at FIT_START (patch whitening's fit on data, optimizer wrapping) is part of
            # training: it counts in the clock, so in time to target, and is reported apart too. A resumed
            # run's clock continues from its checkpoint, which already counts the first run's fit start.
            state.timestamp = state.timestamp.with_wall(fit_start_s)
            state.record.timings["fit_start_s"] = round(fit_start_s, 4)
        self._clock = TrainClock(offset=state.timestamp.wall_s)
        for ev in state.evaluators:
            ev.schedule.start(state)
        state.record.save()
        self._fit_started = True

    def _run_fit_start(self) -> None:
        self.engine.run_event(Event.FIT_START)
        if self._ddp_model is not None:  # a method may have set weights from this rank's data (patch whitening)
            distributed.broadcast_module(self.state.model)

    def _timed(self, fn) -> float:
        """Seconds ``fn()`` took, device work included."""
        synchronize(self.state.device)
        start = time.perf_counter()
        fn()
        synchronize(self.state.device)
        return time.perf_counter() - start

    def _measure_loader(self) -> None:
        """Nominal epoch length and batch size, which convert between time units."""
        state = self.state
        loader = state.train_dataloader
        try:
            state.batches_per_epoch = len(loader) if hasattr(loader, "__len__") else None
        except TypeError:  # a DataLoader over an IterableDataset without __len__ has __len__ and raises
            state.batches_per_epoch = None
        if state.batches_per_epoch == 0:
            raise ValueError("train_dataloader is empty: it yields no batches")
        # Global sizes (all ranks together): a sharded loader says so, a DataLoader's batch is per rank.
        state.samples_per_batch = self._global_batch_size()
        state.tokens_per_batch = getattr(loader, "tokens_per_batch", None)
        if self.microbatch_size is None and self.grad_accum > 1 and state.samples_per_batch:
            self.microbatch_size = -(-(state.samples_per_batch // self._world) // self.grad_accum)

    def _should_end(self) -> bool:
        state = self.state
        if self._sigterm_received and not state.stop_requested:
            state.request_stop(SIGTERM_REASON)
        if state.max_duration.unit is TimeUnit.SECOND:
            state.timestamp = state.timestamp.with_wall(self._clock.elapsed())
        end = state.stop_requested or state.is_done()
        if self.parallel and distributed.any_rank(end):  # all ranks end at the same batch, or one would hang
            reasons = distributed.all_gather_object(state.stop_reason if state.stop_requested else None)
            reasons = [r for r in reasons if r]
            if reasons and not state.stop_requested:
                state.request_stop(reasons[0])  # e.g. SIGTERM or trainer.stop() reached one rank only
            end = True
        return end

    def _set_epoch(self, epoch: int) -> None:
        """Make each epoch's shuffling and augmentation a function of (seed, epoch), so resume is exact."""
        # Per rank (rank 0: the one-process stream), so ranks do not draw the same per-sample randomness.
        seed_everything(distributed.rank_seed(self.state.seed * 1_000_003 + epoch))
        loader = self.state.train_dataloader
        for obj in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None),
                                                                      "sampler", None)):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)

    def _epoch_complete(self) -> bool:
        per_epoch = self.state.batches_per_epoch
        return per_epoch is not None and self.state.timestamp.batch_in_epoch >= per_epoch

    def _epoch_iterator(self, skip: int):
        loader = self.state.train_dataloader
        if skip and hasattr(loader, "iter_from"):
            return loader.iter_from(skip)
        iterator = iter(loader)
        for _ in range(skip):  # generic fast-forward: replays the loader to the same place
            next(iterator, None)
        return iterator

    def _run_epoch(self) -> None:
        state, engine = self.state, self.engine
        resuming_mid_epoch = state.timestamp.batch_in_epoch > 0
        self._clock.start()  # starting the loader's iterator (worker processes) is training time too
        self._set_epoch(state.timestamp.epoch)
        iterator = self._epoch_iterator(state.timestamp.batch_in_epoch)
        if self._resume_rng is not None:
            set_rng_state(self._resume_rng)
            self._resume_rng = None
        if not resuming_mid_epoch:
            engine.run_event(Event.EPOCH_START)
        while not self._epoch_complete():
            if self._should_end():
                return  # stopped or out of budget mid-epoch: no epoch end
            engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch = next(iterator)
            except StopIteration:
                break
            state.batch = _to_device(batch, state.device)
            engine.run_event(Event.AFTER_DATALOADER)
            if not self._first_batch_checked:
                check_first_batch(state, _tokens_in(state.batch))
            self._train_batch()
            self._after_batch()
        if state.timestamp.batch_in_epoch == 0:  # looping over empty epochs would never reach max_duration
            raise ValueError(f"train_dataloader yielded no batches in epoch {state.timestamp.epoch}; a loader "
                             f"must yield batches every epoch (a generator is used up after one pass)")
        state.timestamp = state.timestamp.after_epoch()
        engine.run_event(Event.EPOCH_END)
        self._maybe_eval(at_epoch_end=True)
        self._paused(engine.run_event, Event.EPOCH_CHECKPOINT)

    def _after_batch(self) -> None:
        if self._average_buffers:  # unsynchronized batch norms: one set of running statistics for all ranks
            distributed.average_buffers(self.state.model)
        self.engine.run_event(Event.BATCH_END)
        self._maybe_eval(at_epoch_end=False)
        self._paused(self.engine.run_event, Event.BATCH_CHECKPOINT)

    # -- one optimizer step ---------------------------------------------------------------
    def _train_batch(self) -> None:
        state, engine = self.state, self.engine
        state.skip_step = False
        fraction = state.fraction_done()
        for schedule in state.schedulers:
            if isinstance(schedule, Schedule):
                for optimizer in state.optimizers:
                    apply_schedule(optimizer, schedule, fraction, state.to_fraction)
        engine.run_event(Event.BATCH_START)

        full_batch = state.batch
        total = _batch_size(full_batch)
        while True:
            n_micro = max(1, -(-total // self.microbatch_size)) if self.microbatch_size else 1
            microbatches = _split_batch(full_batch, n_micro)
            state.num_microbatches = len(microbatches)
            try:
                step_loss = self._forward_backward(full_batch, microbatches)
                break
            except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
                if not (self._auto_microbatch and is_out_of_memory(e)):
                    raise
                size = self.microbatch_size or total
                if size <= 1:
                    raise torch.OutOfMemoryError(
                        f"out of memory at batch {state.timestamp.batch} even with microbatches of 1 sample "
                        f"(microbatch_size='auto'): one sample's activations, the model and its optimizer state "
                        f"do not fit on {state.device}. Use a smaller model or sequence length, "
                        f"precision='bf16', or a device with more memory") from e
                error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            # Out of the except block, so the traceback's frames (and the activations they hold) are freed.
            self._halve_microbatch(full_batch, size, error)

        if not state.skip_step:
            self._optimizer_step(lambda: self._forward_backward(full_batch, microbatches))
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        engine.run_event(Event.AFTER_TRAIN_BATCH)
        for scheduler in state.schedulers:
            if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
                scheduler.step()

        if self.parallel:  # every rank, every step: the loss averaged over ranks; samples counted globally
            step_loss = distributed.all_reduce_mean(step_loss)
        state.timestamp = state.timestamp.after_batch(total * self._world, _tokens_in(full_batch) * self._world,
                                                      wall_s=self._clock.elapsed())
        if state.timestamp.batch % state.log_every == 0 or state.is_done():
            state.last_train_loss = step_loss.item()
            self.logger.log_metrics({"loss": state.last_train_loss})

    def _halve_microbatch(self, full_batch, size: int, error: str) -> None:
        """After an out-of-memory error: drop the partial step, halve the microbatch, and note it."""
        state = self.state
        state.batch, state.outputs, state.loss = full_batch, None, None
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)  # the retried batch accumulates its gradient from zero
        state.model.zero_grad(set_to_none=True)
        if state.device.type == "cuda":
            torch.cuda.empty_cache()
        self.microbatch_size = size // 2  # kept for the rest of the run
        note = state.record.notes.setdefault("auto_microbatch", {"microbatch_size": None, "reductions": []})
        note["microbatch_size"] = self.microbatch_size
        note["reductions"].append({"batch": state.timestamp.batch, "from": size, "to": self.microbatch_size})
        self.logger.log_text(f"out of memory at batch {state.timestamp.batch} with microbatches of {size} "
                             f"samples ({error}); retrying the batch with microbatches of {self.microbatch_size}")

    def _resume_auto_microbatch(self) -> None:
        """A resumed run keeps the microbatch size its earlier part settled on (same numerics, no retries)."""
        note = self.state.record.notes.get("auto_microbatch")
        if self._auto_microbatch and note and note.get("microbatch_size"):
            self.microbatch_size = int(note["microbatch_size"])

    def _forward_backward(self, full_batch, microbatches) -> torch.Tensor:
        """Gradients of the whole batch, one microbatch at a time; returns the batch's mean loss."""
        state = self.state
        total = _batch_size(full_batch)
        step_loss = torch.zeros((), device=state.device)
        for index, microbatch in enumerate(microbatches):
            state.batch, state.microbatch_index = microbatch, index
            weight = _batch_size(microbatch) / total
            step_loss += self._train_microbatch(weight) * weight
        state.batch = full_batch
        return step_loss

    def _train_microbatch(self, weight: float) -> torch.Tensor:
        state, engine = self.state, self.engine
        checked = self._first_batch_checked  # until the first step is through, failures name batch and model
        engine.run_event(Event.BEFORE_FORWARD)
        try:
            with state.autocast():
                state.outputs = (self._ddp_model or state.model)(state.batch_inputs())
        except Exception as error:
            if not checked:
                explain_first_batch_error(state, "forward", error)
            raise
        engine.run_event(Event.AFTER_FORWARD)
        if not checked:
            check_first_outputs(state, default_loss=state.loss_fn is cross_entropy_loss)
        engine.run_event(Event.BEFORE_LOSS)
        try:
            with state.autocast():
                state.loss = state.loss_fn(state.outputs, state.batch)
        except Exception as error:
            if not checked:
                explain_first_batch_error(state, "loss", error)
            raise
        if not checked:
            check_first_loss(state)
        engine.run_event(Event.AFTER_LOSS)
        engine.run_event(Event.BEFORE_BACKWARD)
        if not state.skip_step:
            scaled = state.loss * weight
            if state.grad_scaler is not None:
                scaled = state.grad_scaler.scale(scaled)
            try:
                scaled.backward()
            except Exception as error:
                if not checked:
                    explain_first_batch_error(state, "backward", error)
                raise
        engine.run_event(Event.AFTER_BACKWARD)
        self._first_batch_checked = True
        return state.loss.detach().float()

    def _optimizer_step(self, closure) -> None:
        """Step every optimizer. Those that evaluate the loss again (``needs_closure``, e.g. SAM) get a
        closure that re-runs forward, loss and backward on the same batch, events included."""
        scaler = self.state.grad_scaler
        for optimizer in self.state.optimizers:
            if getattr(optimizer, "needs_closure", False):
                optimizer.step(closure)
            elif scaler is not None:
                scaler.step(optimizer)
            else:
                optimizer.step()
        if scaler is not None:
            scaler.update()

    # -- evaluation -----------------------------------------------------------------------
    def _paused(self, fn, *args):
        """Run ``fn`` with the training clock stopped: evaluation and saving are not training time."""
        synchronize(self.state.device)
        self._clock.pause()
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._clock.start()
            self._add_timing("paused_s", time.perf_counter() - start)

    def _add_timing(self, key: str, seconds: float) -> None:
        timings = self.state.record.timings
        timings[key] = round(timings.get(key, 0.0) + seconds, 4)

    def _maybe_eval(self, at_epoch_end: bool) -> None:
        due = [ev for ev in self.state.evaluators if ev.schedule.due(self.state, at_epoch_end)]
        if due:
            self._paused(self.eval, due)

    def _final_eval(self) -> None:
        """Make sure the record ends with metrics for the final weights."""
        evals = self.state.record.evals
        if self.state.evaluators and (not evals or evals[-1]["batch"] != self.state.timestamp.batch):
            self._paused(self.eval)

    def eval(self, evaluators: Sequence[Evaluator] | None = None) -> dict[str, dict[str, float]]:
        """Evaluate the current model; returns and logs ``{label: {metric: value}}``."""
        state = self.state
        evaluators = state.evaluators if evaluators is None else evaluators
        start = time.perf_counter()
        method_s_before = self.engine.seconds_at(EVAL_EVENTS)
        if self._average_buffers:  # e.g. statistics a method refreshed per rank (swa's batch-norm pass)
            distributed.average_buffers(state.model)
        was_training = state.model.training
        state.model.eval()
        results = {}
        # Evaluation must not shift training's random stream (DataLoader iterators draw a seed), or how
        # often one evaluates would change the run; fork_rng restores the generators afterwards.
        devices = [state.device] if state.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                for evaluator in evaluators:
                    results[evaluator.label] = self._run_evaluator(evaluator)
        finally:
            state.model.train(was_training)
        eval_s = time.perf_counter() - start
        self._add_timing("eval_s", eval_s)
        self._count_eval_methods(self.engine.seconds_at(EVAL_EVENTS) - method_s_before)
        logged = {f"{'eval' if label == 'eval' else 'eval/' + label}/{name}": value
                  for label, metrics in results.items() for name, value in metrics.items()}
        self.logger.log_metrics({**logged, "eval_s": round(eval_s, 4)})
        state.record.final_metrics = logged
        if self._fit_started:
            state.record.save()
        return results

    def _count_eval_methods(self, seconds: float) -> None:
        """Count what methods added to an evaluation (test-time augmentation's extra forwards, EMA/SWA
        weight swaps) as training time, so they are not free in time to target; a plain evaluation is not.

        Added before the evaluation's metrics are logged, so the row that reaches a target pays its own cost.
        """
        if not self._fit_started or seconds <= 0:
            return
        self._clock.offset += seconds
        self.state.timestamp = self.state.timestamp.with_wall(self.state.timestamp.wall_s + seconds)
        self._add_timing("eval_methods_s", seconds)

    @torch.no_grad()
    def _run_evaluator(self, evaluator: Evaluator) -> dict[str, float]:
        state, engine = self.state, self.engine
        state.current_evaluator = evaluator
        for metric in evaluator.metrics.values():
            metric.reset()
        engine.run_event(Event.EVAL_START)
        seen, last = 0, None
        for index, batch in enumerate(evaluator.dataloader):
            if evaluator.max_batches is not None and index >= evaluator.max_batches:
                break
            self._eval_batch(evaluator, batch)
            seen, last = seen + 1, batch
        if self.parallel == "fsdp":
            # Every FSDP forward gathers shards from all ranks, so a rank whose shard of the eval set ran out
            # repeats its last batch (not counted) until the others are done.
            counts = distributed.all_gather_object(seen)
            if min(counts) == 0 < max(counts):
                raise ValueError(f"evaluator {evaluator.label!r}: some ranks have no evaluation batch "
                                 f"(batches per rank: {counts}); under fsdp each rank needs at least one")
            for _ in range(max(counts) - seen):
                self._eval_batch(evaluator, last, count=False)
            # FSDP2 keeps the root's parameters gathered after a forward without backward: shard them again,
            # so methods that swap weights at EVAL_END (ema) and the next step see DTensors.
            state.model.reshard()
        if self.parallel:  # each rank evaluated its shard: sum the metric states over the ranks
            distributed.reduce_metrics(evaluator.metrics.values())
        values = {name: metric.compute() for name, metric in evaluator.metrics.items()}
        label = "eval" if evaluator.label == "eval" else f"eval/{evaluator.label}"
        state.eval_metrics[label] = values
        engine.run_event(Event.EVAL_END)
        state.current_evaluator = None
        return values

    def _eval_batch(self, evaluator: Evaluator, batch, count: bool = True) -> None:
        state, engine = self.state, self.engine
        state.batch = _to_device(batch, state.device)
        engine.run_event(Event.EVAL_BATCH_START)
        engine.run_event(Event.EVAL_BEFORE_FORWARD)
        with state.autocast():
            state.outputs = state.model(state.batch_inputs())
        engine.run_event(Event.EVAL_AFTER_FORWARD)
        if count:
            for metric in evaluator.metrics.values():
                metric.update(state.outputs.float(), state.batch_targets())
        engine.run_event(Event.EVAL_BATCH_END)

    # -- checkpoints ----------------------------------------------------------------------
    def _checkpoint_payload(self) -> dict:
        state = self.state
        return {
            "model": state.model.state_dict(),
            "optimizers": [opt.state_dict() for opt in state.optimizers],
            "schedulers": [s.state_dict() for s in state.schedulers
                           if isinstance(s, torch.optim.lr_scheduler.LRScheduler)],
            "grad_scaler": state.grad_scaler.state_dict() if state.grad_scaler is not None else None,
            "algorithms": {a.name: a.state_dict() for a in state.algorithms},
            "callbacks": {type(cb).__name__: cb.state_dict() for cb in state.callbacks},
            "timestamp": state.timestamp.to_dict(),
            "rng": rng_state(),
            "record": state.record.to_json(),
            "run_name": self.run_name,
            **({"rng_by_rank": self._rng_by_rank} if self.parallel and self._rng_by_rank else {}),
        }

    def save_checkpoint(self) -> Path:
        """Write ``ba{batch}.ckpt`` and point ``latest.ckpt`` at it, both atomically; keep the newest few.

        Under torchrun only rank 0 writes (DDP: the plain module's weights, so one process can resume
        it); under FSDP every rank writes its shards beside it (``ba{batch}.dcp/``).
        """
        if self.parallel:
            path = self._save_parallel_checkpoint()
            if path is not None:
                return path  # FSDP, or a rank other than 0
        start = time.perf_counter()
        state = self.state
        state.record.timings["train_s"] = round(state.timestamp.wall_s, 4)
        folder = self.checkpoint_folder
        path = save_checkpoint(folder / f"ba{state.timestamp.batch:09d}.ckpt", self._checkpoint_payload())
        self._point_latest_at(path)
        state.record.notes["last_checkpoint"] = str(path)
        state.record.save()
        self._add_timing("checkpoint_s", time.perf_counter() - start)
        return path

    def _point_latest_at(self, path: Path) -> None:
        """Make ``latest.ckpt`` name ``path`` atomically, then drop all but the newest few checkpoints."""
        folder = self.checkpoint_folder
        tmp = folder / f".{LATEST}.link"
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)  # a second name for the same bytes: instant, and atomic with the rename
        except OSError:  # file systems without hard links
            shutil.copyfile(path, tmp)
        os.replace(tmp, folder / LATEST)
        for old in sorted(folder.glob("ba*.ckpt"))[:-self.keep_checkpoints]:
            old.unlink()
            shutil.rmtree(old.with_suffix(".dcp"), ignore_errors=True)  # an FSDP checkpoint's shards

    def _save_parallel_checkpoint(self) -> Path | None:
        """The multi-process part of ``save_checkpoint``: None where rank 0 goes on to write a DDP checkpoint."""
        state = self.state
        path = self.checkpoint_folder / f"ba{state.timestamp.batch:09d}.ckpt"
        # A failed or interrupted run may have lost its other ranks: no collectives then (they would hang).
        alone = state.record.status in ("failed", "interrupted")
        if self.parallel == "ddp":
            self._rng_by_rank = None if alone else distributed.all_gather_object(rng_state())
            if self._average_buffers and not alone:
                distributed.average_buffers(state.model)
            if distributed.is_main():
                return None
            state.record.notes["last_checkpoint"] = str(path)  # where rank 0 wrote it (on a shared file system)
            return path
        if alone:
            self.logger.log_text("fsdp: no checkpoint on a failed or interrupted run (every rank must write "
                                 "its shards); the last checkpoint is kept")
            return path
        from torch.distributed.checkpoint.state_dict import get_state_dict

        start = time.perf_counter()
        state.record.timings["train_s"] = round(state.timestamp.wall_s, 4)
        self._rng_by_rank = distributed.all_gather_object(rng_state())
        payload = self._checkpoint_payload()
        del payload["model"], payload["optimizers"]
        model_sd, optim_sd = get_state_dict(state.model, [getattr(o, "base_optimizer", o) for o in state.optimizers])
        sharded = {"model": model_sd, "optimizers": optim_sd, "algorithms": payload.pop("algorithms"),
                   "callbacks": payload.pop("callbacks")}
        save_sharded_checkpoint(path, payload, sharded)
        state.record.notes["last_checkpoint"] = str(path)
        if distributed.is_main():
            self._point_latest_at(path)
            state.record.save()
        self._add_timing("checkpoint_s", time.perf_counter() - start)
        return path

    def _device_mesh(self):
        """The mesh FSDP sharded the parameters over (None when they are not sharded)."""
        if self.parallel != "fsdp":
            return None
        return next((p.device_mesh for p in self.state.model.parameters() if hasattr(p, "device_mesh")), None)

    def _maybe_resume(self) -> None:
        path = self.load_path
        if path is None and self.autoresume and (self.checkpoint_folder / LATEST).exists():
            path = self.checkpoint_folder / LATEST
        if self.parallel:
            seen = distributed.all_gather_object(path is not None)
            if len(set(seen)) > 1:
                raise CheckpointError(f"ranks disagree on resuming from {self.checkpoint_folder / LATEST}: ranks "
                                      f"{[r for r, s in enumerate(seen) if not s]} do not see it; checkpoints must "
                                      f"be on a file system every rank shares")
        if path is None:
            return
        payload = load_checkpoint(path, map_location=self.state.device)
        if payload.get("sharded") is not None:
            payload = load_sharded_checkpoint(path, payload, mesh=self._device_mesh(),
                                              map_location=self.state.device)
        self._load_payload(payload, path)

    def _load_payload(self, payload: dict, path) -> None:
        state = self.state
        try:
            if payload.get("sharded") is not None:  # model and optimizers keyed by parameter name
                from torch.distributed.checkpoint.state_dict import set_state_dict

                set_state_dict(state.model, [getattr(o, "base_optimizer", o) for o in state.optimizers],
                               model_state_dict=payload["model"], optim_state_dict=payload["optimizers"])
            else:
                state.model.load_state_dict(payload["model"])
                for opt, sd in zip(state.optimizers, payload["optimizers"]):
                    opt.load_state_dict(sd)
            torch_schedulers = [s for s in state.schedulers if isinstance(s, torch.optim.lr_scheduler.LRScheduler)]
            for sched, sd in zip(torch_schedulers, payload["schedulers"]):
                sched.load_state_dict(sd)
            if state.grad_scaler is not None and payload.get("grad_scaler"):
                state.grad_scaler.load_state_dict(payload["grad_scaler"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path} does not fit this model/optimizer ({e}); it was written by a "
                                  f"different configuration") from e
        for algorithm in state.algorithms:
            algorithm.load_state_dict(payload["algorithms"].get(algorithm.name, {}))
        saved_callbacks = payload.get("callbacks", {})
        for callback in state.callbacks:
            if type(callback).__name__ in saved_callbacks:
                callback.load_state_dict(saved_callbacks[type(callback).__name__])
        state.timestamp = Timestamp.from_dict(payload["timestamp"])
        previous = RunRecord.from_dict(json.loads(payload["record"]))
        record = state.record
        record.run_id, record.created = previous.run_id, previous.created
        record.steps, record.evals, record.timings = previous.steps, previous.evals, previous.timings
        record.notes = {**previous.notes, "resumed_from": str(path)}
        state.eval_metrics = {}
        by_rank = payload.get("rng_by_rank")  # written by several ranks: each continues its own stream
        self._resume_rng = by_rank[distributed.rank()] if by_rank and len(by_rank) == self._world else payload["rng"]
        self.logger.log_text(f"resumed from {path} at epoch {state.timestamp.epoch}, batch {state.timestamp.batch}")

    def _end_abnormally(self, status: str, error: str, save: bool) -> None:
        record = self.state.record
        record.status, record.error = status, error
        self._finish(save=save and self.save_checkpoints)

    def _finish(self, save: bool) -> None:
        """Close out a run: final timings, a checkpoint when asked, the record on disk, loggers closed."""
        state = self.state
        self._clock.pause()
        state.record.timings["train_s"] = round(self._clock.elapsed(), 4)
        for cb in state.callbacks:
            if isinstance(cb, ProgressBar):
                cb.close()
        if save and self._fit_started:
            self.save_checkpoint()
        state.record.save()
        if self._log_file is not None:
            self.logger.destinations.remove(self._log_file)
            self._log_file.close()
            self._log_file = None
