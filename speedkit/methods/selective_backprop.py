"""Selective backprop: train only on the samples the model currently gets most wrong.

A forward pass without gradients scores every sample of the batch by its loss; only the ``keep``
fraction with the highest loss goes through the training forward and backward. Easy samples, whose
gradients are small, are skipped. The scoring pass costs about a third of a training step (forward only),
so the method pays off only when it drops more than about a third of each batch; it acts between the
``start`` and ``end`` fractions of training, and leaves every ``interrupt``-th batch whole.

Selection is deterministic top-k by loss (the paper samples with probability rising with the loss
percentile; Composer keeps the top fraction, as here). The scoring pass runs the model in eval mode, so
it does not disturb BatchNorm statistics or draw dropout masks. Language batches ([B, T] token ids) are
scored per sequence by their mean token loss, so the method works for any task with cross-entropy.
Source: Jiang et al. 2019, "Accelerating Deep Learning by Focusing on the Biggest Losers"; Composer
SelectiveBackprop docs; airbench (selective backprop with a proxy net).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speedkit.core.batch import require_tuple_batch, select_samples
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
    """Cross-entropy per sample [N] from logits [N, C] or per sequence from [N, T, V] (mean over tokens).

    Targets may be class indices ([N] or [N, T]; ``ignore_index`` tokens are left out of a sequence's
    mean) or dense probabilities with the logits' shape.
    """
    logits = logits.float()
    log_probs = F.log_softmax(logits, dim=-1)
    if targets.is_floating_point():
        if targets.shape != logits.shape:
            raise ValueError(f"dense targets must match the logits' shape {list(logits.shape)}, "
                             f"got {list(targets.shape)}")
        losses = -(targets.float() * log_probs).sum(-1)
        return losses if losses.dim() == 1 else losses.flatten(1).mean(1)
    if logits.dim() == 2:
        return F.nll_loss(log_probs, targets.long(), reduction="none")
    # Sequences: [N, T, V] logits, [N, T] targets; mean over the tokens that count.
    flat = F.nll_loss(log_probs.flatten(0, -2), targets.reshape(-1).long(), reduction="none",
                      ignore_index=ignore_index).view(targets.shape)
    counted = (targets != ignore_index).flatten(1).sum(1).clamp(min=1)
    return flat.flatten(1).sum(1) / counted


def select_hardest(x: torch.Tensor, y: torch.Tensor, per_sample_loss: torch.Tensor, keep: float = 0.5):
    """The ``keep`` fraction of samples with the highest loss: ``(x_kept, y_kept, indices)``.

    Deterministic: the top ``max(1, round(keep * N))`` losses, returned in their original batch order.
    """
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    n = per_sample_loss.shape[0]
    k = max(1, int(round(keep * n)))
    indices = torch.topk(per_sample_loss.detach(), k).indices.sort().values
    return x.index_select(0, indices), y.index_select(0, indices), indices


def should_select(fraction_done: float, batch_index: int, start: float = 0.5, end: float = 0.9,
                  interrupt: int = 2) -> bool:
    """Whether to select on this batch: inside [start, end) of training, and not an ``interrupt``-th batch."""
    in_window = start <= fraction_done < end
    return in_window and (interrupt == 0 or (batch_index + 1) % interrupt != 0)


def score_batch(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, autocast=None,
                scale_factor: float = 1.0) -> torch.Tensor:
    """Per-sample losses from a no-grad forward in eval mode (train mode restored afterwards)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if scale_factor < 1.0 and inputs.dim() == 4 and inputs.is_floating_point():
                inputs = F.interpolate(inputs, scale_factor=scale_factor, mode="bilinear", antialias=True)
            if autocast is not None:
                with autocast():
                    logits = model(inputs)
            else:
                logits = model(inputs)
            return per_sample_loss(logits, targets)
    finally:
        model.train(was_training)


class SelectiveBackprop(Method):
    CARD = MethodCard(
        name="selective_backprop",
        summary="Score the batch with a no-grad forward and train only on its highest-loss samples.",
        domain="any",
        events=(Event.AFTER_DATALOADER,),
        reads=("batch", "labels", "model"),
        writes=("batch",),
        hparams=(
            HParam("start", float, 0.5, low=0.0, high=1.0, step=0.05, help="fraction of training to start at"),
            HParam("end", float, 0.9, low=0.0, high=1.0, step=0.05, help="fraction of training to stop at"),
            HParam("keep", float, 0.5, low=0.05, high=1.0, step=0.05, help="fraction of each batch trained on"),
            HParam("interrupt", int, 2, low=0, high=20, step=1,
                   help="every interrupt-th batch is used whole (0 = never)"),
            HParam("scale_factor", float, 1.0, low=0.25, high=1.0, step=0.05,
                   help="downscale images for the scoring pass (vision only; 1.0 = off)"),
        ),
        requirements=("a classifier or language model trained with cross-entropy (index or dense labels)",
                      "pays off only when more than about a third of each batch is dropped (keep < 2/3)"),
        runs_after=("augmix", "colout", "cutout", "progressive_resizing", "randaugment"),  # selects first
        effect="Composer: faster to a target when keep is well below 2/3 (the scoring forward costs about a "
               "third of a step); Jiang et al. report up to 3.5x faster convergence to a target error",
        source="Jiang et al. 2019; Composer SelectiveBackprop docs; airbench",
    )

    def __init__(self, **params):
        super().__init__(**params)
        if self.params["start"] >= self.params["end"]:
            raise ValueError(f"selective_backprop.start ({self.params['start']}) must be below end "
                             f"({self.params['end']})")

    def match(self, event, state) -> bool:
        p = self.params
        return event in self.CARD.events and should_select(state.fraction_done(), state.timestamp.batch,
                                                           p["start"], p["end"], p["interrupt"])

    def apply(self, event, state, logger):
        require_tuple_batch(state.batch, self.name, "it scores each sample with cross-entropy of model(inputs) "
                            "against the labels, and a dict batch's model is called with the whole dict")
        inputs, targets = state.batch_inputs(), state.batch_targets()
        losses = score_batch(state.model, inputs, targets, state.autocast, self.params["scale_factor"])
        _, _, indices = select_hardest(inputs, targets, losses, self.params["keep"])
        state.batch = select_samples(state.batch, indices)
