"""Exponential moving average (EMA) of the weights, evaluated in place of the raw weights.

Every ``update_interval`` batches the average moves towards the current weights,
``ema = smoothing * ema + (1 - smoothing) * weights``. Floating-point buffers (BatchNorm running
statistics) are averaged the same way, so the averaged weights are evaluated with statistics that match
them; integer buffers (batch counters) are copied. Copying the live statistics instead ruins the average
on short runs (bench/results/2026-12-03-design-notes/design_notes.json, ema). The average is what evaluation
sees (swapped in at EVAL_START, swapped back at EVAL_END) and, with ``final_weights="ema"``, what the model
holds after training. The averaged weights sit in a flatter, lower-loss region than the noisy last iterate, so
the same accuracy comes sooner (Composer EMA; hlb-CIFAR10 uses it).

``half_life`` says how fast the average forgets: after ``half_life`` of training an old weight's
share has halved. ``smoothing = 0.5 ** (update_interval / half_life_in_batches)``. The default is a tenth of
the run (``"0.1dur"``), so a short run's average is not mostly its starting weights, as a fixed number of
batches would make it. Where the run's length in batches is unknown (a wall-clock budget, epochs of
unknown length) the default falls back to 50 batches with a warning; a half-life longer than a quarter of the
run is warned about at the start, with the fix.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Mapping

import torch

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.core.time import Time, TimeUnit


def compute_ema_smoothing(half_life_batches: float, update_interval: int = 1) -> float:
    """The per-update smoothing whose weights halve after ``half_life_batches`` batches."""
    if half_life_batches <= 0:
        raise ValueError(f"half_life must be longer than zero batches, got {half_life_batches}")
    return 0.5 ** (update_interval / half_life_batches)


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by state-dict name; a tied weight appears once.

    Non-persistent buffers (caches, per-run masks) are not part of the weights and are left out.
    """
    tensors = dict(model.named_parameters())
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                tensors[f"{module_name}.{name}" if module_name else name] = buffer
    return tensors


@torch.no_grad()
def copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target.copy_(source)``, also when a buffer changed its shape since (some methods size buffers lazily)."""
    if target.shape == source.shape:
        target.copy_(source.detach())
    else:
        target.set_(source.detach().clone())


def init_ema(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the model's parameters and buffers, the starting point of an average."""
    return {name: t.detach().clone() for name, t in model_tensors(model).items()}


@torch.no_grad()
def ema_update(ema_model_or_tensors: torch.nn.Module | Mapping[str, torch.Tensor], model: torch.nn.Module,
               smoothing: float) -> None:
    """``ema = smoothing * ema + (1 - smoothing) * model`` for floating-point parameters and buffers;
    integer buffers (and buffers whose shape changed) are copied.

    ``ema_model_or_tensors`` is a copy of the model (e.g. ``copy.deepcopy(model)``) or a dict from
    :func:`init_ema`; it is updated in place.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    ema = (model_tensors(ema_model_or_tensors) if isinstance(ema_model_or_tensors, torch.nn.Module)
           else ema_model_or_tensors)
    param_names = {name for name, _ in model.named_parameters()}
    # Same shape and dtype: averaged (floating point) or copied (integer counters) in one multi-tensor op each,
    # rather than an op per tensor.
    averages, currents, copies, sources = [], [], [], []
    for name, current in model_tensors(model).items():
        if name not in ema:
            if name in param_names or not isinstance(ema, dict):
                raise KeyError(f"the EMA has no tensor {name!r}; build it from this model (init_ema(model))")
            ema[name] = current.detach().clone()  # a buffer registered after the EMA was made
            continue
        average = ema[name]
        if average.shape != current.shape or average.dtype != current.dtype or average.device != current.device:
            if average.is_floating_point() and average.shape == current.shape:
                average.lerp_(current.detach().to(average.dtype), 1.0 - smoothing)
            else:
                copy_into(average, current)
        elif average.is_floating_point():
            averages.append(average)
            currents.append(current)
        else:
            copies.append(average)
            sources.append(current)
    if averages:
        torch._foreach_lerp_(averages, currents, 1.0 - smoothing)
    if copies:
        torch._foreach_copy_(copies, sources)


@torch.no_grad()
def swap_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Exchange the model's parameters and buffers with ``tensors`` (same names), in place."""
    for name, current in model_tensors(model).items():
        if name not in tensors:
            continue  # a buffer the average has not seen yet: it stays as it is
        other = tensors[name]
        saved = current.detach().clone()
        copy_into(current, other)
        copy_into(other, saved)


@torch.no_grad()
def load_weights(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy ``tensors`` (by state-dict name) into the model's parameters and buffers."""
    for name, current in model_tensors(model).items():
        if name in tensors:
            copy_into(current, tensors[name])


def half_life_in_batches(half_life: str, state) -> float:
    """Convert a duration string (``"50ba"``, ``"0.5ep"``, ``"0.05dur"``) into batches for this run."""
    time = Time.from_input(half_life)
    if time.unit is TimeUnit.DURATION:
        total = state.convert(state.max_duration, TimeUnit.BATCH)
        return float(time.value) * total
    return state.convert(time, TimeUnit.BATCH)


DEFAULT_HALF_LIFE = "0.1dur"
FALLBACK_HALF_LIFE_BATCHES = 50  # the default where the run's length in batches is unknown
LONG_HALF_LIFE = 0.25  # a half-life above this fraction of the run leaves much of the start in the average


def run_batches(state) -> float | None:
    """The run's length in batches, or None where it cannot be known (a wall-clock budget, unknown epochs)."""
    try:
        return state.convert(state.max_duration, TimeUnit.BATCH)
    except ValueError:
        return None


class EMA(Method):
    CARD = MethodCard(
        name="ema",
        summary="Keep an exponential moving average of the weights; evaluate (and finish) with it.",
        domain="any",
        events=(Event.FIT_START, Event.BATCH_END, Event.EVAL_START, Event.EVAL_END, Event.FIT_END),
        reads=("model",),
        writes=("eval",),
        hparams=(
            HParam("half_life", str, DEFAULT_HALF_LIFE,
                   help="time for an old weight's share to halve: '0.1dur' (a tenth of the run), '50ba', '0.5ep'"),
            HParam("smoothing", float, 0.0, low=0.0, high=0.9999, step=0.0001,
                   help="per-update smoothing; 0 means: derive it from half_life"),
            HParam("update_interval", int, 1, low=1, high=100, step=1, help="update the average every N batches"),
            HParam("final_weights", str, "ema", choices=("ema", "model"),
                   help="what the model holds after training: the average or the last weights"),
        ),
        requirements=("one extra copy of the weights in memory (two while evaluating)",),
        conflicts={},
        effect="better accuracy per step late in training, so a target is reached sooner; "
               "coexists with swa (both average; swa's weights are the final ones when both are on)",
        source="Composer EMA docs; Polyak & Juditsky 1992; hlb-CIFAR10",
    )

    def __init__(self, half_life: str = DEFAULT_HALF_LIFE, smoothing: float = 0.0, update_interval: int = 1,
                 final_weights: str = "ema"):
        super().__init__(half_life=half_life, smoothing=smoothing, update_interval=update_interval,
                         final_weights=final_weights)
        try:  # a malformed duration fails now, not at fit start
            time = Time.from_string(half_life)
        except (ValueError, TypeError) as e:
            raise type(e)(f"ema.half_life: {e}") from None
        if time.value <= 0 or time.unit is TimeUnit.SECOND:
            raise ValueError(f"ema.half_life must be a positive duration in ba, ep, sp, tok or dur, got {half_life!r}")
        self.ema: dict[str, torch.Tensor] | None = None
        self.smoothing: float | None = None
        self.updates = 0
        self._swapped_in = False

    def match(self, event, state) -> bool:
        if event is Event.BATCH_END:
            return state.timestamp.batch % self.params["update_interval"] == 0
        if event is Event.FIT_END:
            return self.params["final_weights"] == "ema"
        return event in self.CARD.events

    def apply(self, event, state, logger):
        if event is Event.FIT_START:
            self._start(state, logger)
        elif self.ema is None:
            return  # evaluated outside fit, before any average exists
        elif event is Event.BATCH_END:
            ema_update(self.ema, state.model, self.smoothing)
            self.updates += 1
        elif event is Event.EVAL_START and not self._swapped_in:
            swap_weights(state.model, self.ema)
            self._swapped_in = True
        elif event is Event.EVAL_END and self._swapped_in:
            swap_weights(state.model, self.ema)
            self._swapped_in = False
        elif event is Event.FIT_END:
            load_weights(state.model, self.ema)
            logger.log_text(f"ema: the model now holds the average of {self.updates} updates")

    def _start(self, state, logger):
        if self.params["smoothing"] > 0:
            self.smoothing = self.params["smoothing"]
        else:
            batches = self._half_life_batches(state)
            self.smoothing = compute_ema_smoothing(batches, self.params["update_interval"])
        if self.ema is None:  # not restored from a checkpoint
            self.ema = init_ema(state.model)
        else:
            self.ema = {k: v.to(state.device) for k, v in self.ema.items()}
        logger.log_note("ema", {"smoothing": self.smoothing})
        logger.log_text(f"ema: smoothing {self.smoothing:.6f} every {self.params['update_interval']} batch(es)")

    def _half_life_batches(self, state) -> float:
        half_life, total = self.params["half_life"], run_batches(state)
        if total is None and Time.from_input(half_life).unit is TimeUnit.DURATION:
            if half_life != DEFAULT_HALF_LIFE:
                raise ValueError(f"ema.half_life={half_life!r} is a fraction of the run, whose length in batches is "
                                 f"unknown here; give the half-life in batches, e.g. EMA(half_life='50ba')")
            warnings.warn(f"ema: the run's length in batches is unknown, so the default half-life (a tenth of the "
                          f"run) falls back to {FALLBACK_HALF_LIFE_BATCHES} batches; pass EMA(half_life='...ba') to "
                          f"choose it", stacklevel=2)
            return float(FALLBACK_HALF_LIFE_BATCHES)
        batches = half_life_in_batches(half_life, state)
        if total and batches > LONG_HALF_LIFE * total:
            warnings.warn(f"ema: a half-life of {batches:g} batches is {batches / total:.0%} of this {total:g}-batch "
                          f"run, so the averaged weights that evaluation and the final model see are still mostly "
                          f"the early ones; pass EMA(half_life='0.1dur') (a tenth of the run) or a shorter one",
                          stacklevel=2)
        return batches

    def averaged_weights(self) -> dict[str, torch.Tensor] | None:
        return self.ema

    def evaluates_average(self) -> bool:
        return True

    def ends_with_average(self) -> bool:
        return self.params["final_weights"] == "ema"

    @contextlib.contextmanager
    def training_weights_in(self, model: torch.nn.Module) -> Iterator[None]:
        """Inside, the model holds the training weights and ``self.ema`` the average, also mid-evaluation."""
        if not self._swapped_in:
            yield
            return
        swap_weights(model, self.ema)
        self._swapped_in = False
        try:
            yield
        finally:
            swap_weights(model, self.ema)
            self._swapped_in = True

    def state_dict(self) -> dict:
        if self.ema is None:
            return {}
        return {"ema": {k: v.clone() for k, v in self.ema.items()}, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        if state.get("ema") is not None:
            self.ema = {k: v.clone() for k, v in state["ema"].items()}
            self.updates = int(state.get("updates", 0))
