"""speedkit's methods in Lightning: a ``Callback``, and two marked lines in ``training_step`` for batch and loss methods.

::

    import lightning.pytorch as L
    from speedkit.hosts.lightning import SpeedkitCallback
    from speedkit.methods import EMA, LabelSmoothing, MixUp, Muon

    class Classifier(L.LightningModule):
        def training_step(self, batch, batch_idx):
            batch = self.speedkit.batch(batch)              # speedkit: batch methods (mixup, resizing, ...)
            x, y = batch
            return self.speedkit.loss(self(x), batch)      # speedkit: label methods (label smoothing, mixup)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    trainer = L.Trainer(max_steps=2000, callbacks=[SpeedkitCallback([EMA(), LabelSmoothing(), MixUp(), Muon()])])
    trainer.fit(Classifier(), loader)

Where each event runs: INIT (surgery) at the callback's ``setup``, before Lightning restores a checkpoint's
weights; FIT_START at ``on_fit_start``, after ``configure_optimizers`` and before the optimizer states are
restored (Muon's split is one optimizer to Lightning, an OptimizerGroup); BATCH_START at
``on_train_batch_start``; AFTER_DATALOADER and BEFORE_FORWARD in ``self.speedkit.batch``; AFTER_FORWARD to
AFTER_LOSS in ``self.speedkit.loss``; BEFORE_BACKWARD at ``on_before_backward``; AFTER_BACKWARD at
``on_before_optimizer_step`` (gradients unscaled); AFTER_TRAIN_BATCH and BATCH_END at ``on_train_batch_end``;
EVAL_START/END around validation; evaluation batch events in ``validation_step`` through
``self.speedkit.eval_batch(batch)`` and ``self.speedkit.eval_outputs(outputs)``; FIT_END at ``on_train_end``
(not when training dies). The run's length is ``max_steps`` (or ``max_epochs``; with both, whichever ends the run
first), so every schedule is a fraction of it. With ``L.Trainer(accumulate_grad_batches=k)`` each loader batch is a
microbatch, as in ``speedkit.Trainer(grad_accum=k)``: batch and loss methods act on each, while BATCH_START
(schedules), AFTER_BACKWARD (gradient clipping), AFTER_TRAIN_BATCH (EMA) and the clock count optimizer steps. Under
manual optimization each batch is a step of the clock, as when ``training_step`` steps the optimizers in every
batch; a batch that steps none and keeps its gradients (accumulating by hand) is refused at its end, naming
``accumulate_grad_batches``. Method state rides
in Lightning's checkpoints (the callback's ``state_dict``, with the RNGs that random methods draw from) and resumes
exactly with ``trainer.fit(..., ckpt_path=...)``.

Resuming needs the same callback, as with any Lightning callback that keeps state. Without it, Lightning warns
("Please add the following callbacks: ['SpeedkitCallback']") and goes on as a plain run: a Muon checkpoint's
optimizer state also holds your optimizer's own torch form, Muon's matrices back in their groups, so your
optimizer loads it and keeps its state for the other parameters, while the matrices start afresh in it (their
Muon momentum is dropped). The other way round, a checkpoint written without the callback is refused by a
``SpeedkitCallback`` with methods before training resumes, since it holds none of their state: resume it
without the callback, or start a new run from its weights (``module.load_state_dict(torch.load(path,
weights_only=True)["state_dict"])``, then ``fit`` without ``ckpt_path``).

One rule for averaged weights (EMA): **a checkpoint's ``state_dict`` holds the weights validation measured**,
so the file ``ModelCheckpoint(monitor=...)`` keeps as the best, and what ``load_from_checkpoint`` gives, score
what the logged metric says. The raw training weights ride in the callback's state, and a resume with the
callback trains on from them. After ``fit`` the model holds EMA's final weights (``final_weights="ema"``).

A scheduler returned by ``configure_optimizers`` is built before Muon's split, so it cannot reach Muon's group:
that group follows it (Muon's ``lr`` times the scheduler's current multiplier, see
``FollowSchedule`` in ``speedkit/optim/follow.py``). ``SpeedkitCallback(schedules=...)`` together with such a
scheduler would set the lr twice, and is refused before the first step.

A method that needs a step call ``training_step`` does not make is refused at ``setup``, before training,
with the line to add; the calls are read from ``training_step``'s code (or given as ``step_calls=``).
Lightning's progress bar, loggers and checkpoints stay Lightning's; methods' notes go to the ``speedkit``
Python logger.
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterable, Iterator

import lightning.pytorch as L

from speedkit.core import Event, Method
from speedkit.hosts._checks import check_evaluation_served, refuse_double_clipping
from speedkit.hosts._optimizers import (OptimizerGroup, as_configured_state_dict, as_one_optimizer,
                                        follow_user_schedule, gradients_kept, refuse_two_schedules)
from speedkit.hosts.session import Host, HostCannotServeError, MethodSession
from speedkit.methods.ema import model_tensors

STEP_CALLS = ("batch", "loss")  # self.speedkit.batch(...) and self.speedkit.loss(...) in training_step
EVAL_CALLS = ("eval_batch", "eval_outputs")  # in validation_step

_BATCH_LINE = "add `batch = self.speedkit.batch(batch)` at the top of your LightningModule's training_step"
_LOSS_LINE = "compute the loss in training_step as `loss = self.speedkit.loss(logits, batch)`"
_EVAL_BATCH_LINE = "add `batch = self.speedkit.eval_batch(batch)` at the top of validation_step"
_EVAL_OUTPUTS_LINE = "pass the logits through `logits = self.speedkit.eval_outputs(logits)` in validation_step"

_HOOKS = {
    Event.INIT: "SpeedkitCallback.setup", Event.FIT_START: "SpeedkitCallback.on_fit_start",
    Event.EPOCH_START: "on_train_epoch_start", Event.BATCH_START: "on_train_batch_start",
    Event.BEFORE_BACKWARD: "on_before_backward", Event.AFTER_BACKWARD: "on_before_optimizer_step",
    Event.AFTER_TRAIN_BATCH: "on_train_batch_end", Event.BATCH_END: "on_train_batch_end",
    Event.EPOCH_END: "on_train_epoch_end", Event.EVAL_START: "on_validation_start",
    Event.EVAL_END: "on_validation_end", Event.FIT_END: "on_train_end",
}


def lightning_host(step_calls: Iterable[str] = (), eval_calls: Iterable[str] = ()) -> Host:
    """Lightning as a host: its callback hooks, plus the events ``training_step``/``validation_step`` serve
    through the calls they make (``step_calls`` of STEP_CALLS, ``eval_calls`` of EVAL_CALLS)."""
    step_calls, eval_calls = set(step_calls), set(eval_calls)
    serves = dict(_HOOKS)
    if "batch" in step_calls:
        serves.update({e: "training_step's self.speedkit.batch" for e in (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD)})
    if "loss" in step_calls:
        serves.update({e: "training_step's self.speedkit.loss"
                       for e in (Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS)})
    if "eval_batch" in eval_calls:
        serves.update({e: "validation_step's self.speedkit.eval_batch"
                       for e in (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD)})
    if "eval_outputs" in eval_calls:
        serves.update({e: "validation_step's self.speedkit.eval_outputs"
                       for e in (Event.EVAL_AFTER_FORWARD, Event.EVAL_BATCH_END)})
    fixes = {Event.AFTER_DATALOADER: _BATCH_LINE, Event.BEFORE_FORWARD: _BATCH_LINE,
             Event.AFTER_FORWARD: _LOSS_LINE, Event.BEFORE_LOSS: _LOSS_LINE, Event.AFTER_LOSS: _LOSS_LINE,
             Event.EVAL_BATCH_START: _EVAL_BATCH_LINE, Event.EVAL_BEFORE_FORWARD: _EVAL_BATCH_LINE,
             Event.EVAL_AFTER_FORWARD: _EVAL_OUTPUTS_LINE, Event.EVAL_BATCH_END: _EVAL_OUTPUTS_LINE}
    return Host(
        name="Lightning", serves=serves, fixes=fixes,
        stage_fixes={"data": "remove it (shuffling and augmentation belong to your DataModule), or train with "
                             "speedkit.Trainer",
                     "precision": "remove it and pass L.Trainer(precision='bf16-mixed') (or '16-mixed' on a GPU)"},
        method_fixes={"alternating_flip": "the training data is your DataModule's, so flip there: build the train "
                                          "DataLoader from `dataset, sampler = speedkit.data.per_image."
                                          "alternate_flips(dataset, sampler, seed)` (Lightning calls the sampler's "
                                          "set_epoch) and remove the method"})


def _code_names(code) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _code_names(const)


def calls_in(function, candidates: Iterable[str]) -> set[str]:
    """Which of ``candidates`` a function's code calls on ``speedkit`` (read from its bytecode names)."""
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return set()
    names = set(_code_names(code))
    return {c for c in candidates if c in names} if "speedkit" in names else set()


class StepCalls:
    """``self.speedkit`` inside a LightningModule: the calls ``training_step`` and ``validation_step`` make."""

    def __init__(self, session: MethodSession):
        self.session = session

    def batch(self, batch):
        """The batch as the forward should take it, after the batch methods (AFTER_DATALOADER, BEFORE_FORWARD)."""
        return self.session.transform_batch(batch)

    def loss(self, outputs, batch, loss_fn: Callable | None = None):
        """The loss of ``outputs`` on ``batch`` with the label methods applied; ``loss_fn(logits, targets)``,
        default cross-entropy (dense targets after mixup or label smoothing)."""
        return self.session.compute_loss(outputs, batch, loss_fn)

    def eval_batch(self, batch):
        """The validation batch as the forward should take it (EVAL_BATCH_START, EVAL_BEFORE_FORWARD)."""
        return self.session.eval_batch(batch)

    def eval_outputs(self, outputs):
        """The outputs to score, after EVAL_AFTER_FORWARD (test-time augmentation), then EVAL_BATCH_END."""
        return self.session.eval_outputs(outputs)


def _duration(trainer: "L.Trainer", steps_per_epoch: int | None = None) -> str:
    """The run's length as Lightning ends it: ``max_steps`` or ``max_epochs``, and where both are set, whichever
    comes first once ``steps_per_epoch`` (optimizer steps) is known: schedules as fractions of a ``max_steps``
    that ``max_epochs`` cuts short would never reach their end."""
    steps = trainer.max_steps if trainer.max_steps is not None and trainer.max_steps > 0 else None
    epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 else None
    if steps and epochs and steps_per_epoch and epochs * steps_per_epoch < steps:
        return f"{epochs}ep"
    if steps:
        return f"{steps}ba"
    if epochs:
        return f"{epochs}ep"
    raise ValueError("SpeedkitCallback needs the run's length, since schedules are fractions of it: pass "
                     "L.Trainer(max_steps=...) or L.Trainer(max_epochs=...)")


TRAINING_WEIGHTS = "training_weights"  # in the callback's checkpoint state, when state_dict holds EMA's
_PRECISIONS = {"bf16": "bf16", "16": "fp16", "fp16": "fp16"}


class SpeedkitCallback(L.Callback):
    """speedkit's methods in a Lightning run (see this module's docstring for where each event runs).

    ``schedules``: speedkit schedules applied to the optimizers each step, as fractions of ``max_steps`` (or
    ``max_epochs``). ``loss_fn``: the criterion ``fn(logits, targets)`` ``self.speedkit.loss`` uses by default.
    ``step_calls``/``eval_calls``: which speedkit calls ``training_step``/``validation_step`` make, when reading
    them from the code would be wrong (a step that calls a helper that makes them).
    """

    def __init__(self, methods: Iterable[Method] = (), *, schedules=None, loss_fn: Callable | None = None,
                 step_calls: Iterable[str] | None = None, eval_calls: Iterable[str] | None = None):
        self.methods = list(methods)
        self.schedules, self.loss_fn = schedules, loss_fn
        self.step_calls = None if step_calls is None else set(step_calls)
        self.eval_calls = None if eval_calls is None else set(eval_calls)
        self.session: MethodSession | None = None
        self._step_checked = False
        self._follow = None  # Muon's groups following the scheduler from configure_optimizers
        self._configured = None  # (the user's optimizer, its groups' parameters) before Muon's split
        self._eval_checked = False

    @property
    def state_key(self) -> str:
        return "SpeedkitCallback"  # one per Trainer; a stable key keeps old checkpoints loadable

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.session is not None:
            return
        refuse_double_clipping(self.methods, bool(trainer.gradient_clip_val), "Lightning",
                               "remove L.Trainer(gradient_clip_val=...), or remove the gradient_clipping method")
        step_calls = self.step_calls if self.step_calls is not None else calls_in(type(pl_module).training_step,
                                                                               STEP_CALLS)
        eval_calls = self.eval_calls if self.eval_calls is not None else calls_in(
            getattr(type(pl_module), "validation_step", None), EVAL_CALLS)
        precision = str(trainer.precision).split("-")[0]
        self.session = MethodSession(lightning_host(step_calls, eval_calls), self.methods,
                                     max_duration=_duration(trainer), schedules=self.schedules, loss_fn=self.loss_fn,
                                     precision=_PRECISIONS.get(precision, "fp32"))
        self.session.ends_epochs = False  # Lightning says when an epoch ends
        object.__setattr__(pl_module, "speedkit", StepCalls(self.session))  # not a submodule: no state_dict keys
        self.session.init(pl_module)

    def on_fit_start(self, trainer, pl_module) -> None:
        session = self.session
        trainer.fit_loop.setup_data()  # the train loader, so its length is known (Lightning does it once)
        loader = trainer.train_dataloader
        # The clock counts optimizer steps: accumulate_grad_batches loader batches make one (Lightning steps at
        # an epoch's end too, however many it has accumulated).
        accumulate, per_epoch = trainer.accumulate_grad_batches, trainer.num_training_batches
        per_batch = getattr(loader, "batch_size", None)
        steps_per_epoch = -(-int(per_epoch) // accumulate) if per_epoch != float("inf") else None
        length = _duration(trainer, steps_per_epoch)
        session.set_lengths(max_duration=length if length != str(session.state.max_duration) else None,
                            batches_per_epoch=steps_per_epoch,
                            samples_per_batch=per_batch * trainer.world_size * accumulate if per_batch else None)
        session.check_resumed_length("resume with the max_steps and max_epochs the checkpoint's run had, or start "
                                     "a new fit from its weights, without ckpt_path")
        session.world = trainer.world_size
        given = list(trainer.optimizers)
        refuse_two_schedules(given, self.schedules, "Lightning",
                             "remove SpeedkitCallback(schedules=...) (speedkit's Muon group follows your scheduler), "
                             "or return only the optimizer from configure_optimizers")
        if len(given) == 1:
            self._configured = (given[0], [list(group["params"]) for group in given[0].param_groups])
        optimizers = session.fit_start(given, loader)
        if [id(o) for o in optimizers] != [id(o) for o in given]:
            trainer.strategy.optimizers = [as_one_optimizer(optimizers)]  # Muon's split steps as one optimizer
        # The scheduler from configure_optimizers was built before the split and cannot reach Muon's group, which
        # follows its lr's relative change; speedkit's own schedules set every group, Muon's included.
        self._follow = None if self.schedules else follow_user_schedule(given, optimizers)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.session.epoch_start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.session._counted_batch = batch
        self.session.batch_start()
        if self._follow is not None:
            self._follow()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.session.before_backward()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.session.after_backward(last_microbatch=True)  # once a step, after the last microbatch's backward
        self._stepping = True

    _stepping = False  # the optimizer steps after this batch (with accumulate_grad_batches, not after every one)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._stepping and trainer.accumulate_grad_batches > 1:  # a microbatch; the step is to come
            self.session.microbatch_end(batch)
            return
        if not self._stepping and not pl_module.automatic_optimization and gradients_kept(trainer.optimizers):
            raise HostCannotServeError(
                "training_step stepped no optimizer in this batch and kept its gradients: accumulating gradients "
                "by hand under manual optimization counts each batch as a step of speedkit's clock, so schedules "
                "ran ahead of Lightning's steps and EMA averaged weights that had not moved; use automatic "
                "optimization with L.Trainer(accumulate_grad_batches=k), or step the optimizers in every "
                "training_step")
        self._stepping = False
        self.session.batch_end(batch)
        if not self._step_checked:  # the calls read from training_step's code were really made
            self._step_checked = True
            missing = self.session.unserved_step_events()
            if missing:
                method, events = missing[0]
                fix = _BATCH_LINE if {Event.AFTER_DATALOADER, Event.BEFORE_FORWARD} & set(events) else _LOSS_LINE
                raise HostCannotServeError(f"{method.name} needs {', '.join(e.value for e in events)}, which "
                                           f"training_step's first step did not reach: {fix}")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.session.epoch_end()

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.session is not None and self.session.fit_started:
            self.session.eval_start()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.session is not None and self.session.fit_started:
            self.session.eval_end()
            if not self._eval_checked and sum(trainer.num_val_batches or [0]) > 0:
                self._eval_checked = True  # the calls read from validation_step's code were really made
                check_evaluation_served(self.session, "validation_step's first validation",
                                        lambda events: _EVAL_BATCH_LINE if {Event.EVAL_BATCH_START,
                                                                            Event.EVAL_BEFORE_FORWARD} & set(events)
                                        else _EVAL_OUTPUTS_LINE)

    def on_train_end(self, trainer, pl_module) -> None:
        self.session.fit_end()

    def state_dict(self) -> dict:
        return self.session.state_dict() if self.session is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict:
            self.session.load_state_dict(state_dict)
            training = state_dict.get(TRAINING_WEIGHTS)
            if training is not None:  # the checkpoint's state_dict held the measured (EMA) weights
                self.session.state.model.load_state_dict(training)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Refuse, before training resumes, a training checkpoint written without this callback: it holds no
        state of speedkit's methods (their clock, Muon's optimizer)."""
        if not self.methods or "optimizer_states" not in checkpoint:
            return  # nothing to resume here, or a weights-only file, which Lightning refuses itself
        if self.state_key not in (checkpoint.get("callbacks") or {}):
            names = ", ".join(m.name for m in self.methods)
            raise ValueError(
                f"this checkpoint (step {checkpoint.get('global_step', '?')}) was written without SpeedkitCallback, "
                f"so it holds no state of speedkit's methods ({names}): their schedules would restart from step 0 "
                f"and its optimizer state is your plain optimizer's. Resume it as it was written (without "
                f"SpeedkitCallback), or start a new run from its weights with the callback: "
                f"`module.load_state_dict(torch.load(path, weights_only=True)['state_dict'])`, then "
                f"`trainer.fit(module, ...)` without ckpt_path")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """The checkpoint's ``state_dict`` becomes the weights validation measures (EMA's average); the
        training weights move into this callback's state, for a resume. With Muon's split, the optimizer
        state also holds your optimizer's own torch form (see the module docstring: resuming without the
        callback)."""
        self._save_as_configured(trainer, checkpoint)
        if self.session is None:
            return
        # Saved during validation too: inside, the model holds the training weights and the methods their averages.
        with self.session.training_weights() as model:
            measured = self.session.evaluated_weights()
            if measured is None:
                return
            model_now, training = checkpoint["state_dict"], model_tensors(model)
            checkpoint["state_dict"] = {k: measured.get(k, v).detach().clone() for k, v in model_now.items()}
            own = checkpoint.get("callbacks", {}).get(self.state_key)
            if own is not None:  # a weights-only checkpoint has no callback state, and cannot resume training
                own["methods"] = self.session.state_dict()["methods"]  # taken mid-validation, it held swapped weights
                own[TRAINING_WEIGHTS] = {k: training.get(k, v).detach().clone() for k, v in model_now.items()}

    def _save_as_configured(self, trainer, checkpoint: dict) -> None:
        """Next to the OptimizerGroup's members (what a resume with the callback loads), its first member in
        torch's form as configure_optimizers built it, Muon's matrices back in their groups: what your own
        optimizer loads in a resume without the callback, instead of failing on a missing ``param_groups``."""
        states = checkpoint.get("optimizer_states")
        if not states or self._configured is None or not isinstance(trainer.strategy.optimizers[0], OptimizerGroup):
            return
        optimizer, configured = self._configured
        plain = as_configured_state_dict(optimizer, configured)
        if plain is not None and "param_groups" not in states[0]:
            states[0].update(plain)
