"""What every host of the engine shares: a declaration of the events it can serve, and a session that runs
the methods at those events on a :class:`speedkit.core.State` through the same :class:`speedkit.core.Engine`
speedkit's own Trainer uses (same cards, same order, same conflict checks).

A host is a training loop speedkit does not own: a plain PyTorch loop, Accelerate, Lightning, the Hugging
Face Trainer. Its adapter (``speedkit.hosts.loop``, ``.lightning``, ``.hf``) says, as a :class:`Host`, which
events it serves and where, and what to do about each event it cannot serve. :meth:`Host.check` refuses,
before training, a method whose card needs an event the host cannot serve, naming the method, the host and
the fix. The adapter then calls the :class:`MethodSession` at its hook points, which drives the same
:class:`speedkit.train.step.Step` as speedkit's Trainer: one sequence of a step's events, and the clock
(batches, samples, tokens, epochs). The methods' state rides in the host's own checkpoints
(:meth:`MethodSession.state_dict`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from speedkit.core import Engine, Event, Method, State, Time, TimeUnit
from speedkit.core.batch import BatchShapeError, batch_inputs, batch_size, batch_targets, batch_tokens
from speedkit.core.method import LOOP_NEEDS, IncompatibleMethodsError
from speedkit.models.pretrained import mark_surgered
from speedkit.record.loggers import Logger, LoggerDestination, RecordDestination
from speedkit.record.runs import RunRecord
from speedkit.train.checkpoint.format import rng_state, set_rng_state
from speedkit.train.parts import (make_loss, make_schedules, refuse_optimizer_before_surgery,
                                  refuse_wrapped_before_surgery, surgeons)
from speedkit.train.step import Step

LOG = logging.getLogger("speedkit")

# What a method that writes these stages needs beyond events, and why a host that does not own them refuses it.
_STAGE_NEEDS = {
    "data": "it replaces the training data loader, which the host owns",
    "precision": "it sets the forward's autocast, which the host owns",
    "optimizer": "it changes or replaces the optimizer, which the host owns",
}


# The events of one training step that a host's user calls into (batch, loss, backward), in order.
STEP_EVENTS = (Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_FORWARD, Event.AFTER_FORWARD,
               Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD,
               Event.AFTER_TRAIN_BATCH, Event.BATCH_END)


class HostCannotServeError(IncompatibleMethodsError):
    """A method needs an event (or a part of the loop) that this host does not give speedkit; the message
    names the method, the host and the fix."""


@dataclasses.dataclass(frozen=True)
class Host:
    """What a host can do for methods, as data.

    ``serves``: event -> where the host runs it (a hook name, a call in the user's step).
    ``fixes``: event the host cannot serve as things stand -> the one-line fix (a call to add in the user's
    step, or the host that can run it). ``stage_fixes``: a card's written stage the host does not own
    (``"data"``, ``"precision"``) -> the fix. ``gives``: which of a card's ``loop_needs`` (``LOOP_NEEDS``: SAM's
    step closure) the host gives; none by default, and a method that needs one it does not give is refused.
    ``method_fixes``: method name -> why not and the fix, for what a host cannot do that no card declares
    (labels inside a Hugging Face batch dict).
    """

    name: str
    serves: Mapping[Event, str]
    fixes: Mapping[Event, str] = dataclasses.field(default_factory=dict)
    stage_fixes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    method_fixes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    gives: frozenset[str] = frozenset()

    def refusal(self, method: Method, state: State | None = None) -> str | None:
        """Why this host cannot run ``method`` and the fix, or None when it can.

        With ``state``, an event the card lists but the method says (``match``) it will not act on with these
        parameters is not needed (progressive resizing acts at evaluation only with ``eval_scale != 1``)."""
        card = method.CARD
        if card.name in self.method_fixes:
            return f"{card.name} cannot run in {self.name}: {self.method_fixes[card.name]}"
        for need in card.loop_needs:
            if need not in self.gives:
                return (f"{card.name} cannot run in {self.name}: {LOOP_NEEDS[need]}, which {self.name} does not "
                        f"give; remove it, or train with speedkit.Trainer")
        for stage in card.writes:
            if stage in self.stage_fixes:
                return f"{card.name} cannot run in {self.name}: {_STAGE_NEEDS.get(stage, stage)}; {self.stage_fixes[stage]}"
        missing = [event for event in card.events if event not in self.serves and _may_act(method, event, state)]
        if not missing:
            return None
        names = ", ".join(event.value for event in missing)
        fix = "; ".join(dict.fromkeys(self.fixes.get(event, f"train with speedkit.Trainer, which serves "
                                                            f"{event.value}") for event in missing))
        return f"{card.name} needs {names}, which {self.name} does not serve as set up: {fix}"

    def check(self, methods: Sequence[Method], state: State | None = None) -> None:
        """Refuse the first method this host cannot run (the message names it, the host and the fix)."""
        for method in methods:
            reason = self.refusal(method, state)
            if reason:
                raise HostCannotServeError(reason)


def _may_act(method: Method, event: Event, state: State | None) -> bool:
    """Whether ``method`` may act at ``event`` in this run: its ``match`` at the start, where it can tell."""
    if state is None:
        return True
    try:
        return bool(method.match(event, state))
    except Exception:  # a match that needs a batch or outputs: assume it acts
        return True


class _TextToLogging(LoggerDestination):
    """Methods' text lines (surgery reports, notes) go to the ``speedkit`` logger, so the host's console,
    progress bar and loggers stay the host's."""

    def log_text(self, text: str) -> None:
        LOG.info(text)


def duration_of(value: str | Time | None, what: str) -> Time:
    """``value`` as a Time, refusing a missing or wall-clock duration (schedules need a known length)."""
    duration = Time.from_input(value)
    if duration is None:
        raise ValueError(f"{what} is needed: methods with schedules run on fractions of the run; pass e.g. "
                         f"max_duration='1000ba' or '3ep'")
    if duration.unit in (TimeUnit.SECOND, TimeUnit.DURATION) or duration.value <= 0:
        raise ValueError(f"{what} must be a positive length in ba, ep, sp or tok, got {duration}")
    return duration


class MethodSession:
    """The methods of one run in a host: a State, the Engine, the clock, and a call per hook point.

    The adapter calls, in the order speedkit's Trainer reaches the same events: :meth:`init` (surgery),
    :meth:`fit_start` (optimizer methods; returns the optimizers to train with), then per batch
    :meth:`batch_start`, :meth:`transform_batch`, :meth:`compute_loss`, :meth:`before_backward`,
    :meth:`after_backward`, :meth:`batch_end` (with gradient accumulation, :meth:`microbatch_end` after each
    microbatch but a step's last); :meth:`epoch_start`/:meth:`epoch_end`; :meth:`eval_start` (or
    :meth:`evaluating`), per evaluation batch :meth:`eval_batch` and :meth:`eval_outputs`, :meth:`eval_end`; and
    :meth:`fit_end` when training ends (not when it is killed).
    """

    def __init__(self, host: Host, methods: Iterable[Method], *, max_duration: str | Time,
                 batches_per_epoch: int | None = None, samples_per_batch: int | None = None,
                 tokens_per_batch: int | None = None, schedules=None, loss_fn: Callable | None = None,
                 precision: str = "fp32", seed: int = 0, loggers: Sequence[LoggerDestination] = ()):
        methods = list(methods)
        for method in methods:
            if not isinstance(method, Method):
                raise TypeError(f"methods must be speedkit Method objects (speedkit.methods.get_method('ema') or "
                                f"speedkit.methods.EMA()), got {type(method).__name__} {method!r}")
        self.host = host
        self.record = RunRecord(name=f"speedkit in {host.name}")
        self.state = State(model=None, loss_fn=None, max_duration=duration_of(max_duration, "max_duration"),
                           device=torch.device("cpu"), precision=precision, seed=seed, methods=methods,
                           record=self.record)
        state = self.state
        state.batches_per_epoch, state.samples_per_batch = batches_per_epoch, samples_per_batch
        state.tokens_per_batch = tokens_per_batch
        state.autocast = contextlib.nullcontext  # the host owns the forward's precision
        state.schedulers = make_schedules(schedules)
        self._given_loss = loss_fn
        host.check(methods, state)
        self.logger = Logger(state, [RecordDestination(self.record), _TextToLogging(), *loggers])
        self.engine = Engine(state, self.logger)  # orders the methods and checks their conflicts
        self.step = Step(state, self.run)  # the Trainer's step events; no stopwatch: the host keeps its own time
        self.batch_started = False  # BATCH_START ran for the batch in flight
        self._counted_batch = None  # the loader's batch in flight, which the clock counts
        self._replaced_labels = None  # the labels a batch method replaced in the batch in flight (compute_loss)
        # the inputs a batch method replaced, until the model's first forward after it (_check_forward_inputs)
        self._replaced_inputs, self._forward_hook, self._inputs_checked = None, None, False
        self._accumulated: list = []  # the step's microbatches already through (gradient accumulation)
        self._resumed_length = None  # the length of the run a checkpoint came from, until checked against this one
        self.epoch_started = False
        self.initialized = False
        self._before_surgery: list[torch.Tensor] = []  # the model's parameters before INIT, until FIT_START
        self.served: set[Event] = set()  # every event run so far
        self.fit_started = False

    # -- the run's parts ----------------------------------------------------------------------------
    @property
    def methods(self) -> list[Method]:
        return self.state.methods

    def run(self, event: Event) -> None:
        self.served.add(event)
        self.engine.run_event(event)

    def unserved_step_events(self) -> list[tuple[Method, list[Event]]]:
        """Methods whose per-step events did not run in the step just finished (a call missing from the step)."""
        missing = []
        for method in self.state.methods:
            events = [e for e in method.CARD.events if e in STEP_EVENTS and e not in self.served]
            if events:
                missing.append((method, events))
        return missing

    def init(self, model: torch.nn.Module) -> torch.nn.Module:
        """INIT: the model surgeries, once; returns the model to train (the same object, changed in place)."""
        state = self.state
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if self.initialized and model is not state.model:
            # A notebook cell that builds the model again and prepares it with the session of an earlier cell:
            # the surgery ran once, on the first model, so the new one would train without it, unnoticed.
            operated = surgeons(self.methods)
            surgery = f", and its surgery ({', '.join(operated)}) ran on that one alone" if operated else ""
            raise ValueError(f"this speedkit session already prepared another model: its methods "
                             f"({', '.join(m.name for m in self.methods) or 'none'}) hold on to it{surgery}; a new "
                             f"model needs a new session: build Speedkit(...) again beside the model (in a notebook, "
                             f"in the same cell)")
        state.model = model
        reference = next(model.parameters(), None)
        if reference is not None:
            state.device = reference.device
        state.loss_fn = make_loss(model, self._given_loss, self.methods)
        if not self.initialized:
            refuse_wrapped_before_surgery(model, self.methods, "give speedkit the model itself (model = "
                                          "sk.prepare_model(model)) and wrap what it returns after: DDP(model), "
                                          "fully_shard(model) or accelerator.prepare(model, ...)")
            self._before_surgery = list(model.parameters())  # what an optimizer built too early holds
            self.run(Event.INIT)
            self.initialized = True
            mark_surgered(state.model, state.methods)  # a save_pretrained records the surgeries (models/pretrained.py)
        return state.model

    def set_lengths(self, *, max_duration: str | Time | None = None, batches_per_epoch: int | None = None,
                    samples_per_batch: int | None = None, tokens_per_batch: int | None = None) -> None:
        """What the host learns once its data is set up: the run's length and the nominal epoch and batch."""
        state = self.state
        if max_duration is not None:
            state.original_max_duration = state.max_duration = duration_of(max_duration, "max_duration")
        state.batches_per_epoch = batches_per_epoch or state.batches_per_epoch
        state.samples_per_batch = samples_per_batch or state.samples_per_batch
        state.tokens_per_batch = tokens_per_batch or state.tokens_per_batch

    def fit_start(self, optimizers, train_dataloader=None) -> list[torch.optim.Optimizer]:
        """FIT_START with the host's optimizers: methods may split (Muon) or wrap them; returns the list."""
        state = self.state
        if state.model is None:
            raise RuntimeError("call init(model) (the surgery) before fit_start; optimizers are built after it")
        if not self.fit_started:
            state.optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
            refuse_optimizer_before_surgery(self._before_surgery, state.model, state.optimizers, state.methods,
                                            "build the optimizer on the model's parameters after the surgery: in "
                                            "your own loop after model = sk.prepare_model(model); with the Hugging "
                                            "Face Trainer give optimizer_cls_and_kwargs= instead of an optimizer")
            self._before_surgery = []
            state.train_dataloader = train_dataloader
            self.run(Event.FIT_START)
            self.fit_started = True
        return state.optimizers

    # -- per epoch and per batch ------------------------------------------------------------------------
    def epoch_start(self) -> None:
        if not self.epoch_started:
            self.step.epoch_start()
            self.epoch_started = True

    def epoch_end(self) -> None:
        """EPOCH_END: the clock's epoch advances, then the methods hear of it."""
        self.epoch_started = False
        self.step.epoch_end()

    def batch_start(self) -> None:
        """Schedules for the fraction done, then BATCH_START (before the forward of this step)."""
        self._require_fit_start()
        self.epoch_start()
        if not self.batch_started:
            self.step.begin()
            self.batch_started = True

    def transform_batch(self, batch):
        """AFTER_DATALOADER and BEFORE_FORWARD on ``batch``; returns the batch the forward should take."""
        self._counted_batch = batch
        self.step.after_dataloader(batch)
        self.batch_start()
        given = None if self._inputs_checked else _inputs_of(batch)
        transformed = self.step.before_forward()
        labels = batch_targets(batch)
        self._replaced_labels = labels if labels is not None and batch_targets(transformed) is not labels else None
        if given is not None and _inputs_of(transformed) is not given:
            self._watch_forward(given)
        return transformed

    def _watch_forward(self, replaced) -> None:
        """Until the model's first forward after a batch method replaced the inputs (mixup, progressive resizing),
        check that it was not given the ones from before (``_check_forward_inputs``)."""
        self._replaced_inputs = replaced
        if self._forward_hook is None and isinstance(self.state.model, torch.nn.Module):
            self._forward_hook = self.state.model.register_forward_pre_hook(self._check_forward_inputs,
                                                                            with_kwargs=True)

    def _check_forward_inputs(self, module, args, kwargs) -> None:
        """Refuse a forward given the inputs from before the batch methods replaced them (``x, y = batch`` taken
        before the batch call): the model never saw what they made (mixup's mixed images, scored against their
        mixed labels), and trained on the wrong pairs without a word. Once, in eager mode, then the hook is
        removed; traced into a compiled forward it does nothing and stays, since removing it would recompile the
        model (``_stop_watching`` then lets go of the inputs it held)."""
        if torch.compiler.is_compiling():
            return
        replaced, self._replaced_inputs = self._replaced_inputs, None
        if replaced is None:
            return  # nothing to check: a compiled model's hook, kept (an eager forward must not remove it either)
        if any(value is replaced for value in (*args, *kwargs.values())):
            changed = [m.name for m in self.methods
                       if {Event.AFTER_DATALOADER, Event.BEFORE_FORWARD} & set(m.CARD.events)]
            raise HostCannotServeError(
                f"the model's forward was given the inputs from before the batch methods replaced them "
                f"({', '.join(changed)}), so it never saw what they made, while the loss counts it as if it had; "
                f"forward the batch speedkit's batch call returned (in a loop: batch = sk.batch(batch), then "
                f"model(batch[0]); in Lightning: batch = self.speedkit.batch(batch) before x, y = batch)")
        self._inputs_checked = True
        self._forward_hook.remove()
        self._forward_hook = None

    def _stop_watching(self) -> None:
        """At the end of a step whose forward no eager call checked (the model runs compiled): stop checking."""
        if self._replaced_inputs is not None:
            self._replaced_inputs, self._inputs_checked = None, True

    def compute_loss(self, outputs, batch=None, loss_fn: Callable | None = None) -> torch.Tensor:
        """AFTER_FORWARD, BEFORE_LOSS, the loss, AFTER_LOSS; returns the loss (label methods acted on it).

        ``loss_fn`` is a criterion ``fn(logits, targets)`` (``F.cross_entropy``; dense targets arrive after
        mixup or label smoothing) or None for the session's loss (cross-entropy, or a Hugging Face model's own).
        """
        state = self.state
        if batch is not None:
            if self._replaced_labels is not None and batch_targets(batch) is self._replaced_labels:
                # mixed inputs scored against unmixed labels would train without a word of warning
                raise HostCannotServeError(
                    "the batch given for the loss holds the labels from before the batch methods replaced them "
                    f"({', '.join(m.name for m in self.methods if Event.BEFORE_FORWARD in m.CARD.events)}): pass the "
                    "batch speedkit's batch call returned (in a loop: batch = sk.batch(batch), then "
                    "sk.loss(outputs, batch))")
            state.batch = batch
        self.step.after_forward(outputs)
        return self.step.loss(make_loss(state.model, loss_fn, self.methods) if loss_fn is not None else state.loss_fn)

    def before_backward(self) -> None:
        self.step.before_backward()

    def after_backward(self, *, last_microbatch: bool | None = None) -> None:
        """AFTER_BACKWARD. ``last_microbatch``, with gradient accumulation: whether the optimizer steps after this
        microbatch (a method that acts once a step, gradient clipping, acts there, as in speedkit's Trainer).
        Lightning and the Hugging Face Trainer run it once, just before the optimizer step: True."""
        if last_microbatch is not None:
            index = self.state.microbatch_index
            self.state.num_microbatches = index + 1 if last_microbatch else index + 2
        self.step.after_backward()

    def microbatch_end(self, batch=None) -> None:
        """Gradient accumulation: a microbatch's backward is through and the optimizer does not step yet. The
        step goes on with the next microbatch (its BEFORE_FORWARD to AFTER_BACKWARD, as in speedkit's Trainer);
        BATCH_START, AFTER_TRAIN_BATCH, the clock and BATCH_END stay once per optimizer step."""
        self._accumulated.append(batch if batch is not None else self._counted_batch)
        self._counted_batch = None
        self.state.microbatch_index += 1
        self._stop_watching()

    def batch_end(self, batch=None) -> None:
        """After the optimizer step: AFTER_TRAIN_BATCH, the clock advances by ``batch`` (the loader's batch) and
        the step's earlier microbatches, BATCH_END, and EPOCH_END when the epoch's last batch is through."""
        state = self.state
        counted = batch if batch is not None else self._counted_batch
        self._stop_watching()
        self.step.after_optimizer()
        microbatches = [b for b in (*self._accumulated, counted) if b is not None]
        if len(microbatches) > 1:
            self._count_accumulated(microbatches)
        else:
            self.step.count(counted)
        self._accumulated = []
        state.microbatch_index = 0
        self.step.end()
        self.batch_started = False
        self._counted_batch = None
        per_epoch = state.batches_per_epoch
        if self.ends_epochs and per_epoch and state.timestamp.batch_in_epoch >= per_epoch:
            self.epoch_end()

    def _count_accumulated(self, microbatches: list) -> None:
        """The clock advances by one optimizer step: the samples and tokens of all its microbatches."""
        world = self.step.world
        samples = sum(batch_size(b) for b in microbatches) * world
        tokens = sum(batch_tokens(b) for b in microbatches) * world
        self.state.timestamp = self.state.timestamp.after_batch(samples, tokens)

    @property
    def world(self) -> int:
        """Processes training together (DDP, Accelerate): the clock counts the samples of all of them."""
        return self.step.world

    @world.setter
    def world(self, processes: int) -> None:
        self.step.world = processes

    ends_epochs = True  # whether batch_end closes epochs by count (hosts with their own epoch hooks turn it off)

    # -- evaluation and the end ------------------------------------------------------------------------
    def eval_start(self) -> None:
        self.step.eval_start()

    def eval_batch(self, batch):
        """EVAL_BATCH_START and EVAL_BEFORE_FORWARD on ``batch``; returns the batch the forward should take."""
        return self.step.eval_batch(batch)

    def eval_outputs(self, outputs):
        """EVAL_AFTER_FORWARD and EVAL_BATCH_END; returns the outputs to score (test-time augmentation's)."""
        outputs = self.step.eval_outputs(outputs)
        self.step.eval_batch_end()
        return outputs

    def eval_end(self) -> None:
        self.step.eval_end()

    @contextlib.contextmanager
    def evaluating(self):
        """EVAL_START before, EVAL_END after (EMA and SWA swap their averaged weights in and out)."""
        model = self.state.model
        was_training = model.training if model is not None else False
        self.eval_start()
        try:
            yield self.state.model
        finally:
            self.eval_end()
            if model is not None:
                model.train(was_training)

    @contextlib.contextmanager
    def training_weights(self):
        """Inside, the model holds the weights training goes on from, even mid-evaluation (an average swapped in
        is swapped out for the while, ``Method.training_weights_in``), and the methods their averages."""
        with contextlib.ExitStack() as stack:
            for method in self.methods:
                stack.enter_context(method.training_weights_in(self.state.model))
            yield self.state.model

    def evaluated_weights(self) -> dict[str, torch.Tensor] | None:
        """The averages evaluation measures in place of the model's weights (EMA's), by state-dict name, or None
        where it measures the model's own; read inside :meth:`training_weights`. A host saves these as a
        checkpoint's model weights, so the file scores what the logged metric says."""
        measured = {}
        for method in self.methods:
            average = method.averaged_weights() if method.evaluates_average() else None
            if average is not None:
                measured.update(average)
        return measured or None

    def fit_end(self) -> None:
        """FIT_END, once: averaging methods leave their final weights in the model."""
        if self.fit_started:
            self.run(Event.FIT_END)
            self.fit_started = False

    def is_done(self) -> bool:
        return self.state.is_done()

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The clock, every method's state (EMA weights, averages, counters) and the RNGs random methods draw
        from (mixup, cutmix, ...), for the host's checkpoint: a resume then draws what the whole run drew."""
        return {"clock": self.state.timestamp.to_dict(), "length": str(self.state.max_duration),
                "methods": {m.name: m.state_dict() for m in self.state.methods}, "generators": rng_state()}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        from speedkit.core import Timestamp

        state = self.state
        saved_methods = dict(saved.get("methods", {}))
        names = [m.name for m in state.methods]
        missing = sorted(set(saved_methods) - set(names))
        if missing:
            raise ValueError(f"this checkpoint was written with method(s) {missing}, which this run lacks; add "
                             f"them to methods= to resume it (their state would be lost), or start afresh")
        for method in state.methods:
            if method.name in saved_methods:
                method.load_state_dict(saved_methods[method.name])
        state.timestamp = Timestamp.from_dict(saved["clock"])
        if saved.get("generators") is not None:  # written before the RNGs rode along: those resume inexactly
            set_rng_state(saved["generators"])
        self._resumed_length = saved.get("length")  # None: written before the length rode along

    def check_resumed_length(self, fix: str) -> None:
        """Refuse a resume whose run is not as long as the checkpoint's run: schedules (the learning rate,
        resizing, EMA's half-life in ``dur``) are fractions of the run's length, so they would jump from where the
        run stopped, without a word. The host calls it once this run's length is final (after ``set_lengths``)."""
        saved, self._resumed_length = self._resumed_length, None
        if saved is None:
            return
        state, old = self.state, Time.from_string(saved)
        now = state.max_duration
        try:
            old_in_now = state.convert(old, now.unit)
        except ValueError:  # a unit this run cannot convert (its epoch length unknown): only the same length holds
            old_in_now = old.value if old.unit is now.unit else None
        if old_in_now is not None and abs(old_in_now - now.value) <= 1e-9 * max(1.0, now.value):
            return
        done = state.progress(now.unit)
        was = f", {done / old_in_now:.0%} of the way through it" if old_in_now else ""
        raise HostCannotServeError(
            f"this checkpoint's run was {old} long{was}, and this one is {now} long ({state.fraction_done():.0%} of "
            f"the way): schedules are fractions of the run's length, so they would jump from where the run "
            f"stopped; {fix}")

    def _require_fit_start(self) -> None:
        if not self.fit_started:
            raise RuntimeError(f"{self.host.name}: training started before speedkit's fit start; call "
                               f"prepare_optimizer(optimizer) (FIT_START) before the first batch")


def _inputs_of(batch):
    """The batch's inputs, or None for a batch whose inputs speedkit cannot tell (a dict without an input key)."""
    try:
        return batch_inputs(batch)
    except BatchShapeError:
        return None
