"""The Engine runs the matching algorithms, then the callbacks, at each event, and keeps a trace."""
from __future__ import annotations

import collections
import time
from typing import Sequence

from speedkit.core.algorithm import Algorithm, check_compatibility, order_algorithms
from speedkit.core.event import Event


class Callback:
    """Base class of callbacks: override a method named after the event, e.g. ``batch_end``."""

    def run_event(self, event: Event, state, logger) -> None:
        handler = getattr(self, event.value, None)
        if handler is not None:
            handler(state, logger)

    def durations(self) -> dict:
        """The durations this callback counts in, by the argument that set them (checked against the
        batches: a duration in tokens needs batches that carry tokens)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Engine:
    """Dispatches events. Algorithms run in card order (reversed on AFTER_* events), callbacks after.

    ``trace`` counts (event, algorithm) applications for the whole run; ``recent`` keeps the last
    few thousand ``(batch, event, algorithm)`` entries for inspection without growing forever;
    ``seconds`` adds up the wall time algorithms spent in ``apply`` per event, so the Trainer can count
    the work methods do at evaluation (test-time augmentation, weight swaps) as training time.
    """

    def __init__(self, state, logger, trace_size: int = 5000):
        self.state = state
        self.logger = logger
        self.trace: collections.Counter = collections.Counter()
        self.recent: collections.deque = collections.deque(maxlen=trace_size)
        self.seconds: collections.Counter = collections.Counter()
        self.set_algorithms(state.algorithms)

    def set_algorithms(self, algorithms: Sequence[Algorithm]) -> None:
        check_compatibility(algorithms)
        self.state.algorithms = order_algorithms(algorithms)

    def run_event(self, event: Event) -> None:
        state = self.state
        if event is Event.FIT_START:
            # Checked again at fit start: algorithms may have been added after INIT.
            self.set_algorithms(state.algorithms)
        algorithms = reversed(state.algorithms) if event.is_after else state.algorithms
        for algorithm in algorithms:
            if algorithm.match(event, state):
                start = time.perf_counter()
                algorithm.apply(event, state, self.logger)
                self.seconds[event] += time.perf_counter() - start
                self.trace[(event, algorithm.name)] += 1
                self.recent.append((state.timestamp.batch, event, algorithm.name))
        for callback in state.callbacks:
            callback.run_event(event, state, self.logger)

    def events_of(self, name: str) -> dict[Event, int]:
        """How many times the named algorithm acted at each event."""
        return {event: n for (event, algo), n in self.trace.items() if algo == name}

    def seconds_at(self, events) -> float:
        """Wall seconds algorithms have spent in ``apply`` at any of ``events`` so far."""
        return sum(self.seconds[event] for event in events)
