"""Checks every host makes where a method would otherwise do nothing without a word: an evaluation that ran
without the calls a method needs (test-time augmentation with no ``eval_outputs`` call), and gradient clipping
asked of both speedkit and the host."""
from __future__ import annotations

from speedkit.core import Event, Method
from speedkit.hosts.session import HostCannotServeError, MethodSession, _may_act

EVAL_BATCH_EVENTS = (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD,
                     Event.EVAL_BATCH_END)


def unserved_eval_events(session: MethodSession) -> list[tuple[Method, list[Event]]]:
    """Methods whose evaluation-batch events did not run in the evaluation just finished."""
    missing = []
    for method in session.methods:
        events = [e for e in method.CARD.events if e in EVAL_BATCH_EVENTS and e not in session.served
                  and _may_act(method, e, session.state)]
        if events:
            missing.append((method, events))
    return missing


def check_evaluation_served(session: MethodSession, where: str, fix_for) -> None:
    """Refuse, at the end of the first evaluation, a method whose evaluation events that evaluation did not
    reach (a call missing, or inside a branch that did not run): it would have done nothing, silently.
    ``fix_for(events)`` is the line to add."""
    missing = unserved_eval_events(session)
    if missing:
        method, events = missing[0]
        raise HostCannotServeError(f"{method.name} needs {', '.join(e.value for e in events)}, which {where} did "
                                   f"not reach, so it did nothing: {fix_for(events)}")


def refuse_double_clipping(methods, host_clips: bool, host: str, fix: str) -> None:
    """speedkit's gradient_clipping and the host's own clipping would clip every step twice: refuse it now."""
    if host_clips and any(m.name == "gradient_clipping" for m in methods):
        raise HostCannotServeError(f"gradient_clipping and {host}'s own gradient clipping would both clip every "
                                   f"step; keep one: {fix}")
