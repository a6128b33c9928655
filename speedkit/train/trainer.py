"""The Trainer: a training loop whose every step is a named event that methods can act on.

Reading order: ``__init__`` (parts, INIT), ``fit`` (resume, the epoch loop, clean endings), ``_train_step``
(microbatches, forward, loss, backward, step), ``eval``. The step's and an evaluation's events run through
``speedkit.train.step.Step``, the one sequence every host drives too; training time, evaluation apart, is its
``Stopwatch``'s. Every run writes a RunRecord and, unless told not to, a final checkpoint into its run folder.
Around the loop, each in a room of its own: ``speedkit.train.parts`` (what the Trainer is given, made into
one kind each), ``speedkit.train.step``, ``speedkit.train.checkpoint.Checkpointer``, the parallel plan of
``speedkit.train.parallel``, ``speedkit.train.microbatching``, ``speedkit.train.interrupts``,
``speedkit.train.checks``.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch

from speedkit.core import Callback, Engine, Event, Method, State, Time, TimeUnit, distributed
from speedkit.core.batch import batch_size, batch_tokens, call_model, output_logits, to_device
from speedkit.core.devices import (autocast_factory, make_grad_scaler, resolve_device, resolve_precision, synchronize,
                                   timed, to_host)
from speedkit.core.seeding import epoch_seed, seed_everything
from speedkit.models.pretrained import mark_surgered
from speedkit.record.loggers import InMemoryLogger, JSONLFileLogger
from speedkit.record.metrics import Evaluator, compute_metrics
from speedkit.record.run_folder import free_run_name, run_folder_path
from speedkit.record.runs import RunRecord, environment
from speedkit.train.batches import PartialBatchesEager, iterate_from, loader_length, set_loader_epoch
from speedkit.train.checkpoint import Checkpointer, set_rng_state
from speedkit.train.checks import (check_first_batch, check_first_loss, check_first_outputs, check_schedulers,
                                   check_trainer_arguments, explain_first_batch_error)
from speedkit.train.interrupts import SIGNAL_REASONS, SigtermFlag, StepInterrupts, installed
from speedkit.train.microbatching import Microbatching
from speedkit.train.ownership import FolderOwner
from speedkit.train.parallel import make_plan
from speedkit.train.parts import (close_callbacks, describe_run, follow_schedules, global_batch_size,
                                  is_default_loss, kernel_choice, make_callbacks, make_evaluators, make_logger,
                                  make_loss, make_optimizers, make_record, make_schedules, measure_loader,
                                  plateau_metric, read_device_checks, refuse_optimizer_before_surgery,
                                  refuse_wrapped_before_surgery, step_optimizers, step_plateau_schedulers,
                                  step_torch_schedulers)
from speedkit.train.step import Step, Stopwatch


class Trainer:
    """Train ``model`` on ``train_dataloader`` with speed-up ``methods``.

    Durations (``max_duration``, ``eval_interval``, ``save_interval``) take strings such as ``"3ep"``,
    ``"500ba"``, ``"0.25dur"`` or ``"90s"``. ``optimizers`` is an optimizer, a list of them, or a factory
    ``fn(params) -> optimizer`` (use a factory when methods change the model at INIT).
    ``schedulers`` are speedkit schedules (functions of the fraction done) or torch LR schedulers built on
    ``optimizers``, not both. A torch scheduler steps after every optimizer step; a ``ReduceLROnPlateau`` after
    each evaluation instead, on ``stop_at``'s metric, else the evaluation loss. The groups a method adds (Muon's)
    follow the relative change of your optimizer's learning rate.
    ``stop_at=("eval/accuracy", 0.92)`` ends the run when the target is reached (time to accuracy).
    A recipe's parts come from ``speedkit.tasks.recipe_parts("mild", model)``: ``Trainer(model, data,
    **recipe_parts("mild", model))``.
    Each run lives in ``run_dir/run_name``: ``record.json``, ``log.jsonl`` and ``checkpoints/`` (or
    ``save_folder``), where a final checkpoint is always written unless ``save_checkpoints=False``. A folder
    holding an earlier run is refused unless ``autoresume`` continues it (``extend_duration``: to a longer
    ``max_duration``) or ``overwrite`` replaces it; a second process is refused (``speedkit.record.run_folder``).
    ``loggers`` are ``speedkit.record.loggers.LoggerDestination`` objects or the names ``"tensorboard"``, ``"csv"``,
    ``"mlflow"`` and ``"wandb"``, which write into the folder of that name in the run folder.
    ``microbatch_size="auto"`` starts with the whole batch and halves the microbatch on out-of-memory.
    A SIGTERM during ``fit`` (main thread) stops at the next batch, saves, then exits with code 143.
    Under torchrun (or ``speedkit launch -n N``), ``parallel="auto"`` trains with DDP and ``"fsdp"`` shards the
    model with FSDP2; each rank takes its slice of every global batch (see ``speedkit.train.parallel``).
    """

    _first_batch_checked = False  # the first training step checks the batch against the model, once

    def __init__(self, model: torch.nn.Module, train_dataloader: Iterable | None = None, *,
                 eval_dataloader: Iterable | None = None, evaluators: Sequence[Evaluator] = (),
                 max_duration: str | Time | None = None, optimizers=None, schedulers=None, loss_fn=None,
                 methods: Sequence[Method] | None = None, callbacks: Sequence[Callback] = (), loggers=(),
                 precision: str | None = None, device: str | torch.device = "auto",
                 microbatch_size: int | str | None = None, grad_accum: int = 1,
                 seed: int = 0, deterministic: bool = False,
                 eval_interval: str | Time = "1ep", log_interval: int = 10,
                 run_name: str | None = None, run_dir: str | os.PathLike = "runs",
                 save_folder: str | os.PathLike | None = None, save_interval: str | Time | None = None,
                 save_checkpoints: bool = True, keep_checkpoints: int = 3,
                 load_path: str | os.PathLike | None = None, autoresume: bool = False, overwrite: bool = False,
                 extend_duration: bool = False,
                 stop_at: tuple[str, float] | dict | None = None, nan_policy: str | None = "stop",
                 schedule_scale: float = 1.0, progress_bar: bool | str = "auto", console: bool = False,
                 config: dict | None = None, parallel: str | None = "auto"):
        # Every argument checked first (speedkit.train.checks); a refusal names the argument and what it expects.
        check_trainer_arguments({name: value for name, value in locals().items() if name != "self"})
        max_duration = Time.from_input(max_duration or "1ep")
        precision = precision or "fp32"
        self.deterministic = deterministic  # deterministic kernels while it fits and evaluates, not after
        seed_everything(seed)

        # Several processes (torchrun): the plan opens the process group and takes this rank's device.
        self.plan = plan = make_plan(parallel, resolve_device(device), microbatch_size)
        self.parallel = plan.name  # "ddp" or "fsdp" under torchrun, else None
        device = plan.device
        resolved_precision = plan.agree_on_precision(resolve_precision(precision, device))
        self.microbatching = Microbatching(microbatch_size, grad_accum)
        given_name = run_name is not None
        run_name = run_name or free_run_name(run_dir, f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        self.run_name = plan.agree_on_run_name(run_name, given_name)  # one run folder for all ranks
        self.run_folder = run_folder_path(run_dir, self.run_name)
        self.save_checkpoints = save_checkpoints
        self.load_path, self.autoresume = load_path, autoresume

        record = make_record(self.run_folder, self.run_name, writes=distributed.is_main())
        self.state = state = State(
            model=model.to(device), loss_fn=make_loss(model, loss_fn, methods or ()), max_duration=max_duration,
            device=device, precision=resolved_precision, seed=seed, methods=list(methods or ()),
            train_dataloader=train_dataloader, record=record, schedule_scale=float(schedule_scale),
            log_every=log_interval, autocast=autocast_factory(resolved_precision, device),
            grad_scaler=make_grad_scaler(resolved_precision, device))
        state.evaluators = make_evaluators(model, eval_dataloader, evaluators, eval_interval)
        state.callbacks = make_callbacks(callbacks, stop_at=stop_at, nan_policy=nan_policy,
                                         progress_bar=progress_bar if distributed.is_main() else False,
                                         save=(lambda: self._paused(self.checkpointer.save)) if save_checkpoints else None,
                                         save_interval=save_interval)

        self.memory_logger = InMemoryLogger()
        self.logger = make_logger(state, [self.memory_logger, *loggers], console=console and distributed.is_main(),
                                  run_folder=self.run_folder, writes=distributed.is_main())
        self.engine = Engine(state, self.logger)
        self.stopwatch = Stopwatch(state, self.logger, self.engine.seconds_at)  # training time, eval apart
        self.step = Step(state, self.engine.run_event, world=plan.world, stopwatch=self.stopwatch)
        self._log_file: JSONLFileLogger | None = None
        self.checkpointer = Checkpointer(save_folder, state, self.logger, plan, self.microbatching,
                                         run_name=self.run_name, run_folder=self.run_folder, keep=keep_checkpoints)

        # Methods that change the model act now, before optimizers are built on its parameters.
        refuse_wrapped_before_surgery(state.model, state.methods, "pass the model itself: under torchrun the "
                                      "Trainer wraps it after the surgery (parallel='auto' for DDP, 'fsdp')")
        before_surgery = list(state.model.parameters())
        self.engine.run_event(Event.INIT)
        mark_surgered(state.model, state.methods)  # a Hugging Face model's save_pretrained records the surgeries
        # After the surgery, before the optimizers (FSDP replaces the parameters): the module the forward runs.
        self._train_module = plan.wrap(state.model, state.methods, state.grad_scaler)
        state.optimizers = make_optimizers(optimizers, state.model)
        refuse_optimizer_before_surgery(before_surgery, state.model, state.optimizers, state.methods,
                                        "pass optimizers= a function of the parameters (optimizers=lambda params: "
                                        "torch.optim.SGD(params, lr=...)), which the Trainer calls after the surgery")
        del before_surgery  # the parameters a surgery replaced are freed
        state.schedulers = make_schedules(schedulers)
        check_schedulers(state.schedulers, state.optimizers)
        self._plateau_metric = plateau_metric(state.schedulers, state.evaluators, stop_at)
        # The optimizers the user's schedulers were built on, before a method splits them (Muon) at FIT_START.
        self._given_optimizers = list(state.optimizers)
        self._follow = None
        record.config = describe_run(state, precision=precision, eval_interval=eval_interval,
                                     microbatch_size=microbatch_size, grad_accum=grad_accum,
                                     deterministic=deterministic, extra=config)
        record.config.update(plan.config(state.model, global_batch_size(train_dataloader, plan.world)))
        record.methods = [{"name": a.name, "params": dict(a.params)} for a in state.methods]
        record.environment = environment(device)
        self.owner = FolderOwner(self.run_folder, self.checkpointer, record, max_duration,  # refuses a taken folder
                                 autoresume=autoresume or load_path is not None,  # load_path there: continue it
                                 overwrite=overwrite, extend_duration=extend_duration)
        self.sigterm, self.interrupts, self._partial_batches = SigtermFlag(), StepInterrupts(), PartialBatchesEager()
        self._resume_rng: dict | None = None
        self._fit_started = False
        self._run_logged = False  # loggers heard of the run's start, so they hear of its end

    # -- public API -----------------------------------------------------------------------
    @property
    def record(self) -> RunRecord:
        return self.state.record

    @property
    def microbatch_size(self) -> int | None:
        """Samples per microbatch (None: the whole batch); ``"auto"`` runs settle on one when memory runs out."""
        return self.microbatching.size

    def stop(self, reason: str = "stopped") -> None:
        """End the run at the next batch boundary, with a checkpoint and a complete record. Thread-safe."""
        self.state.request_stop(reason)

    def save_checkpoint(self) -> Path:
        """Write ``ba{batch}.ckpt`` and point ``latest.ckpt`` at it (see ``speedkit.train.checkpoint.Checkpointer``)."""
        self.stopwatch.checkpointed()  # the checkpoint's record has its training time too
        return self.checkpointer.save()

    def fit(self) -> RunRecord:
        """Train to ``max_duration`` (or a stop); returns the RunRecord, also saved as ``record.json``.

        Every ending leaves a complete record: ``completed``/``stopped``/``target_reached`` with a final
        checkpoint; ``interrupted`` (KeyboardInterrupt) with a checkpoint; ``terminated`` (SIGTERM) with a
        checkpoint, then ``SystemExit(143)``; ``failed`` with the error, the last checkpoint left untouched.
        """
        if self.state.train_dataloader is None:
            raise ValueError("Trainer.fit needs train_dataloader")
        self.owner.begin()  # the folder's lock, held until the run ends (speedkit.train.ownership)
        if self.owner.finished:  # autoresume of a run that had ended: nothing to train, its record as it was
            self.state.record = self.owner.already_finished(self.state.record)
            return self.state.record
        kernels = kernel_choice(self.deterministic, self.state.device)  # as the handlers: for this fit only
        with installed(self.sigterm, self.interrupts), contextlib.closing(self.owner), kernels:
            try:
                self._fit_start()
                while not self._should_end():
                    self._run_epoch()
                self._end_normally()
            except KeyboardInterrupt:
                self._end_abnormally("interrupted", "KeyboardInterrupt", save=self.interrupts.may_save(self.logger))
                raise
            except BaseException as e:
                self._end_abnormally("failed", f"{type(e).__name__}: {e}", save=False)
                raise
        if self.sigterm.received:
            self.sigterm.exit_after_saving()  # the previous handler, or SystemExit(143)
        return self.state.record

    # -- fit: start, loop, end ------------------------------------------------------------
    def _fit_start(self) -> None:
        state = self.state
        self._measure_loader()
        if distributed.is_main():  # the run folder's files are rank 0's to write
            self.run_folder.mkdir(parents=True, exist_ok=True)
            self._log_file = JSONLFileLogger(self.run_folder / "log.jsonl")
            self.logger.destinations.append(self._log_file)
        state.record.status = "running"
        self.logger.log_run_start(state.record)  # config, methods and target are final by now
        self._run_logged = True
        # Methods may rebuild optimizers, wrap modules or replace the loader at FIT_START; resuming after
        # it loads the checkpoint into the same structure it was saved from.
        fit_start_s = self._run_fit_start()
        self._measure_loader()
        self._resume_rng = self.checkpointer.resume(self.load_path, self.autoresume)
        if self._follow is None:  # after the resume, which brings back the followers' base rates
            self._follow = follow_schedules(state, self._given_optimizers)
        self.owner.after_resume(state.timestamp, self.logger, self.checkpointer.resumed_from)
        # What methods did at FIT_START (patch whitening's fit on data, optimizer wrapping) is training time;
        # a resumed run's clock continues from its checkpoint's instead.
        self.stopwatch.fit_started(fit_start_s)
        for ev in state.evaluators:
            ev.schedule.start(state)
        state.record.save()
        self._fit_started = True
        if self.autoresume:
            self.checkpointer.remove_partial_writes()

    def _run_fit_start(self) -> float:
        """FIT_START; returns the seconds the methods spent in it. Callbacks' own set-up there (the speed
        monitor measuring the matmul peak, once per process) is measurement, not training."""
        before = self.engine.seconds_at((Event.FIT_START,))
        self.engine.run_event(Event.FIT_START)
        method_s = self.engine.seconds_at((Event.FIT_START,)) - before
        return method_s + timed(lambda: self.plan.after_fit_start(self.state.model), self.state.device)

    def _measure_loader(self) -> None:
        """Nominal epoch length and batch size (all ranks together), which convert between time units."""
        measure_loader(self.state, self.plan.world)
        self.microbatching.settle(self.state.samples_per_batch, self.plan.world)

    def _should_end(self) -> bool:
        state = self.state
        if self.sigterm.received and not state.stop_requested:
            state.request_stop(self.sigterm.reason)  # SIGTERM, or SIGHUP handled as it
        if state.max_duration.unit is TimeUnit.SECOND:
            self.stopwatch.stamp()
        return self.plan.agree_to_end(state, state.stop_requested or state.is_done())

    def _end_normally(self) -> None:
        state, record = self.state, self.state.record
        if state.stop_reason in SIGNAL_REASONS:
            # Suspended, not ended: no final evaluation (the grace period before SIGKILL is short) and no
            # FIT_END (averaging methods would swap their weights in), so the checkpoint resumes exactly.
            record.status = "terminated"
            self.logger.log_text(f"{state.stop_reason}: stopped after batch {state.timestamp.batch}; saving a "
                                 f"checkpoint and the record, then exiting with code {self.sigterm.exit_code}")
        else:
            self._final_eval()
            record.status = {"target_reached": "target_reached", None: "completed"}.get(state.stop_reason, "stopped")
        record.stop_reason = state.stop_reason
        read_device_checks(self.state, self.logger)  # before FIT_END and the final checkpoint
        if record.status != "terminated":
            self.engine.run_event(Event.FIT_END)
        self._finish(save=self.save_checkpoints)  # inside: a failed final save marks the run failed

    def _set_epoch(self, epoch: int) -> None:
        """Make each epoch's shuffling and augmentation a function of (seed, epoch), so resume is exact."""
        # Per rank (rank 0: the one-process stream), so ranks do not draw the same per-sample randomness.
        seed_everything(distributed.rank_seed(epoch_seed(self.state.seed, epoch)))
        set_loader_epoch(self.state.train_dataloader, epoch)

    def _epoch_complete(self) -> bool:
        per_epoch = self.state.batches_per_epoch
        return per_epoch is not None and self.state.timestamp.batch_in_epoch >= per_epoch

    def _run_epoch(self) -> None:
        state, engine, step = self.state, self.engine, self.step
        resuming_mid_epoch = state.timestamp.batch_in_epoch > 0
        self.stopwatch.start()  # starting the loader's iterator (worker processes) is training time too
        self._set_epoch(state.timestamp.epoch)
        iterator = iterate_from(state.train_dataloader, state.timestamp.batch_in_epoch)
        if self._resume_rng is not None:
            set_rng_state(self._resume_rng)
            self._resume_rng = None
        if not resuming_mid_epoch:
            step.epoch_start()
        while not self._epoch_complete():
            if self._should_end():
                return  # stopped or out of budget mid-epoch: no epoch end
            step.before_dataloader()
            try:
                with self.stopwatch.taking_data():
                    batch = next(iterator)
            except StopIteration:
                break
            with self._partial_batches.around(batch, state.timestamp.batch_in_epoch, state.batches_per_epoch):
                step.after_dataloader(to_device(batch, state.device))
                if not self._first_batch_checked:
                    check_first_batch(state, batch_tokens(state.batch))
                with self.interrupts.step(state):  # a Ctrl-C waits for the batch's end (speedkit/train/interrupts.py)
                    self._train_step()
                    step.end()  # BATCH_END
            self._maybe_eval(at_epoch_end=False)
            engine.run_event(Event.BATCH_CHECKPOINT)  # a save pauses the clock itself: no wait when none is due
        if state.timestamp.batch_in_epoch == 0:  # looping over empty epochs would never reach max_duration
            raise ValueError(f"train_dataloader yielded no batches in epoch {state.timestamp.epoch}; a loader "
                             f"must yield batches every epoch (a generator is used up after one pass)")
        step.epoch_end()  # the clock's epoch, then EPOCH_END
        self._maybe_eval(at_epoch_end=True)
        engine.run_event(Event.EPOCH_CHECKPOINT)

    # -- one optimizer step ---------------------------------------------------------------
    def _train_step(self) -> None:
        """One optimizer step on ``state.batch``: forward, loss and backward per microbatch, then the step.
        Each ``step.`` call runs its events (``speedkit.train.step``); the work between them is the Trainer's."""
        state, step = self.state, self.step
        step.begin()  # schedules for the fraction done, BATCH_START
        full_batch = state.batch
        forward_backward = functools.partial(self._forward_backward, full_batch)
        step_loss, microbatches = self.microbatching.run(forward_backward, state, self.logger)
        if not state.skip_step:
            # Optimizers that evaluate the loss again (SAM) re-run forward, loss and backward, events included.
            step_optimizers(state, closure=lambda: forward_backward(microbatches))
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        step.after_optimizer()  # AFTER_TRAIN_BATCH
        step_torch_schedulers(state, self._follow)
        step_loss = self.plan.after_step(state.model, step_loss)  # e.g. averaged over ranks
        step.count(full_batch)  # the clock: the batch's samples and tokens on every rank, the training seconds
        self._log_loss(step_loss)

    def _log_loss(self, step_loss: torch.Tensor) -> None:
        """Log the step's loss every ``log_interval`` batches."""
        state = self.state
        if state.timestamp.batch % state.log_every == 0 or state.is_done():
            state.last_train_loss = to_host(step_loss)  # the step's one wait, at the logging interval only
            self.logger.log_metrics({"loss": state.last_train_loss})

    def _forward_backward(self, full_batch, microbatches) -> torch.Tensor:
        """Gradients of the whole batch, one microbatch at a time; returns the batch's mean loss."""
        state = self.state
        total = batch_size(full_batch)
        step_loss = None
        for index, microbatch in enumerate(microbatches):
            state.batch, state.microbatch_index, weight = microbatch, index, batch_size(microbatch) / total
            with self.plan.gradient_sync(self._train_module, last=index == len(microbatches) - 1):
                loss = _weighted(self._train_microbatch(weight), weight)
            step_loss = loss if step_loss is None else step_loss + loss
        state.batch = full_batch
        return step_loss

    def _train_microbatch(self, weight: float) -> torch.Tensor:
        state, step = self.state, self.step
        checked = self._first_batch_checked  # until the first step is through, failures name batch and model
        step.before_forward()
        with self._explained("forward", checked), state.autocast():
            outputs = call_model(self._train_module, state.batch)
        step.after_forward(outputs)
        if not checked:
            check_first_outputs(state, default_loss=is_default_loss(state.loss_fn))
        step.loss(self._loss)  # BEFORE_LOSS, the loss, AFTER_LOSS
        step.before_backward()
        if not state.skip_step:
            scaled = _weighted(state.loss, weight)
            if state.grad_scaler is not None:
                scaled = state.grad_scaler.scale(scaled)
            with self._explained("backward", checked):
                scaled.backward()
        step.after_backward()
        self._first_batch_checked = True
        return state.loss.detach().float()

    def _loss(self, outputs, batch) -> torch.Tensor:
        """The loss function under autocast; on the first step, its failures explained and its result checked."""
        state, checked = self.state, self._first_batch_checked
        with self._explained("loss", checked), state.autocast():
            loss = state.loss_fn(outputs, batch)
        if not checked:
            check_first_loss(state, loss)
        return loss

    @contextlib.contextmanager
    def _explained(self, stage: str, checked: bool):
        """Until the first step is through, an error in ``stage`` is raised again naming the batch and model."""
        try:
            yield
        except Exception as error:
            if not checked:
                explain_first_batch_error(self.state, stage, error)  # returns for out-of-memory errors
            raise

    # -- evaluation -----------------------------------------------------------------------
    def _paused(self, fn, *args):
        """Run ``fn`` with the clock stopped (evaluating and saving are not training), after the on-device checks."""
        read_device_checks(self.state, self.logger)
        synchronize(self.state.device)
        with self.stopwatch.paused():
            return self.interrupts.held(self.state, fn, *args)  # a Ctrl-C waits (EMA swapped back after an eval)

    def _maybe_eval(self, at_epoch_end: bool) -> None:
        due = [ev for ev in self.state.evaluators if ev.schedule.due(self.state, at_epoch_end)]
        if due:
            self._paused(self.eval, due)
            step_plateau_schedulers(self.state, self._plateau_metric, due, self._follow)

    def _final_eval(self) -> None:
        """Make sure the record ends with metrics for the final weights."""
        evals = self.state.record.evals
        if self.state.evaluators and (not evals or evals[-1]["batch"] != self.state.timestamp.batch):
            self._paused(self.eval)

    def eval(self, evaluators: Sequence[Evaluator] | None = None) -> dict[str, dict[str, float]]:
        """Evaluate the current model; returns and logs ``{label: {metric: value}}``."""
        state = self.state
        evaluators = state.evaluators if evaluators is None else evaluators
        started = self.stopwatch.eval_started()
        self.plan.before_eval(state.model)
        was_training = state.model.training
        state.model.eval()
        results = {}
        # Evaluation must not shift training's random stream (DataLoader iterators draw a seed), or how
        # often one evaluates would change the run; fork_rng restores the generators afterwards.
        devices = [state.device] if state.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), kernel_choice(self.deterministic, state.device):
                for evaluator in evaluators:
                    results[evaluator.label] = self._run_evaluator(evaluator)
        finally:
            state.model.train(was_training)
        # What methods added to it is training time, counted before the metrics are logged (time to target).
        eval_s = self.stopwatch.eval_ended(started, training=self._fit_started)
        logged = {f"{'eval' if label == 'eval' else 'eval/' + label}/{name}": value
                  for label, metrics in results.items() for name, value in metrics.items()}
        self.logger.log_metrics({**logged, "eval_s": round(eval_s, 4)})
        state.record.final_metrics = logged
        if self._fit_started:
            state.record.save()
        return results

    @torch.no_grad()
    def _run_evaluator(self, evaluator: Evaluator) -> dict[str, float]:
        state = self.state
        state.current_evaluator = evaluator
        for metric in evaluator.metrics.values():
            metric.reset()
        self.step.eval_start()
        seen, last, partial_batches, batches = 0, None, PartialBatchesEager(), loader_length(evaluator.dataloader)
        for index, batch in enumerate(evaluator.dataloader):
            if evaluator.max_batches is not None and index >= evaluator.max_batches:
                break
            with partial_batches.around(batch, index, batches):
                self._eval_batch(evaluator, batch)
            seen, last = seen + 1, batch
        # Under several processes: pad to the ranks' longest shard (FSDP) and sum the metrics over ranks.
        repeat_last = functools.partial(self._eval_batch, evaluator, last, count=False)
        self.plan.finish_evaluator(state.model, evaluator, seen, repeat_last)
        values = compute_metrics(evaluator.metrics)  # one read of every metric's device state
        label = "eval" if evaluator.label == "eval" else f"eval/{evaluator.label}"
        state.eval_metrics[label] = values
        self.step.eval_end()
        state.current_evaluator = None
        return values

    def _eval_batch(self, evaluator: Evaluator, batch, count: bool = True) -> None:
        state, step = self.state, self.step
        batch = step.eval_batch(to_device(batch, state.device))
        with state.autocast():
            outputs = call_model(state.model, batch)
        outputs = step.eval_outputs(outputs)
        if count:
            for metric in evaluator.metrics.values():
                metric.update(output_logits(outputs).float(), state.batch_targets())
        step.eval_batch_end()

    # -- endings --------------------------------------------------------------------------
    def _end_abnormally(self, status: str, error: str, save: bool) -> None:
        self.state.record.status, self.state.record.error = status, error
        self._finish(save=save and self.save_checkpoints)

    def _finish(self, save: bool) -> None:
        """Close out a run: final timings, a checkpoint when asked, the record on disk, loggers closed."""
        state = self.state
        self.stopwatch.stop()  # train_s; a final save() sets the checkpoint's own
        close_callbacks(state)
        if not self.owner.keeps_earlier_run:  # else a resume failed before loading: the earlier run stays as it was
            if save and self._fit_started:
                self.save_checkpoint()
            state.record.save()
        if self._run_logged:
            self._run_logged = False  # once, even if a logger fails here and the run ends again as failed
            self.logger.log_run_end(state.record)
        if self._log_file is not None:
            self.logger.destinations.remove(self._log_file)
            self._log_file.close()
            self._log_file = None


def _weighted(loss: torch.Tensor, weight: float) -> torch.Tensor:
    """``loss * weight``, without the multiplication (a tensor op, and a node in the backward graph) in the
    common case of one microbatch a step, where the weight is 1."""
    return loss if weight == 1.0 else loss * weight
