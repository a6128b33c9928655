"""What low_precision_groupnorm and low_precision_layernorm share: the surgery that swaps a norm for its
low-precision subclass (same parameters), the card, and the Method that runs the surgery at INIT.

Each method module keeps only what differs: its norm subclass's forward and how to copy a norm.
"""
from __future__ import annotations

from typing import Callable

import torch.nn as nn

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery, replace_modules


def replace_norms(model: nn.Module, norm_class: type[nn.Module], low_precision_copy: Callable, method: str,
                  kind: str, allow_empty: bool) -> SurgeryReport:
    """Replace every ``norm_class`` (exact class) in ``model`` by ``low_precision_copy(norm)``."""
    report = SurgeryReport(method)
    replace_modules(model, lambda name, m: type(m) is norm_class, lambda name, m: low_precision_copy(m),
                    report, kind)
    return report.require_changes(allow_empty, f"nn.{norm_class.__name__} layers")


def low_precision_norm_card(name: str, norm: str, domain: str) -> MethodCard:
    """The card of a low-precision norm method; ``norm`` is the torch class name ("GroupNorm")."""
    return MethodCard(
        name=name,
        summary=f"Run {norm} in the autocast dtype (bf16/fp16) instead of fp32; unchanged without autocast.",
        domain=domain,
        events=(Event.INIT,),
        reads=("model", "precision"),
        writes=("model",),
        hparams=(HParam("allow_empty", bool, False, help=f"do not fail on a model without {norm}"),),
        requirements=("autocast precision (bf16 or fp16) to have an effect", f"nn.{norm} layers"),
        effect=f"higher throughput under AMP by skipping fp32 casts around each {norm} (Composer); numerics "
               "slightly less precise",
        source=f"Composer LowPrecision{norm} docs",
    )


class LowPrecisionNormMethod(Method):
    """Runs the method module's surgery (``surgery``) at INIT and notes when no autocast will use it."""

    surgery: Callable[..., SurgeryReport]

    def apply(self, event, state, logger):
        report = type(self).surgery(state.model, **self.params)
        if state.precision not in ("bf16", "fp16"):
            report.details.append(f"note: precision is {state.precision}; the norms act only under autocast")
        record_surgery(logger, report)
