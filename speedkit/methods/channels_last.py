"""Channels-last memory format: NHWC tensors let convolution kernels run faster (GPU tensor cores, oneDNN on CPU)."""
from __future__ import annotations

import torch

from speedkit.core.batch import with_inputs
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery


def apply_channels_last(model: torch.nn.Module, allow_empty: bool = False) -> SurgeryReport:
    """Convert every 4-D parameter/buffer of ``model`` to channels_last in place; returns what changed."""
    report = SurgeryReport("channels_last")
    for name, module in model.named_modules():
        for pname, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if p.dim() == 4 and not p.is_contiguous(memory_format=torch.channels_last):
                report.add("4-D tensors", f"{name + '.' if name else ''}{pname}")
    model.to(memory_format=torch.channels_last)
    return report.require_changes(allow_empty, "4-D weights (convolutions)")


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is a 4-D tensor laid out channels_last (and not also plain contiguous, as a 1x1 one is)."""
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def to_channels_last(images: torch.Tensor) -> torch.Tensor:
    """A batch of images in channels_last layout (a no-op for tensors that are not 4-D)."""
    return images.contiguous(memory_format=torch.channels_last) if images.dim() == 4 else images


class ChannelsLast(Method):
    CARD = MethodCard(
        name="channels_last",
        summary="Store conv weights and image batches as NHWC so convolutions use faster kernels.",
        domain="vision",
        events=(Event.INIT, Event.AFTER_DATALOADER, Event.EVAL_BATCH_START),
        reads=("model",),
        writes=("model", "batch"),
        hparams=(HParam("allow_empty", bool, False, help="do not fail on a model without convolutions"),),
        requirements=("a model with Conv2d layers",),
        effect="up to 1.5x throughput on GPU with AMP (Composer); pays with bf16 autocast on a CPU too",
        source="Composer ChannelsLast docs; measured here: bench/results/summary.json (plain-bf16 against plain)",
    )

    def apply(self, event, state, logger):
        if event is Event.INIT:
            report = apply_channels_last(state.model, allow_empty=self.params["allow_empty"])
            record_surgery(logger, report)
            return
        inputs = state.batch_inputs()
        if isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            state.batch = with_inputs(state.batch, to_channels_last(inputs))
