"""speedkit's methods in the Hugging Face ``Trainer``: a ``Trainer`` subclass, or a ``TrainerCallback`` alone.

::

    from speedkit.hosts.hf import SpeedkitTrainer
    from speedkit.methods import EMA, Muon, QKNorm, ReLUSquared, SeqLengthWarmup

    trainer = SpeedkitTrainer(model=model, args=TrainingArguments(..., max_steps=2000), train_dataset=train,
                              methods=[QKNorm(), ReLUSquared(), Muon(), SeqLengthWarmup(), EMA()])
    trainer.train()                                  # or trainer.train(resume_from_checkpoint=True)

``SpeedkitTrainer`` is ``transformers.Trainer`` with speedkit's events where a callback cannot reach: the
surgery (INIT) in ``__init__``, before the optimizer exists; FIT_START in ``create_optimizer`` (Muon's split is
one optimizer to the Trainer, an OptimizerGroup, so its LR scheduler, clipping and checkpoints cover both);
the batch and loss events in ``compute_loss`` (AFTER_DATALOADER, BATCH_START, BEFORE_FORWARD, the forward,
AFTER_FORWARD, BEFORE_LOSS, the loss, AFTER_LOSS, BEFORE_BACKWARD); EVAL_START/END around ``evaluate`` (EMA's
weights are the ones evaluated). Its :class:`SpeedkitCallback` serves the rest: AFTER_BACKWARD at
``on_pre_optimizer_step``, AFTER_TRAIN_BATCH and BATCH_END at ``on_step_end``, epochs, FIT_END at
``on_train_end``. The methods' state is saved beside the optimizer in each ``checkpoint-N`` folder
(``speedkit_methods.pt``) and loaded with it on ``resume_from_checkpoint``. With EMA, a checkpoint's model
weights are the ones evaluation measured (the average), and the training weights ride in ``speedkit_methods.pt``,
the same rule as in Lightning. Schedules are fractions of the
Trainer's ``max_steps`` (from ``num_train_epochs`` when ``max_steps`` is not set). With
``TrainingArguments(gradient_accumulation_steps=k)`` each loader batch is a microbatch, as in
``speedkit.Trainer(grad_accum=k)``: the batch and loss events run on each (``on_substep_end`` closes one), while
BATCH_START (schedules), AFTER_BACKWARD (gradient clipping), AFTER_TRAIN_BATCH (EMA) and the clock count optimizer
steps, and each microbatch's mean loss is divided by the step's microbatches. With ``fp16=True`` the gradients
are still scaled at ``on_pre_optimizer_step``: gradient clipping unscales them first with accelerate's scaler,
once (its step then does not).

``SpeedkitCallback`` alone, in a plain ``transformers.Trainer(callbacks=[...])``, serves what callbacks see
(surgery at ``on_init_end``, per-step and per-epoch methods, gradient methods) and refuses, before training,
methods that need a batch, the loss, the optimizer or evaluation's start, naming the fix: SpeedkitTrainer.
Logging, progress bars and checkpoints stay the Trainer's; methods' notes go to the ``speedkit`` logger.

**Saving and reloading a surgered model.** ``from_pretrained`` builds the architecture from ``config.json``,
which knows nothing of speedkit's surgeries (QK-norm's gains, rotary positions, ReLU²). So a model they changed
records them in ``config.json`` whenever it is saved (``trainer.save_model()``, ``model.save_pretrained()``,
each ``checkpoint-N``; see ``speedkit.models.pretrained``), in a form a plain ``from_pretrained`` refuses with a
message naming :func:`load_pretrained`, the way back: it builds the model, runs the same surgeries, and loads
every saved tensor, refusing a folder whose tensors do not all fit.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Iterable

import torch
import transformers

from speedkit.core import Event, Method
from speedkit.hosts._checks import refuse_double_clipping
from speedkit.hosts._optimizers import StepScaler, as_one_optimizer
from speedkit.hosts.session import Host, HostCannotServeError, MethodSession
from speedkit.methods.ema import load_weights, model_tensors
from speedkit.models.pretrained import saved_surgeries

METHOD_STATE_FILE = "speedkit_methods.pt"  # in each checkpoint-N folder, beside optimizer.pt
TRAINING_WEIGHTS = "training_weights"  # in speedkit_methods.pt, when the checkpoint's model weights are EMA's
LOG = logging.getLogger("speedkit")

_USE_SUBCLASS = "use speedkit.hosts.hf.SpeedkitTrainer in place of transformers.Trainer"
_NO_EVAL_BATCHES = ("the Hugging Face Trainer's prediction_step gives speedkit no evaluation batch; remove the "
                    "method, or train with speedkit.Trainer")
_STAGE_FIXES = {"data": "remove it (the Trainer builds its own DataLoader), or train with speedkit.Trainer",
                "precision": "remove it and pass TrainingArguments(bf16=True) (or fp16=True on a GPU)"}
_DICT_LABELS = ("the Hugging Face Trainer's batches are dicts whose labels go into the model's own loss as class "
                "indices, so it would be refused at the first batch; remove it, or train with speedkit.Trainer, "
                "Lightning or a plain loop on (inputs, targets) batches")
_METHOD_FIXES = {**{name: f"it changes the labels, and {_DICT_LABELS}"
                    for name in ("mixup", "cutmix", "label_smoothing")},
                 "selective_backprop": f"it scores each sample by cross-entropy against its label, and "
                                       f"{_DICT_LABELS}"}

_CALLBACK_EVENTS = {
    Event.INIT: "SpeedkitCallback.on_init_end", Event.FIT_START: "on_train_begin (the optimizer as the Trainer built it)",
    Event.EPOCH_START: "on_epoch_begin", Event.EPOCH_END: "on_epoch_end",
    Event.BATCH_START: "on_step_begin", Event.AFTER_BACKWARD: "on_pre_optimizer_step",
    Event.AFTER_TRAIN_BATCH: "on_step_end", Event.BATCH_END: "on_step_end", Event.FIT_END: "on_train_end",
}
_SUBCLASS_EVENTS = {
    **_CALLBACK_EVENTS, Event.INIT: "SpeedkitTrainer.__init__", Event.FIT_START: "SpeedkitTrainer.create_optimizer",
    **{e: "SpeedkitTrainer.compute_loss" for e in (Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_FORWARD,
                                                   Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
                                                   Event.BEFORE_BACKWARD)},
    Event.EVAL_START: "SpeedkitTrainer.evaluate", Event.EVAL_END: "SpeedkitTrainer.evaluate",
}
_EVAL_BATCH_EVENTS = (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD, Event.EVAL_BATCH_END)

HF_TRAINER = Host(name="the Hugging Face Trainer (SpeedkitTrainer)", serves=_SUBCLASS_EVENTS,
                  fixes={e: _NO_EVAL_BATCHES for e in _EVAL_BATCH_EVENTS}, stage_fixes=_STAGE_FIXES,
                  method_fixes=_METHOD_FIXES)
HF_CALLBACK = Host(name="a transformers.Trainer callback", serves=_CALLBACK_EVENTS,
                   fixes={**{e: _USE_SUBCLASS for e in Event if e not in _CALLBACK_EVENTS},
                          **{e: _NO_EVAL_BATCHES for e in _EVAL_BATCH_EVENTS}},
                   stage_fixes={**_STAGE_FIXES, "optimizer": f"a callback cannot replace it; {_USE_SUBCLASS}"},
                   method_fixes=_METHOD_FIXES)


def _run_length(args, state=None) -> str:
    """The run's length in optimizer steps (the Trainer's max_steps once known), else in epochs."""
    steps = getattr(state, "max_steps", 0) or args.max_steps
    if steps and steps > 0:
        return f"{steps}ba"
    return f"{args.num_train_epochs}ep"


class SpeedkitCallback(transformers.TrainerCallback):
    """speedkit's methods at the Hugging Face Trainer's callback hooks (see this module's docstring).

    Alone, ``transformers.Trainer(..., callbacks=[SpeedkitCallback(methods)])`` runs the methods a callback can
    serve and refuses the others at ``on_init_end``; SpeedkitTrainer makes one for its own session.
    """

    def __init__(self, methods: Iterable[Method] = (), *, schedules=None, session: MethodSession | None = None):
        self.methods, self.schedules = list(methods), schedules
        self.session = session

    def on_init_end(self, args, state, control, model=None, **kwargs):
        if self.session is None:
            _refuse_two_schedules(args, self.schedules)
            _refuse_double_clipping(args, self.methods)
            self.session = MethodSession(HF_CALLBACK, self.methods, max_duration=_run_length(args),
                                         schedules=self.schedules)
            self.session.ends_epochs = False
            self.session.init(model)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        session = self.session
        session.set_lengths(max_duration=_run_length(args, state),
                            batches_per_epoch=_steps_per_epoch(args, train_dataloader))
        session.check_resumed_length("resume with the max_steps (or num_train_epochs) the checkpoint's run had, or "
                                     "start a new run from its weights, without resume_from_checkpoint")
        if not session.fit_started:  # alone: the optimizer as the Trainer built it (methods may not replace it)
            session.fit_start([optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer], train_dataloader)
        if getattr(optimizer, "scaler", None) is not None:
            # fp16: the gradients are still scaled at on_pre_optimizer_step (accelerate unscales them in its step,
            # unless max_grad_norm clipped first), so the methods acting on them unscale them first, once
            session.state.grad_scaler = StepScaler(optimizer.scaler, optimizer.optimizer)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.session.epoch_start()

    def on_step_begin(self, args, state, control, **kwargs):
        self.session.batch_start()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.session.after_backward(last_microbatch=True)  # once a step, after the last microbatch's backward

    def on_substep_end(self, args, state, control, **kwargs):
        self.session.microbatch_end()  # gradient_accumulation_steps: a microbatch through, the step to come

    def on_step_end(self, args, state, control, **kwargs):
        self.session.batch_end()
        if self.session.state.grad_scaler is not None:
            self.session.state.grad_scaler.step_ended()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.session.epoch_end()

    def on_train_end(self, args, state, control, **kwargs):
        self.session.fit_end()


class SpeedkitTrainer(transformers.Trainer):
    """``transformers.Trainer`` running speedkit ``methods`` (see this module's docstring for where each runs).

    ``schedules``: speedkit schedules applied each step as fractions of max_steps, in place of the Trainer's own
    scheduler: they need ``TrainingArguments(lr_scheduler_type="constant")`` (any other is refused here, since
    both would set the lr each step). ``loss_fn``: a criterion
    ``fn(logits, labels)`` in place of the model's own loss or cross-entropy against ``labels``.
    """

    loss_is_scaled_for_ga = False  # see __init__

    def __init__(self, *args, methods: Iterable[Method] = (), schedules=None, loss_fn: Callable | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        # compute_loss returns each microbatch's mean loss and passes the model no num_items_in_batch: the Trainer
        # divides it by the microbatches of the step, as speedkit.Trainer(grad_accum=...) weighs them.
        self.model_accepts_loss_kwargs = False
        methods = list(methods)
        _refuse_two_schedules(self.args, schedules)
        _refuse_double_clipping(self.args, methods)
        self.speedkit = MethodSession(HF_TRAINER, methods, max_duration=_run_length(self.args),
                                      schedules=schedules, loss_fn=loss_fn)
        self.speedkit.ends_epochs = False
        self.speedkit.init(self.model)  # before create_optimizer: new parameters are in the optimizer
        self.add_callback(SpeedkitCallback(session=self.speedkit))

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        session = self.speedkit
        if not session.fit_started:
            session.set_lengths(max_duration=_run_length(self.args, self.state),
                                batches_per_epoch=_steps_per_epoch(self.args, self.get_train_dataloader()))
            self.optimizer = as_one_optimizer(session.fit_start([optimizer]))
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        session = self.speedkit
        if not model.training:  # evaluation: the same loss (the model's own, or cross-entropy), no methods
            outputs = model(**inputs)
            loss = session.state.loss_fn(outputs, inputs)
            return (loss, outputs) if return_outputs else loss
        inputs = session.transform_batch(inputs)  # the clock counts the loader's batch, before the methods
        outputs = model(**inputs)
        loss = session.compute_loss(outputs, inputs)
        session.before_backward()
        return (loss, outputs) if return_outputs else loss

    def evaluate(self, *args, **kwargs):
        if not self.speedkit.fit_started:
            return super().evaluate(*args, **kwargs)
        with self.speedkit.evaluating():  # EMA's (or SWA's) weights are the ones evaluated
            return super().evaluate(*args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        """A checkpoint's model weights are the ones evaluation measures (EMA's average), as in Lightning, so
        ``load_best_model_at_end`` and a reload score what the logged metric says; the training weights ride
        in ``speedkit_methods.pt`` and a resume trains on from them."""
        with self.speedkit.training_weights():
            measured = self.speedkit.evaluated_weights()
            if measured is None:
                return super()._save_checkpoint(model, trial)
            self._training_weights = {k: v.detach().clone() for k, v in model_tensors(self.model).items()}
            load_weights(self.model, measured)
            try:
                super()._save_checkpoint(model, trial)
            finally:
                load_weights(self.model, self._training_weights)
                self._training_weights = None

    _training_weights = None

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            saved = self.speedkit.state_dict()
            if self._training_weights is not None:
                saved[TRAINING_WEIGHTS] = self._training_weights
            torch.save(saved, os.path.join(output_dir, METHOD_STATE_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = Path(checkpoint) / METHOD_STATE_FILE
        if not path.is_file():
            if self.speedkit.methods:
                raise HostCannotServeError(f"{checkpoint} has no {METHOD_STATE_FILE}: it was not written by a "
                                           f"SpeedkitTrainer, so the methods' state (EMA weights, counters) cannot "
                                           f"resume; start afresh or resume without methods")
            return
        # weights_only: loading a checkpoint never runs code from it (the methods' state is tensors and numbers).
        saved = torch.load(path, map_location="cpu", weights_only=True)
        self.speedkit.load_state_dict(saved)
        if saved.get(TRAINING_WEIGHTS) is not None:  # the folder's model weights are EMA's: train on from these
            load_weights(self.model, saved[TRAINING_WEIGHTS])


def load_pretrained(path, model_class=None, **from_pretrained_kwargs):
    """A model saved after speedkit's surgeries, with them: ``model_class.from_pretrained(path)`` (default
    ``AutoModelForCausalLM``) with the attention implementation it was built with, the surgeries recorded in its
    ``config.json`` run again, then every saved tensor loaded into the surgered model. A folder speedkit did not
    change is a plain ``from_pretrained``. Refuses tensors that fit nowhere, or parameters the folder does not
    hold, naming them."""
    from speedkit.methods import get_method

    path = Path(path)
    model_class = model_class or transformers.AutoModelForCausalLM
    record = saved_surgeries(path)
    if record is None:
        return model_class.from_pretrained(path, **from_pretrained_kwargs)
    surgeries, built_with = record
    from_pretrained_kwargs.setdefault("attn_implementation", built_with)  # config.json's refuses plain loads
    quiet = logging.getLogger("transformers.modeling_utils")  # its "unexpected keys" are the ones loaded below
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        model = model_class.from_pretrained(path, **from_pretrained_kwargs)
    finally:
        quiet.setLevel(level)
    methods = [get_method(s["name"], **s["params"]) for s in surgeries]
    everything = Host(name="speedkit.hosts.hf.load_pretrained", serves={event: "load_pretrained" for event in Event})
    MethodSession(everything, methods, max_duration="1ba").init(model)
    saved = _saved_tensors(path)
    missing, unexpected = model.load_state_dict(saved, strict=False)
    tensors = model.state_dict()
    loaded = {tensors[k].data_ptr() for k in saved if k in tensors}
    missing = [k for k in missing if tensors[k].data_ptr() not in loaded]  # a tied weight came with its twin
    if unexpected or missing:
        raise ValueError(f"{path} does not fit {type(model).__name__} after the surgeries "
                         f"{[s['name'] for s in surgeries]}: saved tensors that fit nowhere {sorted(unexpected)[:5]}, "
                         f"parameters it does not hold {sorted(missing)[:5]}; save it again from the SpeedkitTrainer "
                         f"that trained it")
    return model  # marked by the session's init: saving it again records the surgeries


def _saved_tensors(path: Path) -> dict:
    """Every tensor of a saved model folder: safetensors (one file or shards) or pytorch_model.bin."""
    from safetensors.torch import load_file

    for index_name, load in (("model.safetensors.index.json", load_file), ("pytorch_model.bin.index.json", None)):
        index = path / index_name
        if index.is_file():
            tensors = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                tensors.update(load(path / shard) if load else torch.load(path / shard, map_location="cpu",
                                                                           weights_only=True))
            return tensors
    if (path / "model.safetensors").is_file():
        return load_file(path / "model.safetensors")
    return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)


def _refuse_double_clipping(args, methods) -> None:
    refuse_double_clipping(methods, bool(args.max_grad_norm), "the Hugging Face Trainer",
                           "pass TrainingArguments(max_grad_norm=0) (its default is 1.0), or remove the "
                           "gradient_clipping method")


def _refuse_two_schedules(args, schedules) -> None:
    """speedkit ``schedules=`` and the Trainer's own scheduler would both set the lr each step: refuse it now."""
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    if schedules and kind != "constant":
        raise HostCannotServeError(f"speedkit schedules={schedules!r} and the Trainer's lr_scheduler_type={kind!r} "
                                   f"would both set the learning rate; keep one: pass TrainingArguments("
                                   f"lr_scheduler_type='constant') to have speedkit's alone, or drop schedules=")


def _steps_per_epoch(args, loader) -> int | None:
    """Optimizer steps an epoch (the clock's batches): the loader's batches over gradient_accumulation_steps,
    the last step taking what is left, as the Trainer steps."""
    batches = _length(loader)
    return -(-batches // args.gradient_accumulation_steps) if batches else batches


def _length(loader) -> int | None:
    try:
        return len(loader) if loader is not None else None
    except TypeError:
        return None
