"""Small callbacks: learning-rate monitor, progress bar, stop-at-target and the NaN guard."""
from __future__ import annotations

import math

import torch

from speedkit.core import distributed
from speedkit.core.engine import Callback
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


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite and the NaN guard's policy is to stop."""


class NaNGuard(Callback):
    """Catches a NaN/inf loss before it reaches the weights.

    ``policy="stop"`` raises NonFiniteLossError before backward, so the weights and the last good
    checkpoint are untouched. ``policy="skip"`` drops that step and multiplies every learning rate by
    ``lr_factor``, giving up after ``max_skips`` such steps.
    """

    POLICIES = ("stop", "skip")

    def __init__(self, policy: str = "stop", lr_factor: float = 0.5, max_skips: int = 10):
        if policy not in self.POLICIES:
            raise ValueError(f"NaNGuard policy must be one of {self.POLICIES}, got {policy!r}")
        if not 0 < lr_factor <= 1:
            raise ValueError(f"NaNGuard lr_factor must be in (0, 1], got {lr_factor}")
        self.policy, self.lr_factor, self.max_skips = policy, lr_factor, max_skips
        self.skips = 0

    def after_loss(self, state, logger):
        loss = state.loss
        if loss is None:
            return
        finite = bool(torch.isfinite(loss.detach()).all())
        # Under torchrun every rank must take the same branch (skip or stop), or DDP would wait forever for
        # the gradients of the rank that skipped: a non-finite loss on any rank counts on all of them.
        if not distributed.any_rank(not finite):
            return
        where = f"batch {state.timestamp.batch} (epoch {state.timestamp.epoch})"
        if self.policy == "stop" or self.skips >= self.max_skips:
            raise NonFiniteLossError(
                f"the loss is {loss.detach().float().item() if not finite else 'non-finite on another rank'} at "
                f"{where}; stopped before it reached the weights. "
                f"Lower the learning rate, use precision='bf16' instead of 'fp16', add gradient clipping, or "
                f"use NaNGuard(policy='skip'). The last checkpoint is intact.")
        self.skips += 1
        state.skip_step = True
        for optimizer in state.optimizers:
            for group in optimizer.param_groups:
                group["lr"] *= self.lr_factor
                if "initial_lr" in group:
                    group["initial_lr"] *= self.lr_factor
        logger.log_text(f"NaN guard: non-finite loss at {where}; step skipped, learning rates x{self.lr_factor} "
                        f"({self.skips}/{self.max_skips})")

    def state_dict(self):
        return {"skips": self.skips}

    def load_state_dict(self, state):
        self.skips = int(state.get("skips", 0))

