"""Stochastic Weight Averaging (Izmailov et al., UAI 2018).

From ``swa_start`` (a fraction of training) the weights are averaged with equal weight at every
epoch end (or every ``update_interval`` batches), optionally while the learning rate is held at a
constant ``swa_lr`` so the iterates keep exploring the basin. At the end of training the model gets
the average, and since averaged weights do not match the BatchNorm statistics collected along the
way, those are recomputed with a pass over ``bn_update_batches`` training batches.

"The end" is the last batch of the budget (BATCH_END when the run is done), so that the run's final
evaluation already measures the averaged weights; a run stopped early (target reached, interrupted)
gets them at FIT_END instead. The final weights are always folded into the average, so a run whose
budget ends mid-epoch still averages its last stretch. With ``ema`` also on, evaluations show the EMA
(it swaps its weights in) and the weights left in the model at FIT_END are SWA's.

The functional pieces work in any loop: :func:`swa_update` (running equal-weight mean) and
:func:`update_batchnorm_statistics` (fresh BatchNorm statistics from a loader).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import torch

from speedkit.core.batch import call_model, to_device
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.methods.ema import copy_into, init_ema, load_weights, model_tensors

_NORMS = (torch.nn.modules.batchnorm._BatchNorm,)


@torch.no_grad()
def swa_update(average: Mapping[str, torch.Tensor], model: torch.nn.Module, count: int) -> int:
    """Fold the model's weights into an equal-weight ``average`` of ``count`` snapshots; returns ``count + 1``.

    Floating-point parameters are averaged; buffers are copied (BatchNorm statistics are recomputed
    at the end with :func:`update_batchnorm_statistics`).
    """
    param_names = {name for name, _ in model.named_parameters()}
    # Tensors alike in shape, dtype and device in one multi-tensor op each (averaged, or copied), not one op each.
    averaged, weights, copied, sources = [], [], [], []
    for name, current in model_tensors(model).items():
        target = average.get(name)
        if target is None:
            if name in param_names:
                raise KeyError(f"the average has no parameter {name!r}; start it from this model")
            average[name] = current.detach().clone()  # a buffer registered later
            continue
        alike = (target.shape == current.shape and target.dtype == current.dtype
                 and target.device == current.device)
        if name in param_names and target.is_floating_point():
            if alike:
                averaged.append(target)
                weights.append(current)
            else:
                target.lerp_(current.detach().to(target.dtype), 1.0 / (count + 1))
        elif alike:
            copied.append(target)
            sources.append(current)
        else:
            copy_into(target, current)
    if averaged:
        torch._foreach_lerp_(averaged, weights, 1.0 / (count + 1))
    if copied:
        torch._foreach_copy_(copied, sources)
    return count + 1


@torch.no_grad()
def update_batchnorm_statistics(model: torch.nn.Module, batches: Iterable, max_batches: int | None = None,
                                device: torch.device | None = None, autocast=None) -> int:
    """Recompute every BatchNorm's running mean/var as the plain average over ``batches``; returns how many.

    ``batches`` yields inputs or ``(inputs, ...)``. The model's train/eval mode is restored afterwards.
    """
    norms = [m for m in model.modules() if isinstance(m, _NORMS) and m.track_running_stats]
    if not norms:
        return 0
    momenta = {m: m.momentum for m in norms}
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # None: a cumulative (equal-weight) average over the batches seen
    was_training = model.training
    model.train()
    seen = 0
    try:
        for batch in batches:
            if max_batches is not None and seen >= max_batches:
                break
            if device is not None:
                batch = to_device(batch, device)
            with (autocast() if autocast is not None else torch.autocast("cpu", enabled=False)):
                call_model(model, batch)
            seen += 1
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        model.train(was_training)
    return seen


class SWA(Method):
    CARD = MethodCard(
        name="swa",
        summary="Average the weights over the last part of training, then refresh BatchNorm statistics.",
        domain="any",
        events=(Event.FIT_START, Event.BATCH_START, Event.BATCH_END, Event.EPOCH_END, Event.FIT_END),
        reads=("model",),
        writes=("schedule", "eval"),
        hparams=(
            HParam("swa_start", float, 0.7, low=0.0, high=0.99, step=0.05,
                   help="fraction of training after which weights are averaged"),
            HParam("update_interval", int, 0, low=0, high=1000, step=1,
                   help="average every N batches; 0: at every epoch end"),
            HParam("swa_lr", float, 0.0, low=0.0, high=1.0, step=0.001,
                   help="constant learning rate during SWA; 0 keeps the schedule"),
            HParam("bn_update_batches", int, 50, low=0, high=1000, step=10,
                   help="training batches for the final BatchNorm statistics pass (0: skip it)"),
        ),
        requirements=("one extra copy of the weights; a final pass over some training batches for BatchNorm",),
        runs_after=("ema",),  # at FIT_END the SWA average wins over the EMA when both are on
        effect="flatter minima, about +0.5-1% accuracy at no training cost (Izmailov et al. CIFAR results); "
               "coexists with ema (both average; swa's weights are the final ones)",
        source="Izmailov et al. 2018 'Averaging Weights Leads to Wider Optima'; Composer SWA docs",
    )

    def __init__(self, swa_start: float = 0.7, update_interval: int = 0, swa_lr: float = 0.0,
                 bn_update_batches: int = 50):
        super().__init__(swa_start=swa_start, update_interval=update_interval, swa_lr=swa_lr,
                         bn_update_batches=bn_update_batches)
        self.average: dict[str, torch.Tensor] | None = None
        self.count = 0
        self.last_update_batch = -1
        self.finished = False

    def _active(self, state) -> bool:
        return state.fraction_done() >= self.params["swa_start"]

    def match(self, event, state) -> bool:
        interval = self.params["update_interval"]
        if event is Event.BATCH_START:
            # the schedule has set this batch's lr; SWA overrides it during the averaging phase
            return self.params["swa_lr"] > 0 and self._active(state)
        if self.finished and event is not Event.FIT_END:
            return False
        if event is Event.BATCH_END:
            on_interval = interval > 0 and state.timestamp.batch % interval == 0
            return self._active(state) and (on_interval or state.is_done())
        if event is Event.EPOCH_END:
            return interval == 0 and self._active(state)
        return event in (Event.FIT_START, Event.FIT_END)

    def apply(self, event, state, logger):
        if event is Event.FIT_START:
            if self.average is not None:
                self.average = {k: v.to(state.device) for k, v in self.average.items()}
        elif event is Event.BATCH_START:
            for optimizer in state.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = self.params["swa_lr"]
        elif event in (Event.BATCH_END, Event.EPOCH_END):
            self._fold_in(state)
            if event is Event.BATCH_END and state.is_done():
                # finish now, so the run's final evaluation already sees the averaged weights
                self._finish(state, logger)
        elif event is Event.FIT_END:
            if not self.finished:
                self._finish(state, logger)
            elif self.average is not None:
                self._load_average(state)  # another averaging method (ema) may have written its weights

    def _fold_in(self, state) -> None:
        if self.last_update_batch == state.timestamp.batch:
            return  # already averaged at this point (an epoch end right after a batch end)
        if self.average is None:
            self.average = init_ema(state.model)
            self.count = 1
        else:
            self.count = swa_update(self.average, state.model, self.count)
        self.last_update_batch = state.timestamp.batch

    def _finish(self, state, logger) -> None:
        if self._active(state) and self.last_update_batch != state.timestamp.batch:
            self._fold_in(state)  # a run that ends mid-epoch still averages its final weights
        if self.average is None:
            message = "swa: training ended before swa_start, so there is no average; the model keeps its weights"
            logger.log_text(message)
            logger.log_note("swa", message)
            return
        self.finished = True
        self._load_average(state)
        refreshed = 0
        if self.params["bn_update_batches"] > 0 and state.train_dataloader is not None:
            # Drawing batches must not move training's random stream (a later fit or resume would differ).
            with torch.random.fork_rng(devices=[state.device] if state.device.type == "cuda" else []):
                refreshed = update_batchnorm_statistics(state.model, state.train_dataloader,
                                                        self.params["bn_update_batches"], state.device,
                                                        state.autocast)
            if callable(getattr(state.model, "reshard", None)):  # FSDP2 keeps the root gathered after a forward
                state.model.reshard()
        self.average = init_ema(state.model)  # the final weights, with their refreshed BatchNorm statistics
        message = (f"swa: the model now holds the average of {self.count} snapshots; "
                   f"BatchNorm statistics from {refreshed} batches")
        logger.log_text(message)
        logger.log_note("swa", message)

    def _load_average(self, state) -> None:
        load_weights(state.model, self.average)

    def averaged_weights(self) -> dict[str, torch.Tensor] | None:
        return self.average

    def ends_with_average(self) -> bool:
        return True

    def state_dict(self) -> dict:
        if self.average is None:
            return {"count": self.count}
        return {"average": {k: v.clone() for k, v in self.average.items()}, "count": self.count,
                "last_update_batch": self.last_update_batch, "finished": self.finished}

    def load_state_dict(self, state: dict) -> None:
        if state.get("average") is not None:
            self.average = {k: v.clone() for k, v in state["average"].items()}
            self.last_update_batch = int(state.get("last_update_batch", -1))
            self.finished = bool(state.get("finished", False))
        self.count = int(state.get("count", 0))
