"""What the ``speedkit`` command shows a person: one method's card as text (``speedkit methods NAME``), and
warnings as one ``speedkit: warning: ...`` line each, not Python's ``file:line: UserWarning`` with a source line
from inside site-packages."""
from __future__ import annotations

import contextlib
import re
import sys
import warnings


def method_card_text(name: str) -> str:
    """One method's card for a person: its class (as imported), what it does, its parameters with their
    defaults and ranges, where it acts, what it needs, conflicts, its measured effect and its source."""
    from speedkit.methods import get_method

    cls = type(get_method(name))  # refuses an unknown name, listing the known ones
    card = cls.CARD
    exported = getattr(sys.modules["speedkit.methods"], cls.__name__, None) is cls
    module = "speedkit.methods" if exported else cls.__module__
    lines = [f"{card.name}: {card.summary}", f"  class:        {module}.{cls.__name__}({_call(card)})",
             f"  domain:       {card.domain}", f"  acts at:      {', '.join(e.value for e in card.events)}"]
    if card.hparams:
        lines.append("  parameters:")
        for h in card.hparams:
            bounds = (f" in {list(h.choices)}" if h.choices else
                      f" in [{h.low:g}, {h.high:g}]" if h.low is not None and h.high is not None else "")
            lines.append(f"    {h.name} ({h.type.__name__}, default {h.default!r}{bounds}): {h.help}".rstrip(": "))
    for title, items in (("needs", card.requirements), ("conflicts", [f"{k}: {v}" for k, v in card.conflicts.items()])):
        if items:
            lines.append(f"  {title}:")
            lines += [f"    - {item}" for item in items]
    lines += [f"  {title:<13} {value}" for title, value in (("effect:", card.effect), ("source:", card.source))
              if value]
    return "\n".join(lines)


def _call(card) -> str:
    return ", ".join(f"{h.name}={h.default!r}" for h in card.hparams[:3]) + (", ..." if len(card.hparams) > 3 else "")


def plain_text(docstring: str) -> str:
    """A docstring's first paragraph as plain text for a terminal: its lines joined, reStructuredText's inline
    markup (````code````, ``:role:`target```, ```text```) reduced to the text it marks."""
    paragraph = " ".join(line.strip() for line in (docstring or "").strip().split("\n\n")[0].splitlines())
    paragraph = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", paragraph)
    return re.sub(r"``([^`]+)``|`([^`]+)`", lambda m: m.group(1) or m.group(2), paragraph)


@contextlib.contextmanager
def warning_lines():
    """While the command runs, warnings print as ``speedkit: warning: MESSAGE`` (the message says what and the
    fix; where in speedkit's code it was raised is of no use at the command line). Only the printed format
    changes: a caller that records warnings (pytest, ``catch_warnings(record=True)``) still gets them."""

    def one_line(message, category, filename, lineno, line=None):
        kind = "" if category is UserWarning else f" ({category.__name__})"
        return f"speedkit: warning{kind}: {message}\n"

    saved = warnings.formatwarning
    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = saved
