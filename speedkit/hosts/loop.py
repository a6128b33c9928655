"""speedkit's methods in a hand-written PyTorch loop, or an Accelerate script: a few marked calls.

::

    from speedkit.hosts import Speedkit
    from speedkit.methods import EMA, LabelSmoothing, Muon

    sk = Speedkit([EMA(), LabelSmoothing(0.1), Muon()], max_duration="3ep", train_dataloader=loader)
    model = sk.prepare_model(model)                                        # speedkit: surgery (INIT)
    optimizer = sk.prepare_optimizer(torch.optim.AdamW(model.parameters()))  # speedkit: Muon, Lookahead, ...
    # with Accelerate: model, optimizer, loader = accelerator.prepare(model, optimizer, loader) here
    while not sk.done:
        for batch in loader:
            batch = sk.batch(batch)                                        # speedkit: batch methods
            loss = sk.loss(model(batch[0]), batch)                         # speedkit: label and loss methods
            sk.backward(loss)                                              # or sk.backward(loss, accelerator.backward)
            optimizer.step()
            optimizer.zero_grad()
            sk.step_end()                                                  # speedkit: EMA, schedules, the clock
            if sk.done:
                break
        with sk.evaluating():                                              # speedkit: EMA's weights in
            evaluate(model)
    sk.finish()                                                            # speedkit: final weights (EMA)

The same Method objects, cards, order and conflict checks as ``speedkit.Trainer``. Epochs follow from
``train_dataloader``'s length (or ``batches_per_epoch=``); with Accelerate an epoch is each process's share of it.
Your own LR scheduler, of any class torch ships, built on ``optimizer`` before ``sk.prepare_optimizer``: the groups
a method adds (Muon's) follow its lr's relative change. Method state goes into your checkpoint with
``sk.state_dict()`` and comes back with ``sk.load_state_dict(...)``. A method whose events your step did not reach
(a missing ``sk.loss`` call, say) is refused after the first step, with the call to add; a second model given to
one session's ``sk.prepare_model`` (its surgery ran on the first alone), or a second optimizer to its
``sk.prepare_optimizer`` (it returned the first), there; a model wrapped in DDP or FSDP before ``sk.prepare_model``
(a parameter a surgery added would never be averaged across processes) there; an optimizer built before
``sk.prepare_model`` (which would never train what a surgery added) at ``sk.prepare_optimizer``; a step that no
``sk.step_end()`` ended, at the next step's ``sk.batch`` or ``sk.backward`` (or at ``sk.finish()``); a step that
stepped the optimizer given to ``sk.prepare_optimizer`` instead of the one it returned, or stepped it more often
than ``sk.step_end()`` counts, or closed with no optimizer step and the gradients kept (accumulating without
``accumulation=k``), or, with it, a loss divided by k before ``sk.backward``, which divides it itself, or
gradients zeroed between the batches of one step; ``sk.batch`` inside ``with sk.evaluating():``; a forward
given the inputs from before ``sk.batch`` replaced them (mixup, resizing), at the first such forward of an
uncompiled model; beside a method that changes the labels, a loss the model computed itself from the labels it
was given (it never saw the changed ones); a step begun after ``max_duration``; a first step whose optimizer
trained before while speedkit's clock is at its start (a resume that restored the model and optimizer but not
``sk.load_state_dict``); a ``sk.load_state_dict`` from a run of another length (schedules would jump); a GradScaler
stepping the optimizer that speedkit was not given (``grad_scaler=``), where gradient clipping acted on the scaled
gradients; ``sk.state_dict()`` inside ``with sk.evaluating():`` where EMA's average is in the model; beside EMA, an
evaluation forward (eval mode, gradients off) outside ``with sk.evaluating():`` before ``sk.finish()``; and, with
``schedules=``, a step without ``sk.batch`` (where the schedule is set) or a learning rate something else changed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Callable, Iterable, Sequence

import torch

from speedkit.core import Event, Method, Time, TimeUnit
from speedkit.hosts._checks import check_evaluation_served
from speedkit.hosts._optimizers import (StepScaler, as_one_optimizer, follow_user_schedule, gradients_kept,
                                        refuse_two_schedules)
from speedkit.hosts.session import Host, HostCannotServeError, MethodSession
from speedkit.record.loggers import LoggerDestination

_STEP_CALLS = {  # event -> the call in the user's step that runs it
    Event.AFTER_DATALOADER: "batch = sk.batch(batch)", Event.BATCH_START: "batch = sk.batch(batch)",
    Event.BEFORE_FORWARD: "batch = sk.batch(batch)", Event.AFTER_FORWARD: "loss = sk.loss(outputs, batch)",
    Event.BEFORE_LOSS: "loss = sk.loss(outputs, batch)", Event.AFTER_LOSS: "loss = sk.loss(outputs, batch)",
    Event.BEFORE_BACKWARD: "sk.backward(loss)", Event.AFTER_BACKWARD: "sk.backward(loss)",
    Event.AFTER_TRAIN_BATCH: "sk.step_end()", Event.BATCH_END: "sk.step_end()",
}

LOOP = Host(
    name="a plain PyTorch loop",
    serves={**{event: f"the step's {call}" for event, call in _STEP_CALLS.items()},
            Event.INIT: "sk.prepare_model(model)", Event.FIT_START: "sk.prepare_optimizer(optimizer)",
            Event.EPOCH_START: "the first sk.batch of an epoch", Event.EPOCH_END: "the epoch's last sk.step_end()",
            Event.EVAL_START: "with sk.evaluating():", Event.EVAL_END: "with sk.evaluating():",
            Event.EVAL_BATCH_START: "batch = sk.eval_batch(batch)", Event.EVAL_BEFORE_FORWARD: "batch = sk.eval_batch(batch)",
            Event.EVAL_AFTER_FORWARD: "outputs = sk.eval_outputs(outputs)",
            Event.EVAL_BATCH_END: "outputs = sk.eval_outputs(outputs)", Event.FIT_END: "sk.finish()"},
    stage_fixes={"data": "remove it, or train with speedkit.Trainer, whose loader methods can act on",
                 "precision": "remove it and wrap your forward in torch.autocast(device_type, dtype=torch.bfloat16) "
                              "(Accelerate: Accelerator(mixed_precision='bf16'))"},
)


class Speedkit:
    """speedkit's methods in your own loop (see the module's docstring for the calls and where they go).

    ``max_duration`` (``"2000ba"``, ``"3ep"``, ``"1Mtok"``) is the run's length: schedules (progressive
    resizing, sequence-length warmup, EMA half-lives in ``dur``, ``schedules=``) are fractions of it.
    ``schedules`` are speedkit schedules (``"cosine"``, ``{"name": "linear_to_zero", "warmup": "0.05dur"}``)
    applied to the optimizers each step. ``loss_fn`` is the default criterion ``fn(logits, targets)`` of
    :meth:`loss` (cross-entropy, or a Hugging Face model's own loss). ``accelerator`` (Accelerate) counts
    samples over all processes and does the backward. ``train_dataloader`` may be given before
    ``accelerator.prepare``: an epoch is then each process's share of it as prepare splits it, checked at the
    first batch against the loader the process iterates (a loader accelerate did not prepare is refused there;
    pass ``batches_per_epoch=`` for one that shards itself).
    ``accumulation=k`` (or Accelerate's ``Accelerator(gradient_accumulation_steps=k)``, read from it): an
    optimizer step every k batches, as ``speedkit.Trainer(grad_accum=k)``: call ``sk.batch``, ``sk.loss``,
    ``sk.backward`` (which divides the loss by the step's batches; Accelerate's backward does it itself) and
    ``sk.step_end()`` on every batch, and step the optimizer when :attr:`step_due` (with Accelerate, inside
    ``with accelerator.accumulate(model):``, its prepared optimizer does so itself). Schedules, EMA, gradient
    clipping, the clock and ``ba``/``ep``/``sp`` durations count optimizer steps. ``grad_scaler``: your fp16
    loss scaler (``torch.amp.GradScaler``; Accelerate's ``accelerator.scaler`` is taken by itself), which the
    methods that act on gradients at ``sk.backward`` (gradient clipping) unscale them with first; one stepping the
    optimizer that speedkit was not given is refused at the first step. ``warm_optimizer=True``: the
    optimizer has trained before, on purpose, and speedkit's run starts at its beginning all the same (without
    it, such an optimizer at the first step is taken for a resume that forgot ``sk.load_state_dict``, and refused).
    """

    def __init__(self, methods: Iterable[Method] = (), *, max_duration: str | Time,
                 train_dataloader=None, batches_per_epoch: int | None = None, schedules=None,
                 loss_fn: Callable | None = None, accelerator=None, seed: int = 0,
                 loggers: Sequence[LoggerDestination] = (), accumulation: int | None = None,
                 warm_optimizer: bool = False, grad_scaler=None):
        self.accelerator = accelerator
        self.world = int(getattr(accelerator, "num_processes", 1) or 1)
        self.accumulation = _accumulation(accumulation, accelerator)
        share = _share(train_dataloader, accelerator)
        # An epoch is each process's share of the loader; one speedkit counted before accelerator.prepare split
        # it is checked against the loader the process iterates, at the first batch of an epoch.
        self._share_to_check = share if batches_per_epoch is None and share.counted_before_prepare else None
        per_epoch = batches_per_epoch if batches_per_epoch is not None else share.batches
        self._loader_batches, k = per_epoch, self.accumulation  # the clock counts optimizer steps of k batches
        self.session = MethodSession(LOOP, methods, max_duration=max_duration,
                                     batches_per_epoch=-(-per_epoch // k) if per_epoch else per_epoch,
                                     samples_per_batch=share.samples * k if share.samples else None,
                                     tokens_per_batch=getattr(train_dataloader, "tokens_per_batch", None),
                                     schedules=schedules, loss_fn=loss_fn, seed=seed, loggers=loggers)
        self.session.world = self.world  # the clock counts the samples of every process
        # fp16 loss scaling: the methods that act on gradients unscale them first (Accelerate's scaler by itself)
        self._grad_scaler = grad_scaler if grad_scaler is not None else getattr(accelerator, "scaler", None)
        self._scaler_checked = self._grad_scaler is not None
        if self.state.max_duration.unit is TimeUnit.EPOCH and not per_epoch:
            # The loop's epochs end by count: without a length, "2ep" would end after two batches.
            raise ValueError(f"max_duration={str(self.state.max_duration)!r} counts epochs, but speedkit cannot tell "
                             f"how many batches an epoch has (train_dataloader has no len()): pass "
                             f"batches_per_epoch= (each process's batches an epoch), or max_duration in ba")
        self.train_dataloader = train_dataloader
        self._steps_checked = False
        self._open_calls: set[str] = set()  # the step calls made since the last sk.step_end()
        self._schedules = schedules
        self._eval_checked = False
        self._follow = None  # Muon's groups following a scheduler built before prepare_optimizer
        self._step_counts: dict = {}  # optimizer -> its step() calls since the last sk.step_end()
        self._given_optimizers: list | None = None  # what sk.prepare_optimizer was given, once it took them
        self._lrs_set = None  # the learning rates speedkit's schedules set, as its last call left them
        # an optimizer that trained before speedkit's clock started is a resume without sk.load_state_dict, unless
        # the user says it is a warm start (checked at the first batch: optimizer state may be loaded until then)
        self._fresh_start_checked = warm_optimizer
        self._evaluating = False  # inside `with sk.evaluating():`, where an average may be swapped into the model
        # sk.loss's loss, until the first accumulated sk.backward has compared the loss it was given with it
        self._loss_given, self._loss_checked = None, False
        self._zeroing_checked = False  # the first accumulated step's gradients kept between its batches
        self._eval_hook = None  # with EMA, refuses an evaluation forward outside `with sk.evaluating():`

    @property
    def state(self):
        """The speedkit State the methods act on (timestamp, model, optimizers, record of surgeries)."""
        return self.session.state

    @property
    def methods(self) -> list[Method]:
        """The methods in the order they run (from their cards)."""
        return self.session.methods

    @property
    def done(self) -> bool:
        """Whether the run has reached ``max_duration``."""
        return self.session.is_done()

    # -- before training -------------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Run the model surgeries (INIT) on ``model``, in place; call before building the optimizer."""
        return self.session.init(model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer):
        """FIT_START: optimizer methods act on ``optimizer`` (Muon takes the hidden matrices, Lookahead wraps).

        Returns the optimizer to step from now on: ``optimizer`` itself, or an OptimizerGroup when a method
        added one (step and zero_grad it as usual; its state_dict holds every member's)."""
        given = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        self._refuse_another_optimizer(given)
        refuse_two_schedules(given, self._schedules, "this loop",
                             "remove Speedkit(schedules=...) and keep your scheduler (speedkit's Muon group follows "
                             "it), or drop your scheduler")
        optimizers = self.session.fit_start(optimizer, self.train_dataloader)
        self._given_optimizers = given
        # A scheduler built on `optimizer` before this call cannot reach the groups a method added (Muon's); they
        # follow its lr's relative change. speedkit's own schedules set every group, Muon's included.
        self._follow = None if self._schedules else follow_user_schedule(given, optimizers)
        self._count_steps([*given, *optimizers])
        self._watch_evaluations()
        stepped = as_one_optimizer(optimizers)
        if self._grad_scaler is not None:  # what `scaler.step(optimizer)` steps: the one returned here
            self.session.state.grad_scaler = StepScaler(self._grad_scaler, stepped)
        return stepped

    def _refuse_another_optimizer(self, given: list) -> None:
        """A second sk.prepare_optimizer with other optimizers (a notebook cell run again with another learning
        rate): the session's methods hold the first ones, and it returned them again, so the new settings were
        never trained with. The same optimizers again are taken."""
        if self._given_optimizers is not None and [id(o) for o in given] != [id(o) for o in self._given_optimizers]:
            raise HostCannotServeError("this speedkit session already prepared other optimizers, which its methods "
                                       "(and the optimizer it returned) hold on to: the ones given now would never "
                                       "step; build Speedkit(...) again, then prepare the model and the new "
                                       "optimizer with it (in a notebook, in one cell)")

    def _count_steps(self, optimizers) -> None:
        """Count each optimizer's step() calls (the user's and those the methods made of them), so that
        ``step_end`` can tell a step that skipped one of them: stepping the optimizer given to prepare_optimizer
        instead of the one it returned leaves Muon's matrices, or Lookahead's slow weights, untrained."""
        for optimizer in optimizers:
            if isinstance(optimizer, torch.optim.Optimizer) and optimizer not in self._step_counts:
                self._step_counts[optimizer] = 0
                optimizer.register_step_post_hook(self._count_step)
                optimizer.register_step_pre_hook(self._check_grad_scaler)

    def _count_step(self, optimizer, *_) -> None:
        self._step_counts[optimizer] += 1

    def _check_grad_scaler(self, *_) -> None:
        """Before the first optimizer step: refuse a GradScaler speedkit was not given where a method acted on the
        gradients at sk.backward (gradient clipping), since it acted on them scaled (by 65536 by default): it
        clipped them to its threshold over the scale, and training all but stopped. The scaler is found on the
        call stack (``scaler.step(optimizer)`` calls this step), once."""
        if self._scaler_checked:
            return
        self._scaler_checked = True
        acting = [m.name for m in self.methods if "gradients" in m.CARD.reads and Event.AFTER_BACKWARD in m.CARD.events]
        if acting and _grad_scaler_stepping() is not None:
            raise HostCannotServeError(
                f"a GradScaler steps this optimizer, but {acting[0]} acted on the gradients at sk.backward while they "
                f"were still scaled (by the loss scale), so it acted on the wrong values; pass the scaler to speedkit, "
                f"Speedkit(..., grad_scaler=scaler), and {acting[0]} unscales them first (scaler.step then does not "
                f"unscale them again)")

    def _watch_evaluations(self) -> None:
        """Beside a method whose average evaluation measures (EMA), watch the model's forwards for an evaluation
        outside ``with sk.evaluating():`` (``_refuse_evaluation_outside``), until ``sk.finish()``."""
        averaging = any(m.evaluates_average() for m in self.methods)
        if averaging and self._eval_hook is None and isinstance(self.state.model, torch.nn.Module):
            self._eval_hook = self.state.model.register_forward_pre_hook(self._refuse_evaluation_outside)

    def _refuse_evaluation_outside(self, module, args) -> None:
        """Refuse an evaluation forward (the model in eval mode, gradients off) after the first step and outside
        ``with sk.evaluating():``: the model holds its training weights there, not the average EMA keeps for
        evaluation, so the accuracy measured is not EMA's, without a word. A forward in eval mode with gradients
        on (frozen batch norm) trains, and is left alone; traced into a compiled forward the check is nothing."""
        if (torch.compiler.is_compiling() or self._evaluating or module.training or torch.is_grad_enabled()
                or self.state.timestamp.batch == 0):
            return
        averaging = next(m.name for m in self.methods if m.evaluates_average())
        raise HostCannotServeError(
            f"an evaluation forward (model.eval(), gradients off) outside `with sk.evaluating():`, where the model "
            f"holds its training weights: {averaging} keeps an average for evaluation to measure, which only "
            f"sk.evaluating() swaps in, so this would measure the training weights as if they were {averaging}'s; "
            f"evaluate inside `with sk.evaluating():` (after sk.finish() the model holds the weights the run ends "
            f"with)")

    # -- each step -------------------------------------------------------------------------------------
    def batch(self, batch):
        """The batch the forward takes, after the batch methods (resizing, sequence-length warmup, mixup)."""
        if self._evaluating:
            raise HostCannotServeError("sk.batch(batch) inside `with sk.evaluating():` runs the training batch "
                                       "methods (mixup, resizing) on evaluation data and opens a training step; "
                                       "evaluation batches go through `batch = sk.eval_batch(batch)`")
        self._open_step("sk.batch(batch)")
        self._check_fresh_start()
        self._check_lrs_kept("sk.step_end() and the next sk.batch")
        if self._share_to_check is not None and self.state.timestamp.batch_in_epoch == 0:
            self._share_to_check.check(self.accelerator)
            self._share_to_check = None
        batch = self.session.transform_batch(batch)
        if self._follow is not None:
            self._follow()
        self._lrs_set = self._learning_rates() if self._schedules else None
        return batch

    def loss(self, outputs, batch=None, loss_fn: Callable | None = None) -> torch.Tensor:
        """The loss of ``outputs`` on ``batch`` (the one :meth:`batch` returned), with the label methods applied
        (label smoothing, mixup's mixed labels). ``loss_fn(logits, targets)``, default cross-entropy."""
        loss = self.session.compute_loss(outputs, batch, loss_fn)
        if self.accumulation > 1 and not self._loss_checked:
            self._loss_given = loss
        return loss

    def backward(self, loss: torch.Tensor, backward: Callable | None = None) -> None:
        """BEFORE_BACKWARD, ``backward(loss)`` (default ``loss.backward()``; Accelerate's is used when given),
        then AFTER_BACKWARD (gradient clipping)."""
        self._open_step("sk.backward(loss)")
        if self._loss_given is not None:
            self._loss_checked = True
            self._refuse_loss_divided(loss)
        if self.accumulation > 1 and self.accelerator is None and not self._zeroing_checked:
            self._refuse_gradients_zeroed()
        self.session.before_backward()
        if backward is None:
            backward = self.accelerator.backward if self.accelerator is not None else torch.Tensor.backward
        if self.accumulation > 1 and self.accelerator is None:  # accelerator.backward divides by its own steps
            loss = loss / self._microbatches_in_step()
        backward(loss)
        self.session.after_backward(last_microbatch=self.step_due if self.accumulation > 1 else None)

    def _refuse_loss_divided(self, loss: torch.Tensor) -> None:
        """Refuse, at the first accumulated step, a loss the user divided by the accumulation steps before
        ``sk.backward``, which divides it (or Accelerate's backward does): divided twice, every gradient is k times
        too small, as if the learning rate were. One read of two numbers, once."""
        given, self._loss_given = self._loss_given, None
        if loss is given or loss.numel() != 1 or given.numel() != 1:
            return
        k, given_value = self._microbatches_in_step(), float(given.detach())
        if given_value and abs(float(loss.detach()) * k / given_value - 1) < 1e-4:
            raise HostCannotServeError(
                f"the loss given to sk.backward is sk.loss's divided by {k}, the step's batches, which sk.backward "
                f"divides it by itself (accumulation={self.accumulation}; with Accelerate, its backward does): divided "
                f"twice, every gradient is {k} times too small; pass sk.loss's loss as it is")

    def _refuse_gradients_zeroed(self) -> None:
        """Refuse, at the first accumulated step's second batch, gradients zeroed since its first (a loop that
        calls ``optimizer.zero_grad()`` after every batch, as it did before accumulating): each step then trained on
        its last batch alone, with the loss divided by k. Read once. (With Accelerate, zeroing every batch inside
        ``accelerator.accumulate`` is right: its optimizer zeroes only after stepping.)"""
        if self.session.state.microbatch_index == 0:
            return
        self._zeroing_checked = True
        grads = [p.grad for optimizer in self.state.optimizers for group in optimizer.param_groups
                 for p in group["params"] if p.grad is not None]
        if not any(bool(grad.any()) for grad in grads):
            raise HostCannotServeError(
                f"the gradients of this step's first batch were zeroed before its second (accumulation="
                f"{self.accumulation}): optimizer.zero_grad() ran between the batches of one step, so each step "
                f"trains on its last batch alone; zero them after optimizer.step(), when sk.step_due")

    @property
    def step_due(self) -> bool:
        """Whether the optimizer steps after this batch: always, unless accumulating (``accumulation=k``, or
        Accelerate's ``gradient_accumulation_steps``), where every k-th batch and an epoch's last one close a step
        (with Accelerate, ``accelerator.sync_gradients``)."""
        if self.accumulation == 1:
            return True
        if self.accelerator is not None:
            return bool(self.accelerator.sync_gradients)
        return self.session.state.microbatch_index + 1 >= self._microbatches_in_step()

    def _microbatches_in_step(self) -> int:
        """Batches in the step in flight: ``accumulation``, or what is left of the epoch."""
        if not self._loader_batches:
            return self.accumulation
        left = self._loader_batches - self.session.state.timestamp.batch_in_epoch * self.accumulation
        return max(1, min(self.accumulation, left))

    def step_end(self) -> None:
        """After ``optimizer.step()``: the methods' per-step work (EMA's update, Lookahead) and the clock. When
        accumulating, call it after every batch: a batch that does not close a step (:attr:`step_due`) is a
        microbatch of the step to come."""
        called, self._open_calls = self._open_calls, set()
        if self._schedules and "sk.batch(batch)" not in called:
            raise HostCannotServeError(f"Speedkit(schedules={self._schedules!r}) sets the learning rate in "
                                       f"sk.batch(batch), which this step did not call, so the schedule never moved: "
                                       f"add `batch = sk.batch(batch)` before the forward (see speedkit.hosts.loop)")
        self._check_optimizer_steps()
        self._check_lrs_kept("sk.batch and sk.step_end()")
        if not self.step_due:
            self.session.microbatch_end()
            return
        self.session.batch_end()
        if self.session.state.grad_scaler is not None:
            self.session.state.grad_scaler.step_ended()
        if self._follow is not None:  # for a step without sk.batch; sk.batch follows again after scheduler.step()
            self._follow()
        if not self._steps_checked:
            self._check_step_calls()
            self._steps_checked = True
        self._lrs_set = self._learning_rates() if self._schedules else None

    def _check_fresh_start(self) -> None:
        """Refuse a first step whose optimizer has trained before while speedkit's clock is at its start: a resume
        that restored the model and optimizer but not ``sk.load_state_dict`` would run ``max_duration`` again from
        the top (``sk.done`` far off, the schedules, EMA's average and progressive resizing started over)."""
        if self._fresh_start_checked:
            return
        self._fresh_start_checked = True
        trained = [o for o in self._step_counts if o.state]  # a new optimizer holds no state before its first step
        if trained and self.state.timestamp.batch == 0:
            raise HostCannotServeError(
                f"the optimizer holds state from earlier steps ({type(trained[0]).__name__}: "
                f"{len(trained[0].state)} parameters' state), but speedkit's clock is at its start: a resumed run "
                f"would train max_duration={str(self.state.max_duration)!r} again with its schedules and methods "
                f"started over; restore speedkit's state beside the optimizer's, sk.load_state_dict(saved) with "
                f"what sk.state_dict() saved, or, for a run that starts afresh from a trained optimizer on "
                f"purpose, pass Speedkit(..., warm_optimizer=True)")

    def _learning_rates(self) -> list:
        return [group["lr"] for optimizer in self.state.optimizers for group in optimizer.param_groups]

    def _check_lrs_kept(self, between: str) -> None:
        """With speedkit's ``schedules=``, refuse a learning rate changed between two steps (an LR scheduler built
        after sk.prepare_optimizer, a hand-set lr): speedkit's schedule sets it again at the next step, so the
        run follows neither as written. A tensor lr is not read here: on a GPU that read would wait for the device."""
        if self._lrs_set is None:
            return
        now = self._learning_rates()
        if len(now) != len(self._lrs_set) or any(
                not isinstance(lr, torch.Tensor) and lr != was for lr, was in zip(now, self._lrs_set)):
            raise HostCannotServeError(f"the learning rate changed between {between}, but "
                                       f"Speedkit(schedules={self._schedules!r}) sets it again at every step, "
                                       f"undoing that change; keep one schedule: drop your LR scheduler (or the "
                                       f"lr you set), or drop Speedkit(schedules=...) and keep your scheduler")

    def _open_step(self, call: str) -> None:
        """Refuse a step call made again before ``sk.step_end()`` closed the step it was made in: without
        step_end, EMA never averages, schedules never move and the clock never ticks (``sk.done`` stays False),
        and EMA's ``finish`` would put back the weights it started from. A step begun after the run reached
        ``max_duration`` is refused too: what follows the run's share (schedules, half-lives) has none left."""
        if self.done and not self._open_calls:
            raise RuntimeError(f"{call} after the run reached max_duration={str(self.state.max_duration)!r}: stop "
                               f"training at sk.done (`if sk.done: break`), or give Speedkit a longer max_duration; "
                               f"past it the schedules, EMA's half-life in dur and progressive resizing have no "
                               f"share of the run left to follow")
        if call in self._open_calls:
            raise HostCannotServeError(f"{call} was called again before sk.step_end() ended the step before: call "
                                       f"sk.step_end() after optimizer.step() in every step (EMA's update, the "
                                       f"schedules and the clock run there; see speedkit.hosts.loop)")
        self._open_calls.add(call)

    def _check_optimizer_steps(self) -> None:
        """Refuse a step that stepped some optimizers and not others, or stepped them more often than the clock
        counts (twice between two sk.step_end(), or on a batch that closes no accumulated step); a step skipped
        whole (a GradScaler's after an overflow) is fine."""
        counts = list(self._step_counts.values())
        self._step_counts = dict.fromkeys(self._step_counts, 0)
        if len(set(counts)) > 1:
            raise HostCannotServeError("optimizer.step() stepped the optimizer given to sk.prepare_optimizer but not "
                                       "the optimizers speedkit's methods made of it (Muon's group, Lookahead): step "
                                       "the one it returns, `optimizer = sk.prepare_optimizer(optimizer)`")
        most = max(counts, default=0)
        if most == 0 and self.step_due and gradients_kept(self._step_counts):
            raise HostCannotServeError(
                f"sk.step_end() closed a step in which no optimizer stepped and the gradients were kept: "
                f"accumulating gradients over several batches counts each batch as a step of speedkit's clock, so "
                f"schedules ran ahead and EMA averaged weights that had not moved; pass "
                f"Speedkit(accumulation=k) and step the optimizer when sk.step_due "
                f"(accumulation={self.accumulation} now), or zero the gradients in a step you skip")
        if most > (1 if self.step_due else 0):
            when = ("twice before one sk.step_end()" if self.step_due else
                    f"on a batch that closes no step (accumulation={self.accumulation})")
            raise HostCannotServeError(f"optimizer.step() ran {when}: speedkit's clock, schedules and EMA count one "
                                       f"optimizer step per step_end; step the optimizer only when sk.step_due, and "
                                       f"call sk.step_end() after every batch")

    def _check_step_calls(self) -> None:
        missing = self.session.unserved_step_events()
        if missing:
            method, events = missing[0]
            calls = " and ".join(dict.fromkeys(_STEP_CALLS[e] for e in events))
            raise HostCannotServeError(f"{method.name} needs {', '.join(e.value for e in events)}, which this loop's "
                                       f"first step did not reach: add `{calls}` to the step (see speedkit.hosts.loop)")

    # -- evaluation and the end ------------------------------------------------------------------------
    @contextlib.contextmanager
    def evaluating(self):
        """``with sk.evaluating(): ...``: EVAL_START before (EMA/SWA weights in), EVAL_END after (back out).

        The first evaluation must reach the evaluation calls its methods need (test-time augmentation:
        ``sk.eval_outputs``); one that did not is refused when it ends, with the call to add."""
        with self.session.evaluating() as model:
            self._evaluating = True
            try:
                yield model
            finally:
                self._evaluating = False
        if not self._eval_checked:
            self._eval_checked = True
            check_evaluation_served(self.session, "this loop's first evaluation", _eval_fix)

    def eval_batch(self, batch):
        """EVAL_BATCH_START and EVAL_BEFORE_FORWARD: the evaluation batch as the model should see it."""
        return self.session.eval_batch(batch)

    def eval_outputs(self, outputs):
        """EVAL_AFTER_FORWARD (test-time augmentation) and EVAL_BATCH_END; returns the outputs to score."""
        return self.session.eval_outputs(outputs)

    def finish(self) -> None:
        """FIT_END: averaging methods leave their weights in the model (EMA's ``final_weights="ema"``).

        A method that acts only in evaluation (test-time augmentation) when no ``with sk.evaluating():`` ran
        is refused here: it did nothing; so is a run whose steps never ended (no ``sk.step_end()``)."""
        if self._open_calls and self.state.timestamp.batch == 0:
            raise HostCannotServeError("sk.finish() after a step that sk.step_end() never ended: call sk.step_end() "
                                       "after optimizer.step() in every step (EMA's update, the schedules and the "
                                       "clock run there; see speedkit.hosts.loop)")
        if self._eval_hook is not None:  # after FIT_END the model holds the weights the run ends with
            self._eval_hook.remove()
            self._eval_hook = None
        self.session.fit_end()
        if not self._eval_checked and Event.EVAL_START not in self.session.served:
            self._eval_checked = True
            check_evaluation_served(self.session, "this run (no `with sk.evaluating():` evaluation ran)", _eval_fix)

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The clock and the methods' state; save it with your model and optimizer, after an evaluation's
        ``with sk.evaluating():`` block (inside, the model holds EMA's average: refused)."""
        averaging = [m.name for m in self.methods if m.evaluates_average()]
        if self._evaluating and averaging:
            raise HostCannotServeError(
                f"sk.state_dict() inside `with sk.evaluating():`, where the model holds {averaging[0]}'s averaged "
                f"weights in place of the ones training goes on from: a checkpoint taken here would resume training "
                f"from the average, and the average from the training weights; take the checkpoint after the "
                f"with-block (a best model to keep, without resuming from it, may be saved inside)")
        return self.session.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        """Restore :meth:`state_dict`'s output, after prepare_model and prepare_optimizer."""
        self.session.load_state_dict(saved)
        self.session.check_resumed_length("give Speedkit(max_duration=...) the length the checkpoint's run had, or "
                                          "start a new run from the model's weights (a new optimizer, or "
                                          "warm_optimizer=True, and no sk.load_state_dict)")
        self._fresh_start_checked = True


def _grad_scaler_stepping():
    """The GradScaler whose ``step`` called the optimizer step in progress, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), torch.amp.GradScaler):
            return frame.f_locals["self"]
        frame = frame.f_back
    return None


def _eval_fix(events) -> str:
    calls = dict.fromkeys("batch = sk.eval_batch(batch)" if e in (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD)
                          else "outputs = sk.eval_outputs(outputs)" for e in events)
    return (f"evaluate inside `with sk.evaluating():` and add `{'` and `'.join(calls)}` to the evaluation loop "
            f"(see speedkit.hosts.loop), or remove the method")


def _accumulation(accumulation: int | None, accelerator) -> int:
    """Batches an optimizer step accumulates: ``accumulation=``, or the accelerator's own setting."""
    accelerated = int(getattr(accelerator, "gradient_accumulation_steps", 1) or 1)
    if accumulation is None:
        return accelerated
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ValueError(f"accumulation must be a whole number of batches an optimizer step, 1 or more, got "
                         f"{accumulation!r}")
    if accelerator is not None and accumulation != accelerated:
        raise ValueError(f"Speedkit(accumulation={accumulation}) and Accelerator(gradient_accumulation_steps="
                         f"{accelerated}) disagree; set it once, in the Accelerator")
    return accumulation


def _length(loader) -> int | None:
    try:
        return len(loader) if loader is not None else None
    except TypeError:
        return None


@dataclasses.dataclass(frozen=True)
class _Share:
    """What one process takes of the training loader: batches an epoch, and samples a step over all processes.

    ``counted_before_prepare``: the loader was not yet prepared, and speedkit counted the share
    ``accelerator.prepare`` will give each process (``whole`` batches split over the processes)."""

    batches: int | None
    samples: int | None
    whole: int | None = None
    counted_before_prepare: bool = False

    def check(self, accelerator) -> None:
        """Refuse a loader this process iterates whose epoch is not the share speedkit counted."""
        iterated = accelerator.gradient_state.active_dataloader
        counted = (f"speedkit counted {self.batches} batches an epoch in each process, its share of the "
                   f"{self.whole} of train_dataloader as accelerator.prepare splits it")
        if iterated is None:
            raise HostCannotServeError(f"{counted}, but this process is not iterating a loader accelerator prepared: "
                                       f"iterate the loader accelerator.prepare(loader) returns, or pass "
                                       f"Speedkit(batches_per_epoch=...) with the batches each process takes an epoch")
        length = _length(iterated)
        if length is not None and length != self.batches:
            raise HostCannotServeError(f"{counted}, but the loader this process iterates has {length}: pass "
                                       f"Speedkit(batches_per_epoch={length}), or prepare the loader first and pass "
                                       f"the prepared one as train_dataloader=")


def _share(loader, accelerator) -> _Share:
    """Each process's share of ``loader``: all of it without an accelerator or once accelerate prepared it; for a
    loader not yet prepared, what ``accelerator.prepare`` will make of it (accelerate's rules: a batch split over
    the processes with ``split_batches``, else every process takes whole batches in turn, the last round evened
    out from the start of the data unless the loader drops it)."""
    whole = _length(loader)
    per_batch = getattr(loader, "batch_size", None)
    processes = int(getattr(accelerator, "num_processes", 1) or 1)
    if accelerator is None or _prepared_by_accelerate(loader):
        total = getattr(loader, "total_batch_size", None) or (per_batch * processes if per_batch else None)
        return _Share(whole, total)
    if getattr(accelerator, "split_batches", False):
        return _Share(whole, per_batch, whole, processes > 1 and whole is not None)
    samples = per_batch * processes if per_batch else None
    if whole is None or processes == 1:
        return _Share(whole, samples)
    drop_last = getattr(getattr(loader, "batch_sampler", None), "drop_last", getattr(loader, "drop_last", False))
    iterable = isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)
    if whole % processes == 0 or drop_last:
        batches = whole // processes
    elif getattr(accelerator, "even_batches", True) or iterable or getattr(accelerator, "dispatch_batches", None):
        batches = -(-whole // processes)
    else:  # uneven: the first processes take one batch more
        batches = whole // processes + int(accelerator.process_index < whole % processes)
    return _Share(batches, samples, whole, True)


def _prepared_by_accelerate(loader) -> bool:
    try:
        from accelerate.data_loader import DataLoaderAdapter
    except ImportError:
        return False
    return isinstance(loader, DataLoaderAdapter)
