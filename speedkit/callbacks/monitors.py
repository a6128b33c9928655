"""Small callbacks: learning-rate monitor, progress bar, stop-at-target and the NaN guard."""
from __future__ import annotations

import math
import os
import sys
import time

import torch

from speedkit.core import distributed
from speedkit.core.devices import to_host
from speedkit.core.engine import Callback
from speedkit.optim.follow import scale_learning_rates
from speedkit.record.runs import lower_is_better


class LRMonitor(Callback):
    """Logs each optimizer's learning rate (first param group) every logging step."""

    def batch_end(self, state, logger):
        if state.timestamp.batch % state.log_every:
            return
        metrics = {}
        for i, optimizer in enumerate(state.optimizers):
            key = "lr" if len(state.optimizers) == 1 else f"lr/{i}"
            metrics[key] = optimizer.param_groups[0]["lr"]
        logger.log_metrics(metrics)


PROGRESS_ENV = "SPEEDKIT_PROGRESS"  # 1 or 0: show progress bars or not, whoever is watching
_CI_ENV = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "TF_BUILD")


def someone_is_watching() -> bool:
    """Whether ``progress_bar="auto"`` shows a bar: yes in a terminal or a Jupyter kernel, no in a pipe, a
    log file or CI. ``SPEEDKIT_PROGRESS=1`` or ``0`` decides instead (``speedkit notebooks run`` sets 0 for
    the notebooks it executes: nobody watches a headless kernel)."""
    chosen = os.environ.get(PROGRESS_ENV, "").strip()
    if chosen in ("0", "1"):
        return chosen == "1"
    if any(os.environ.get(name, "").strip().lower() not in ("", "0", "false") for name in _CI_ENV):
        return False
    if "ipykernel" in sys.modules:  # a notebook: tqdm.auto draws a widget there
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def resolve_progress_bar(progress_bar: bool | str) -> bool:
    """``"auto"`` as ``someone_is_watching()``; True or False as given."""
    return someone_is_watching() if progress_bar == "auto" else bool(progress_bar)


class ProgressBar(Callback):
    """A tqdm.auto bar over the run's batches, showing loss and the latest eval metric."""

    def __init__(self):
        self.bar = None

    def fit_start(self, state, logger):
        from tqdm.auto import tqdm

        total = None
        if state.max_duration.unit.value in ("ep", "ba") and state.batches_per_epoch:
            total = int(round(state.convert(state.max_duration, "ba")))
        self.bar = tqdm(total=total, initial=state.timestamp.batch, unit="ba", dynamic_ncols=True,
                        mininterval=0.5)

    def batch_end(self, state, logger):
        if self.bar is None:
            return
        self.bar.update(state.timestamp.batch - self.bar.n)
        if state.timestamp.batch % state.log_every == 0 and state.last_train_loss is not None:
            postfix = {"loss": f"{state.last_train_loss:.4f}"}
            for label, metrics in state.eval_metrics.items():
                for name, value in list(metrics.items())[:1]:
                    postfix[f"{label}/{name}"] = f"{value:.4f}"
            self.bar.set_postfix(postfix, refresh=False)

    def fit_end(self, state, logger):
        self.close()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class ProgressLines(Callback):
    """A progress line at most every ``every_s`` seconds, for output nobody watches live (a pipe, a log file, CI),
    where a bar would not draw: where the run is, its share of the budget and the latest logged loss. It reads
    the clock on the host and the loss the step already brought over at its logging interval: no device wait."""

    def __init__(self, every_s: float = 30.0, stream=None):
        if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or not every_s > 0:
            raise ValueError(f"ProgressLines every_s must be a number of seconds above 0, got {every_s!r}")
        self.every_s, self.stream = float(every_s), stream
        self._last = None

    def fit_start(self, state, logger):
        self._last = time.monotonic()

    def batch_end(self, state, logger):
        now = time.monotonic()
        if self._last is None or now - self._last < self.every_s or not distributed.is_main():
            return
        self._last = now
        stamp = state.timestamp
        line = f"[ep {stamp.epoch} ba {stamp.batch} {stamp.wall_s:.1f}s] progress: {_share_done(state)}"
        if state.last_train_loss is not None:
            line += f", loss {state.last_train_loss:.4g}"
        print(line, file=self.stream or sys.stdout, flush=True)


def _share_done(state) -> str:
    """"120 of 900 batches (13%)" where the budget counts in batches or epochs, else the budget as it is given."""
    if state.max_duration.unit.value in ("ep", "ba") and state.batches_per_epoch:
        total = int(round(state.convert(state.max_duration, "ba")))
        return f"{state.timestamp.batch} of {total} batches ({100 * state.timestamp.batch / max(total, 1):.0f}%)"
    return f"{state.timestamp.batch} batches of a {state.max_duration} budget"


class StopAtTarget(Callback):
    """Ends the run at the first evaluation where ``metric`` reaches ``value`` (time-to-accuracy runs)."""

    def __init__(self, metric: str = "eval/accuracy", value: float = 0.92, stop: bool = True):
        if not isinstance(metric, str) or "/" not in metric:
            raise ValueError(f"stop-at-target metric must be a logged name such as 'eval/accuracy', got {metric!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"stop_at value must be a finite number (the target for {metric}), got {value!r}")
        self.metric, self.value, self.stop = metric, float(value), stop
        self.reached_at: dict | None = None

    def fit_start(self, state, logger):
        # A name no evaluator logs would never be reached: the run would go on silently to max_duration.
        known = [f"{'eval' if ev.label == 'eval' else 'eval/' + ev.label}/{name}"
                 for ev in getattr(state, "evaluators", None) or () for name in ev.metrics]
        if self.metric not in known:
            raise ValueError(f"stop_at metric {self.metric!r} is not logged by any evaluator; "
                             f"{'known: ' + ', '.join(known) if known else 'pass eval_dataloader or evaluators'}")
        if state.record is not None:
            state.record.target = {"metric": self.metric, "value": self.value}

    def eval_end(self, state, logger):
        label, _, name = self.metric.rpartition("/")
        current = state.eval_metrics.get(label, {}).get(name)
        if current is None or self.reached_at is not None:
            return
        lower = lower_is_better(self.metric)
        if (current <= self.value) if lower else (current >= self.value):
            ts = state.timestamp
            self.reached_at = {"wall_s": ts.wall_s, "batch": ts.batch, "sample": ts.sample, "value": current}
            logger.log_text(f"target {self.metric} {'<=' if lower else '>='} {self.value} reached "
                            f"after {ts.wall_s:.1f}s of training ({ts.batch} batches)")
            if self.stop:
                state.request_stop("target_reached")

    # A checkpoint written at the batch that reached the target (a periodic save there, or the final one) holds
    # that it was reached: a run resumed from it ends there too, instead of training on past its target.
    def state_dict(self) -> dict:
        return {"reached_at": self.reached_at}

    def load_state_dict(self, state: dict) -> None:
        self.reached_at = state.get("reached_at")

    @property
    def stop_after_resume(self) -> str | None:
        """The stop a run resumed from this state must make at once (read by the Checkpointer)."""
        return "target_reached" if self.stop and self.reached_at is not None else None


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite and the NaN guard's policy is to stop."""


class NaNGuard(Callback):
    """Keeps every update computed from a NaN/inf loss or gradient out of the weights, without a per-step wait.

    The check stays on the device, as ``GradScaler``'s ``found_inf`` does: each microbatch's loss and, after
    the last backward, the gradients are tested there, and a step found non-finite has its gradients
    zeroed before the optimizer sees them (a masked update: nothing of that step's loss or gradient reaches
    the weights or the optimizer's moments; momentum and weight decay act as for a gradient of zero, so plain
    SGD leaves the weights exactly as they were). The flag is read at the logging interval, before every
    evaluation and checkpoint, and at the end of the run (``read_device_checks``), where the policy acts:
    ``policy="stop"`` raises NonFiniteLossError naming the batch where it first happened (no checkpoint is
    written after it, so the last good one is intact); ``policy="skip"`` counts the step as skipped and
    multiplies every learning rate by ``lr_factor``, giving up after ``max_skips`` such steps. Under a
    ``GradScaler`` (fp16) the gradients are the scaler's to check: only the loss is tested.
    """

    POLICIES = ("stop", "skip")

    def __init__(self, policy: str = "stop", lr_factor: float = 0.5, max_skips: int = 10):
        if policy not in self.POLICIES:
            raise ValueError(f"NaNGuard policy must be one of {self.POLICIES}, got {policy!r}")
        if not 0 < lr_factor <= 1:
            raise ValueError(f"NaNGuard lr_factor must be in (0, 1], got {lr_factor}")
        self.policy, self.lr_factor, self.max_skips = policy, lr_factor, max_skips
        self.skips = 0
        self._step_bad = None  # this step's losses so far: any non-finite (device bool)
        self._step_loss = None  # the first non-finite loss of this step (device float)
        # Since the last read, one entry per step: (batch, epoch) on the host, and on the device whether the
        # step was non-finite, whether its loss was, and that loss. Stacked only when read, so that a step
        # adds no tensor work beyond its check.
        self._window: list[tuple[int, int]] = []
        self._bad: list[torch.Tensor] = []
        self._bad_loss: list[torch.Tensor] = []
        self._loss: list[torch.Tensor] = []

    # -- on the device, every step -------------------------------------------------------------
    def batch_start(self, state, logger):
        self._step_bad = self._step_loss = None

    def after_loss(self, state, logger):
        loss = state.loss
        if loss is None:
            return
        value = loss.detach().float()
        value = value.reshape(()) if value.numel() == 1 else value.sum()
        bad = ~torch.isfinite(value)
        if self._step_bad is None:
            self._step_bad, self._step_loss = bad, value
        else:
            self._step_loss = torch.where(self._step_bad, self._step_loss, value)
            self._step_bad = self._step_bad | bad

    def after_backward(self, state, logger):
        if state.microbatch_index != state.num_microbatches - 1 or self._step_bad is None:
            return  # the step's gradient is complete after its last microbatch
        grads = [_numbers_of(p.grad) for p in state.model.parameters() if p.grad is not None]
        loss_bad = self._step_bad
        bad = loss_bad if state.grad_scaler is not None else loss_bad | _any_non_finite(grads, loss_bad.device)
        zero_where(bad, grads)  # the masked update: a non-finite step's gradient never reaches the optimizer
        self._note_step(state, bad, loss_bad)

    def _note_step(self, state, bad, loss_bad) -> None:
        self._window.append((state.timestamp.batch, state.timestamp.epoch))
        self._bad.append(bad)
        self._bad_loss.append(loss_bad)
        self._loss.append(self._step_loss)
        self._step_bad = None

    # -- read at the wait points --------------------------------------------------------------
    def batch_end(self, state, logger):
        if state.timestamp.batch % state.log_every == 0 or state.is_done() or state.stop_requested:
            self.read_device_checks(state, logger)

    def read_device_checks(self, state, logger):
        """Read the flag (one wait) and apply the policy to the steps found non-finite since the last read."""
        if not self._window:
            return
        bad = torch.stack(self._bad)
        first = bad.int().argmax()  # the first non-finite step (argmax gives the first of equal maxima)
        found, first_step, bad_steps, in_loss, first_loss = to_host(torch.stack([
            bad.any().double(), first.double(), bad.sum().double(), torch.stack(self._bad_loss)[first].double(),
            torch.stack(self._loss)[first].double()]))
        window = self._window
        self._window, self._bad, self._bad_loss, self._loss = [], [], [], []
        # Under torchrun every rank must take the same branch (skip or stop): a non-finite step on any rank
        # counts on all of them. One collective per read, not per step.
        if not distributed.any_rank(bool(found)):
            return
        if found:
            batch, epoch = window[int(first_step)]
            where = f"batch {batch} (epoch {epoch})"
            what = f"the loss is {first_loss}" if in_loss else "a gradient is non-finite"
        else:
            where, what, bad_steps = "a recent batch", "the loss is non-finite on another rank", max(bad_steps, 1)
        for _ in range(int(bad_steps) or 1):
            if self.policy == "stop" or self.skips >= self.max_skips:
                raise NonFiniteLossError(
                    f"{what} at {where}; stopped before it reached the weights. "
                    f"Lower the learning rate, use precision='bf16' instead of 'fp16', add gradient clipping, or "
                    f"use NaNGuard(policy='skip'). No checkpoint is written after it, so the run's last checkpoint "
                    f"(if it wrote one) holds the weights from before.")
            self.skips += 1
            self._lower_learning_rates(state)
        logger.log_text(f"NaN guard: {what} at {where}; {int(bad_steps) or 1} step(s) skipped, learning rates "
                        f"x{self.lr_factor} each ({self.skips}/{self.max_skips})")

    def _lower_learning_rates(self, state) -> None:
        scale_learning_rates(state.optimizers, self.lr_factor)  # the bases too: a schedule would undo the cut

    def state_dict(self):
        return {"skips": self.skips}

    def load_state_dict(self, state):
        self.skips = int(state.get("skips", 0))


def _numbers_of(grad: torch.Tensor) -> torch.Tensor:
    """The plain dense tensor that holds a gradient's numbers on this rank: the gradient, FSDP's sharded one's local
    shard, or a sparse one's values (each an alias, so that zeroing it zeroes the gradient). The check and the masked
    update run on plain dense tensors only: a DTensor's op costs the host tens of microseconds of sharding rules, a
    fill per gradient about 6 ms a step for GPT-2's 148."""
    if distributed.is_dtensor(grad):
        with torch.no_grad():  # to_local outside autograd: the shard itself, without a backward to record
            grad = grad.to_local()
    if grad.layout == torch.sparse_coo:
        return grad._values()
    if grad.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return grad.values()
    return grad


# Integers as wide as each float dtype, to multiply gradients as bit patterns.
_SAME_WIDTH_INTEGER = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def zero_where(bad: torch.Tensor, grads: list) -> None:
    """Zero every (dense) gradient in ``grads`` where ``bad`` (a device bool) is true and leave each of their bits
    as it is where it is false, without reading ``bad`` on the host.

    A multiply by zero keeps a NaN and makes one of an inf, and torch's multi-tensor ops are all arithmetic, so the
    gradients are multiplied as integers of their width (a view of their bits): times 1 they keep every bit, times
    0 they are +0.0. That is one multi-tensor op for all of a device's gradients of one width instead of a fill per
    gradient (about 160 kernels a step for ResNet-50). Tensor subclasses are filled one by one.
    """
    by_width: dict = {}
    for grad in grads:
        integer = _SAME_WIDTH_INTEGER.get(grad.element_size())
        if type(grad) is torch.Tensor and integer is not None:
            by_width.setdefault((grad.device, integer), []).append(grad.view(integer))
        else:
            grad.masked_fill_(bad.to(grad.device, non_blocking=True), 0)
    for (device, integer), bits in by_width.items():
        torch._foreach_mul_(bits, (~bad).to(device, integer, non_blocking=True))


def _any_non_finite(grads: list, device) -> torch.Tensor:
    """Whether any gradient holds a NaN or inf, as a device bool: one fused check per device and dtype."""
    groups: dict = {}
    for grad in grads:
        groups.setdefault((grad.device, grad.dtype), []).append(grad)
    flags = []
    for (grad_device, _), group in groups.items():
        flag = torch.zeros((), device=grad_device)
        # GradScaler's own check; an inverse scale of 1 leaves the gradients exactly as they are.
        torch._amp_foreach_non_finite_check_and_unscale_(group, flag, torch.ones((), device=grad_device))
        flags.append(flag.to(device, non_blocking=True))
    if not flags:
        return torch.zeros((), dtype=torch.bool, device=device)
    return (flags[0] if len(flags) == 1 else torch.stack(flags).sum()) > 0
