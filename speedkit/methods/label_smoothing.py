"""Label smoothing: train against (1 - s) * one_hot + s / C, which calibrates and regularises classifiers."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from speedkit.core.batch import output_classes, output_logits, require_tuple_batch, with_targets
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.methods._mixing import one_hot


def smooth_labels(targets: torch.Tensor, num_classes: int, smoothing: float = 0.1,
                  classes: int | None = None) -> torch.Tensor:
    """Dense smoothed labels from index labels [N] or from dense labels [N, C] (e.g. after mixup), ``num_classes``
    wide. ``classes``: how many of those columns are classes where fewer (a padded vocabulary's pad columns get
    no probability: the smoothing is spread over the real classes alone)."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    dense = targets.float() if targets.is_floating_point() else one_hot(targets, num_classes)
    if classes is None or classes == num_classes:
        return dense * (1.0 - smoothing) + smoothing / num_classes
    smoothed = dense * (1.0 - smoothing)
    smoothed[..., :classes] += smoothing / classes
    return smoothed


def criterion_smoothing(loss_fn) -> float:
    """The label smoothing a loss criterion applies by itself: ``nn.CrossEntropyLoss(label_smoothing=s)``'s or
    a ``functools.partial`` of ``F.cross_entropy`` with it (0 for any other; a lambda's cannot be read)."""
    if isinstance(loss_fn, torch.nn.CrossEntropyLoss):
        return float(loss_fn.label_smoothing)
    if isinstance(loss_fn, functools.partial) and loss_fn.func is F.cross_entropy:
        return float(loss_fn.keywords.get("label_smoothing", 0.0))
    return 0.0


class LabelSmoothing(Method):
    CARD = MethodCard(
        name="label_smoothing",
        summary="Replace one-hot targets by smoothed ones before the loss; restore them after.",
        domain="any",
        events=(Event.BEFORE_LOSS, Event.AFTER_LOSS),
        reads=("labels",),
        writes=("labels",),
        hparams=(HParam("smoothing", float, 0.1, low=0.0, high=0.5, step=0.05,
                        help="probability mass spread over all classes"),),
        requirements=("class-index or dense targets; logits as outputs",),
        effect="up to 1.5x faster to target in Composer's ResNet recipes; airbench uses 0.2",
        source="Szegedy et al. 2016; Composer LabelSmoothing docs; airbench",
    )

    def __init__(self, smoothing: float = 0.1):
        super().__init__(smoothing=smoothing)
        self._original_targets = None

    def check_criterion(self, loss_fn) -> None:
        # The criterion would smooth the soft labels this method gives it once more: smoothings a and b make
        # 1 - (1 - a)(1 - b), 0.19 for two of 0.1, where the user asked for one of them.
        own = criterion_smoothing(loss_fn)
        if own > 0:
            total = 1 - (1 - own) * (1 - self.params["smoothing"])
            raise ValueError(f"label_smoothing and loss_fn's own label_smoothing={own:g} would both smooth the "
                             f"labels (to {total:.3g} together); keep one: remove the LabelSmoothing method, or "
                             f"pass a loss_fn without label_smoothing")

    def apply(self, event, state, logger):
        if event is Event.BEFORE_LOSS:
            require_tuple_batch(state.batch, self.name, "it makes soft labels, and a dict batch's labels go into "
                                "the model, whose own loss takes class indices")
            targets = state.batch_targets()
            self._original_targets = targets
            logits = output_logits(state.outputs)
            smoothed = smooth_labels(targets, logits.shape[-1], self.params["smoothing"],
                                     output_classes(state.model, logits))
            state.batch = with_targets(state.batch, smoothed)
        elif self._original_targets is not None:
            state.batch = with_targets(state.batch, self._original_targets)
            self._original_targets = None
