"""The Engine runs the matching methods, then the callbacks, at each event, and keeps a trace."""
from __future__ import annotations

import collections
import functools
import time
from typing import Callable, Sequence

from speedkit.core.event import EVAL_EVENTS, Event
from speedkit.core.method import Method, check_compatibility, order_methods


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


_FIT_START = Event.FIT_START  # a module constant: an Enum member looked up on its class costs ~0.2 us


def _handler(event: Event, callback) -> Callable | None:
    """What the engine calls for ``event`` on ``callback``: the method named after the event, or, for a callback
    that overrides ``run_event`` itself (it sees every event), that."""
    if type(callback).run_event is not Callback.run_event:
        return functools.partial(callback.run_event, event)
    return getattr(callback, event.value, None)


class Engine:
    """Dispatches events. Methods run in card order (reversed on AFTER_* events), callbacks after.

    ``trace`` counts (event, method) applications for the whole run; ``recent`` keeps the last
    few thousand ``(batch, event, method)`` entries for inspection without growing forever;
    ``seconds`` adds up the wall time methods spent in ``apply`` at the events the Trainer accounts for
    (FIT_START and the evaluation events: it counts the work methods do at evaluation, such as test-time
    augmentation and weight swaps, as training time); ``profile = True`` times methods at every event.
    Off the profile, an event on the step's path costs a loop over the methods' ``match`` and a call to each
    callback that handles it. Which callbacks handle which event is looked up once (``_build_handler_table``),
    so an event that nobody handles costs a dictionary lookup and an empty loop.
    """

    TIMED_EVENTS = frozenset({Event.FIT_START, *EVAL_EVENTS})

    def __init__(self, state, logger, trace_size: int = 5000, profile: bool = False):
        self.profile = profile
        self.state = state
        self.logger = logger
        self.trace: collections.Counter = collections.Counter()
        self.recent: collections.deque = collections.deque(maxlen=trace_size)
        self.seconds: collections.Counter = collections.Counter()
        self._handler_table: dict[Event, list[Callable]] = {}
        self._handled: tuple[list, int] | None = None  # the callback list the table was built from, and its length
        self.set_methods(state.methods)

    def set_methods(self, methods: Sequence[Method]) -> None:
        check_compatibility(methods)
        self.state.methods = order_methods(methods)

    def run_event(self, event: Event) -> None:
        state = self.state
        if event is _FIT_START:
            # Checked again at fit start: methods and callbacks may have been added after INIT.
            self.set_methods(state.methods)
            self._handled = None
        if state.methods:
            self._run_methods(event, state)
        callbacks = state.callbacks
        if self._handled is None or self._handled[0] is not callbacks or self._handled[1] != len(callbacks):
            self._build_handler_table(callbacks)
        for handler in self._handler_table[event]:
            handler(state, self.logger)

    def _run_methods(self, event: Event, state) -> None:
        for method in reversed(state.methods) if event.is_after else state.methods:
            if method.match(event, state):
                if self.profile or event in self.TIMED_EVENTS:
                    start = time.perf_counter()
                    method.apply(event, state, self.logger)
                    self.seconds[event] += time.perf_counter() - start
                else:
                    method.apply(event, state, self.logger)
                self.trace[(event, method.name)] += 1
                self.recent.append((state.timestamp.batch, event, method.name))

    def _build_handler_table(self, callbacks: list) -> None:
        """Each event's handlers, in the callbacks' order; rebuilt when the callback list changes."""
        self._handler_table = {e: [h for h in (_handler(e, c) for c in callbacks) if h is not None] for e in Event}
        self._handled = (callbacks, len(callbacks))

    def events_of(self, name: str) -> dict[Event, int]:
        """How many times the named method acted at each event."""
        return {event: n for (event, algo), n in self.trace.items() if algo == name}

    def seconds_at(self, events) -> float:
        """Wall seconds methods have spent in ``apply`` at any of ``events`` so far (events outside
        ``TIMED_EVENTS`` are timed only with ``profile``)."""
        return sum(self.seconds[event] for event in events)
