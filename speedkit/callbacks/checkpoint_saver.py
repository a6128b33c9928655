"""Periodic checkpoints at the checkpoint events, through the Trainer's own save function."""
from __future__ import annotations

from typing import Callable

from speedkit.core.engine import Callback
from speedkit.core.state import Interval


class CheckpointSaver(Callback):
    """Saves every ``interval`` (``"1ep"``, ``"200ba"``, ``"0.25dur"``) by calling ``save``."""

    def __init__(self, save: Callable[[], object], interval="1ep"):
        self.save = save
        self.interval = Interval(interval)

    def durations(self) -> dict:
        return {"save_interval": self.interval.every}

    def fit_start(self, state, logger):
        self.interval.start(state)

    # The interval's last mark rides in the checkpoint: fit_start runs before a resume loads one, so without it
    # a resumed run would save again one batch later, pushing an older good checkpoint out of the few kept.
    def state_dict(self) -> dict:
        return {"last_mark": self.interval._last_mark}

    def load_state_dict(self, state: dict) -> None:
        self.interval._last_mark = int(state.get("last_mark", self.interval._last_mark))

    def batch_checkpoint(self, state, logger):
        if self.interval.due(state, at_epoch_end=False):
            self.save()

    def epoch_checkpoint(self, state, logger):
        if self.interval.due(state, at_epoch_end=True):
            self.save()
