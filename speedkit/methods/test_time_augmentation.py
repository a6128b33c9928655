"""Test-time augmentation: average the model's logits over several views of each evaluation image.

Views: the image and its horizontal mirror; with ``shifts`` 1 or 2, also the mirrored pair translated
by one pixel (down-right, and with 2 also up-left, reflect-padded). Following airbench, the untranslated
pair and the translated pairs each get half the weight. Costs 2x (flip) to 6x (flip + 2 shifts) the
evaluation compute, nothing in training; airbench evaluates with these 6 views in its CIFAR-10 speed-runs,
so that fewer training epochs reach the target accuracy.
Source: Jordan 2024, airbench (multi-view TTA); fastai ``tta``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speedkit.core.batch import BatchShapeError, describe_shape, is_dict_batch
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard


def translated_views(x: torch.Tensor, shifts: int) -> list[torch.Tensor]:
    """``shifts`` (0-2) copies of images [N, C, H, W] moved by one pixel: down-right, then up-left."""
    if shifts == 0:
        return []
    height, width = x.shape[-2:]
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    offsets = [(0, 0), (2, 2)][:shifts]  # crop origin in the padded image: (0, 0) = shifted down-right
    return [padded[..., top:top + height, left:left + width] for top, left in offsets]


def _mirror_average(model, x: torch.Tensor, flip: bool, logits: torch.Tensor | None = None) -> torch.Tensor:
    logits = model(x) if logits is None else logits
    return 0.5 * (logits + model(x.flip(-1))) if flip else logits


def tta_logits(model: torch.nn.Module, x: torch.Tensor, flip: bool = True, shifts: int = 0,
               original_logits: torch.Tensor | None = None) -> torch.Tensor:
    """The model's logits for images ``x`` averaged over views (original, mirror, 1-pixel translations).

    ``original_logits`` (the model's output on ``x``, if already computed) saves one forward pass.
    Call it under ``torch.no_grad()`` and with the model in eval mode, as for any evaluation.
    """
    if x.dim() != 4:
        raise ValueError(f"test-time augmentation needs images [N, C, H, W], got shape {list(x.shape)}")
    if shifts not in (0, 1, 2):
        raise ValueError(f"shifts must be 0, 1 or 2, got {shifts}")
    logits = _mirror_average(model, x, flip, original_logits)
    views = translated_views(x, shifts)
    if not views:
        return logits
    translated = torch.stack([_mirror_average(model, view, flip) for view in views]).mean(0)
    return 0.5 * logits + 0.5 * translated


class TestTimeAugmentation(Method):
    __test__ = False  # not a pytest test class despite its name

    CARD = MethodCard(
        name="test_time_augmentation",
        summary="Average evaluation logits over the image, its mirror and optional 1-pixel shifts.",
        domain="vision",
        events=(Event.EVAL_AFTER_FORWARD,),
        reads=("eval",),
        writes=("eval",),
        hparams=(
            HParam("flip", bool, True, help="add the horizontally mirrored view"),
            HParam("shifts", int, 0, low=0, high=2, step=1,
                   help="1-pixel translated (mirror) pairs: 0 off, 1 down-right, 2 both ways (airbench's 6 views)"),
        ),
        requirements=("image batches [N, C, H, W]", "images where a mirror keeps the label (for flip)"),
        effect="higher eval accuracy for 2-6x eval compute (airbench's CIFAR-10 speed-runs use the 6 views), "
               "so fewer training epochs reach a target; no training cost",
        source="Jordan 2024, airbench; fastai tta",
    )

    def match(self, event, state) -> bool:
        return event in self.CARD.events and (self.params["flip"] or self.params["shifts"] > 0)

    def apply(self, event, state, logger):
        if is_dict_batch(state.batch):
            raise BatchShapeError(f"test_time_augmentation cannot act on this batch ({describe_shape(state.batch)}): "
                                  f"it calls the model on transformed inputs alone, and a dict batch's model takes "
                                  f"the whole dict; yield (inputs, targets) tuples or remove test_time_augmentation")
        x = state.batch_inputs()
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"test_time_augmentation needs image batches [N, C, H, W], got "
                             f"{getattr(x, 'shape', type(x))}; remove it for this task")
        with torch.no_grad(), state.autocast():
            state.outputs = tta_logits(state.model, x, self.params["flip"], self.params["shifts"],
                                       original_logits=state.outputs)
