"""What mixup and cutmix share: the draws (a Beta weight, a permutation), labels mixed as dense
probabilities, and the Method flow that mixes a batch with a permutation of itself.

At BEFORE_FORWARD the inputs are mixed (each method's ``mix``) and the labels by the same weight; index
labels without ``num_classes`` wait for BEFORE_LOSS, where the logits' width gives the class count. A
second pass over the same microbatch (SAM's closure) reuses the draw, so both passes see the same inputs.
"""
from __future__ import annotations

import numpy as np
import torch

from speedkit.core.batch import output_logits, require_tuple_batch, with_inputs, with_targets
from speedkit.core.event import Event
from speedkit.core.method import Method


def sample_beta(alpha: float, generator: torch.Generator | None = None) -> float:
    """One draw of Beta(alpha, alpha), reproducible from ``generator`` (or torch's global RNG)."""
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    # torch's Beta sampler takes no generator, so a seed drawn from torch's stream drives numpy's.
    seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    return float(np.random.default_rng(seed).beta(alpha, alpha))


def beta_tensor(alpha: float) -> torch.Tensor:
    """One draw of Beta(alpha, alpha) from torch's global RNG as a 0-d CPU tensor, never read on the host: a
    training step that mixes stays free of host reads (``SyncCounter``), and ops on any device take a 0-d CPU
    tensor as a scalar."""
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    gammas = torch._standard_gamma(torch.full((2,), float(alpha)))  # Beta(a, a) = G1 / (G1 + G2)
    return gammas[0] / gammas.sum()


def random_permutation(n: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """A permutation of ``range(n)`` drawn on ``device`` (``generator``, where given, one of that device): drawn on
    the host, it would be a blocking copy to the device at every step."""
    return torch.randperm(n, generator=generator, device=device)


def dense_labels(targets: torch.Tensor, num_classes: int | None) -> torch.Tensor:
    """Targets as float probabilities [N, C]: dense targets pass through, class indices are one-hot encoded."""
    if targets.is_floating_point():
        return targets.float()
    if num_classes is None:
        raise ValueError("index labels need num_classes to become dense labels; pass num_classes=")
    return one_hot(targets, num_classes)


def one_hot(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class indices as one-hot float rows, built by a scatter: ``F.one_hot`` reads the largest index back
    to check it (a host wait on a GPU, every batch); out-of-range indices still fail, in the kernel."""
    index = targets.long().unsqueeze(-1)
    return torch.zeros(*targets.shape, num_classes, device=targets.device).scatter_(-1, index, 1.0)


def blend(x: torch.Tensor, permutation: torch.Tensor, lam: float | torch.Tensor) -> torch.Tensor:
    """``lam * x + (1 - lam) * x[permutation]`` as a gather and one ``lerp``, not five ops. ``lam`` is a float or
    a 0-d tensor (a CPU one is taken as a scalar by a kernel on any device); integer ``x`` is mixed as float32."""
    if not x.is_floating_point():
        x = x.float()
    return x[permutation].lerp(x, lam)


def mix_labels(targets: torch.Tensor, permutation: torch.Tensor, lam: float | torch.Tensor,
               num_classes: int | None) -> torch.Tensor:
    """``lam * y + (1 - lam) * y[perm]`` as dense labels [N, C]."""
    return blend(dense_labels(targets, num_classes), permutation, lam)


class BatchMixing(Method):
    """Base of methods that mix a batch with a permutation of itself; subclasses say how (``draw``,
    ``mix``) and which inputs they take (``check_inputs``). Parameters: ``alpha``, ``num_classes``."""

    def __init__(self, **params):
        super().__init__(**params)
        self._pending = None  # (lam, permutation) whose dense labels wait for the output width
        self._last_draw = None  # ((batch, microbatch, shape), draw): repeated passes reuse it

    def check_inputs(self, x: torch.Tensor) -> None:
        """Raise ValueError (naming the method and the fix) for inputs this method cannot mix."""

    def draw(self, x: torch.Tensor):
        """The random part of one mix of ``x``."""
        raise NotImplementedError

    def mix(self, x: torch.Tensor, drawn) -> tuple[torch.Tensor, float, torch.Tensor]:
        """(mixed inputs, weight of each sample's own labels, permutation) for the draw ``drawn``."""
        raise NotImplementedError

    def match(self, event, state) -> bool:
        if event is Event.BEFORE_LOSS:
            return self._pending is not None
        return event in self.CARD.events

    def _drawn(self, state, x: torch.Tensor):
        key = (state.timestamp.batch, state.microbatch_index, tuple(x.shape))
        if self._last_draw is None or self._last_draw[0] != key:
            self._last_draw = (key, self.draw(x))
        return self._last_draw[1]

    def apply(self, event, state, logger):
        require_tuple_batch(state.batch, self.name, "it mixes the labels, and a dict batch's labels go into the "
                            "model, whose own loss takes class indices, not mixed labels")
        x, y = state.batch_inputs(), state.batch_targets()
        if event is Event.BEFORE_FORWARD:
            self.check_inputs(x)
            mixed_x, lam, perm = self.mix(x, self._drawn(state, x))
            num_classes = self.params["num_classes"] or None
            state.batch = with_inputs(state.batch, mixed_x)
            if y.is_floating_point() or num_classes is not None:
                state.batch = with_targets(state.batch, mix_labels(y, perm, lam, num_classes))
            else:  # the number of classes is known once the model has produced logits
                self._pending = (lam, perm)
            return
        lam, perm = self._pending
        self._pending = None
        state.batch = with_targets(state.batch, mix_labels(y, perm, lam, output_logits(state.outputs).shape[-1]))
