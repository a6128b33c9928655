"""The named points of a training run, in the order the Trainer reaches them."""
from __future__ import annotations

from enum import Enum


class Event(str, Enum):
    """Events fire in this order. FORWARD/LOSS/BACKWARD events repeat once per microbatch."""

    INIT = "init"
    FIT_START = "fit_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"  # after the optimizer step
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    FIT_END = "fit_end"

    @property
    def is_after(self) -> bool:
        """AFTER_* events undo what BEFORE_* events did, so methods run on them in reverse order."""
        return self.value.startswith("after_") or self.value.startswith("eval_after_")

    @property
    def is_eval(self) -> bool:
        return self.value.startswith("eval_")

    @property
    def is_per_microbatch(self) -> bool:
        return self in MICROBATCH_EVENTS


MICROBATCH_EVENTS = frozenset({
    Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD,
})

EVAL_EVENTS = tuple(event for event in Event if event.is_eval)
