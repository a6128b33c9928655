"""Progressive resizing: train on downscaled images early, grow them to full size, finish at full size.

Early in training a network learns coarse features that low-resolution images show just as well, at
a fraction of the cost (compute scales with the pixel count). The scale starts at ``initial_scale``,
optionally stays there for ``delay_fraction`` of the run, grows linearly, and reaches 1 when
``finetune_fraction`` of the run is left, which is spent at full resolution so the network adapts to the
test-time size. Sizes are rounded to a multiple of ``size_increment``, 32 px by default as FFCV's ImageNet
resolution schedule rounds them: each new input shape costs a GPU a round of cuDNN autotuning and a compiled
model a recompile, so a run sees a few sizes (five from 112 to 224 px), not one every few steps. An image under
four increments across is rounded to the largest power of two up to a quarter of its side instead, so it still
has sizes to grow through.

``eval_scale > 1`` evaluates at a higher resolution than training ends at: random-resized-crop training
makes objects look larger than at test time, and FFCV's ImageNet recipes (train 160-192, test 224-256)
gain accuracy from testing larger. It needs a model with global pooling; check it on a held-out set.
Source: fastai (progressive resizing); Composer ProgressiveResizing docs (about 1.3x; start 0.5, finetune
the last 20%); FFCV ResNet-50 recipes; Touvron et al. 2019, "Fixing the train-test resolution discrepancy".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speedkit.core.batch import with_inputs, with_targets
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.core.time import Time, TimeUnit
from speedkit.methods.channels_last import is_channels_last


def progressive_scale(fraction_done: float, initial_scale: float = 0.5, finetune_fraction: float = 0.2,
                      delay_fraction: float = 0.0) -> float:
    """The image scale at ``fraction_done`` of training: ``initial_scale`` (held for ``delay_fraction``),
    then linear growth to 1.0, reached when ``finetune_fraction`` of the run is left."""
    if not 0.0 < initial_scale <= 1.0:
        raise ValueError(f"initial_scale must be in (0, 1], got {initial_scale}")
    if delay_fraction < 0 or finetune_fraction < 0 or delay_fraction + finetune_fraction > 1.0:
        raise ValueError(f"delay_fraction ({delay_fraction}) and finetune_fraction ({finetune_fraction}) must be "
                         f">= 0 and add up to at most 1")
    grow_end = 1.0 - finetune_fraction
    if fraction_done >= grow_end:
        return 1.0
    if fraction_done <= delay_fraction:
        return initial_scale
    progress = (fraction_done - delay_fraction) / (grow_end - delay_fraction)
    return initial_scale + (1.0 - initial_scale) * progress


SIZE_INCREMENT = 32


def size_step(size: int, size_increment: int = SIZE_INCREMENT) -> int:
    """The step between the sizes an image of side ``size`` is resized to: ``size_increment``, or for an image under
    four increments across, the largest power of two up to a quarter of its side (at least 1)."""
    quarter = max(1, size // 4)
    return max(1, min(size_increment, 1 << (quarter.bit_length() - 1)))


def scaled_size(size: int, scale: float, size_increment: int = SIZE_INCREMENT) -> int:
    """``size * scale`` rounded to a multiple of ``size_step(size, size_increment)`` (at least one step)."""
    if scale == 1.0:
        return size
    increment = size_step(size, size_increment)
    return max(increment, int(round(size * scale / increment)) * increment)


def resize_batch(x: torch.Tensor, scale: float, size_increment: int = SIZE_INCREMENT,
                 targets: torch.Tensor | None = None,
                 size: tuple[int, int] | None = None):
    """Images [N, C, H, W] resized by ``scale`` (bilinear; antialiased when shrinking), or to ``size`` when given.

    Returns the images, or ``(images, targets)`` when ``targets`` is given: per-pixel targets with the
    images' height and width (segmentation masks) are resized with nearest-neighbour, others pass through.
    """
    if x.dim() != 4:
        raise ValueError(f"resize_batch needs images [N, C, H, W], got shape {list(x.shape)}")
    height, width = x.shape[-2:]
    new_size = tuple(size) if size is not None else (scaled_size(height, scale, size_increment),
                                                     scaled_size(width, scale, size_increment))
    if new_size != (height, width):
        shrinking = new_size[0] * new_size[1] < height * width
        channels_last = is_channels_last(x)
        resized = F.interpolate(x.float(), size=new_size, mode="bilinear", align_corners=False,
                                antialias=shrinking).to(x.dtype)
        if channels_last:
            resized = resized.contiguous(memory_format=torch.channels_last)
        if targets is not None and targets.dim() >= 3 and tuple(targets.shape[-2:]) == (height, width):
            dense = targets.dim() == 4
            as_images = (targets if dense else targets.unsqueeze(1)).float()
            targets = F.interpolate(as_images, size=new_size, mode="nearest").to(targets.dtype)
            targets = targets if dense else targets.squeeze(1)
        x = resized
    return x if targets is None else (x, targets)


class ProgressiveResizing(Method):
    CARD = MethodCard(
        name="progressive_resizing",
        summary="Train on smaller images early, grow to full size; optionally evaluate larger.",
        domain="vision",
        events=(Event.AFTER_DATALOADER, Event.EVAL_BEFORE_FORWARD),
        reads=("batch",),
        writes=("batch",),
        hparams=(
            HParam("initial_scale", float, 0.5, low=0.1, high=1.0, step=0.05, help="image scale at the start"),
            HParam("finetune_fraction", float, 0.2, low=0.0, high=1.0, step=0.05,
                   help="final fraction of the run at full size"),
            HParam("delay_fraction", float, 0.0, low=0.0, high=0.9, step=0.05,
                   help="first fraction of the run held at initial_scale (Composer uses 0.4)"),
            HParam("size_increment", int, SIZE_INCREMENT, low=1, high=64, step=1,
                   help="sizes are multiples of this (a power of two up to a quarter of the side for small images): "
                        "few distinct shapes for cuDNN's autotuner and torch.compile"),
            HParam("eval_scale", float, 1.0, low=1.0, high=1.5, step=0.05,
                   help="evaluate at this multiple of the full training size (1.0 = off)"),
        ),
        requirements=("image batches [N, C, H, W]",
                      "a model that accepts any input size (global pooling before the classifier)"),
        effect="about 1.3x faster to target on ImageNet ResNet-50 (Composer, start 0.5, finetune last 20%); "
               "fastai: 86.3% vs 82.5% on Imagenette in less time; testing at a higher resolution adds "
               "accuracy in FFCV's recipes",
        source="fastai; Composer ProgressiveResizing docs; FFCV ImageNet recipes; Touvron et al. 2019",
    )

    def __init__(self, **params):
        super().__init__(**params)
        p = self.params
        if p["delay_fraction"] + p["finetune_fraction"] > 1.0:
            raise ValueError(f"progressive_resizing.delay_fraction ({p['delay_fraction']}) + finetune_fraction "
                             f"({p['finetune_fraction']}) must be at most 1")

    def match(self, event, state) -> bool:
        if event is Event.EVAL_BEFORE_FORWARD:
            return self.params["eval_scale"] != 1.0
        return event in self.CARD.events

    def _streamed_size(self, state, loader, scale: float) -> tuple[int, int]:
        """A loader that decodes at a size it is told (``speedkit.data.streaming``): ask it for the size the next
        epoch ends at, so early epochs decode small; this batch goes to this step's size, from the full one."""
        p, full = self.params, loader.full_image_size
        try:
            end = state.convert(Time(state.timestamp.epoch + 2, TimeUnit.EPOCH), state.max_duration.unit)
            fraction = min(1.0, end / state.max_duration.value)
        except ValueError:  # a budget in seconds: the end of the next epoch is not known in advance
            fraction = 1.0
        upcoming = progressive_scale(fraction, p["initial_scale"], p["finetune_fraction"], p["delay_fraction"])
        loader.set_image_size(max(scaled_size(full, upcoming, p["size_increment"]), 4))
        side = scaled_size(full, scale, p["size_increment"])
        return (side, side)

    def current_scale(self, state) -> float:
        p = self.params
        return progressive_scale(state.fraction_done(), p["initial_scale"], p["finetune_fraction"],
                                 p["delay_fraction"])

    def apply(self, event, state, logger):
        x, targets = state.batch_inputs(), state.batch_targets()
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"progressive_resizing needs image batches [N, C, H, W], got "
                             f"{getattr(x, 'shape', type(x))}; remove it for this task")
        scale = self.params["eval_scale"] if event is Event.EVAL_BEFORE_FORWARD else self.current_scale(state)
        size = None
        loader = state.train_dataloader
        if event is Event.AFTER_DATALOADER and hasattr(loader, "set_image_size"):
            size = self._streamed_size(state, loader, scale)
        x, targets = resize_batch(x, scale, self.params["size_increment"], targets=targets, size=size)
        state.batch = with_inputs(state.batch, x)
        if targets is not None:
            state.batch = with_targets(state.batch, targets)
