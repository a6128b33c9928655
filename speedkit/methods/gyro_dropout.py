"""GyroDropout (Lee et al. 2022): dropout with a fixed, small set of masks trained in turn.

Plain dropout samples a new mask for every sample of every step, so each of the (astronomically many)
sub-networks is trained a handful of times. GyroDropout pre-samples ``sigma`` masks once; in every
"iteration window" it selects ``tau`` of them and splits each batch into ``tau`` contiguous sub-batches,
sub-batch j using mask j. The window lasts (total steps / sigma) * tau steps, so every mask is trained about
equally often and for long enough to converge, and their ensemble is what eval mode computes (the layer is
the identity in eval, like dropout). Masks cover the feature dimension (the last one, nn.Linear's) and kept
features are scaled by 1 / (1 - p). Composer acts at FIT_START, when the run's length is known.

Under torchrun every rank must train the *same* sigma masks (else the ensemble would be world_size * sigma
masks, each trained on a fraction of the data), while the ranks' global RNGs differ on purpose: so in a
multi-process run each layer draws its masks and selections from its own generator, seeded from the run's
seed and identical on every rank (and saved in checkpoints).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speedkit.core import distributed
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.core.seeding import GYRO_DROPOUT, derive_seed
from speedkit.core.time import TimeUnit
from speedkit.methods._surgery import record_surgery, replace_modules


class GyroDropoutLayer(nn.Module):
    """Dropout over ``sigma`` pre-sampled feature masks, ``tau`` of them active per window."""

    def __init__(self, p: float, sigma: int = 256, tau: int = 16, window: int = 1):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        if not 1 <= tau <= sigma:
            raise ValueError(f"need 1 <= tau <= sigma, got tau={tau}, sigma={sigma}")
        self.p, self.sigma, self.tau, self.window = p, sigma, tau, max(1, int(window))
        self.step = 0
        self.generator: torch.Generator | None = None  # None: the global RNG (a single process)
        # not persistent: the model's state dict keeps the keys it had with nn.Dropout
        self.register_buffer("masks", torch.empty(0), persistent=False)         # [sigma, features]
        self.register_buffer("selected", torch.empty(0, dtype=torch.long), persistent=False)  # [tau]

    def _ensure_masks(self, x: torch.Tensor) -> None:
        features = x.shape[-1]
        if self.masks.numel() == 0 or self.masks.shape[1] != features:
            keep = 1.0 - self.p
            self.masks = (torch.rand(self.sigma, features, generator=self.generator) < keep).to(x.device)
        if self.step % self.window == 0 or self.selected.numel() == 0:
            self.selected = torch.randperm(self.sigma, generator=self.generator)[: self.tau].to(x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        self._ensure_masks(x)
        batch = x.shape[0]
        # sample i belongs to sub-batch floor(i * tau / batch): tau contiguous, nearly equal sub-batches
        sub_batch = torch.arange(batch, device=x.device) * self.tau // batch
        mask = self.masks[self.selected[sub_batch]]  # [B, features]
        mask = mask.view(batch, *([1] * (x.dim() - 2)), x.shape[-1]).to(x.dtype)
        self.step += 1
        return x * mask / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, sigma={self.sigma}, tau={self.tau}, window={self.window}"


def window_length(total_steps: int, sigma: int, tau: int) -> int:
    """Steps per iteration window: (total steps / sigma) * tau, so each mask trains about equally long."""
    return max(1, int(total_steps / sigma) * tau)


def apply_gyro_dropout(model: nn.Module, total_steps: int, sigma: int = 256, tau: int = 16,
                       allow_empty: bool = False) -> SurgeryReport:
    """Replace every ``nn.Dropout`` with p > 0 by a ``GyroDropoutLayer`` of the same p, for a run of
    ``total_steps`` training forward passes."""
    report = SurgeryReport("gyro_dropout")
    window = window_length(total_steps, sigma, tau)
    replace_modules(model, lambda name, m: type(m) is nn.Dropout and m.p > 0,
                    lambda name, m: GyroDropoutLayer(m.p, sigma, tau, window), report, "dropouts")
    return report.require_changes(allow_empty, "nn.Dropout layers with p > 0")


class GyroDropout(Method):
    CARD = MethodCard(
        name="gyro_dropout",
        summary="Dropout that trains a fixed set of sigma masks, tau at a time on sub-batches.",
        domain="any",
        events=(Event.FIT_START,),
        reads=("model", "schedule"),
        writes=("model",),
        hparams=(
            HParam("sigma", int, 256, low=1, high=4096, step=1, help="number of pre-sampled masks"),
            HParam("tau", int, 16, low=1, high=256, step=1, at_most="sigma",
                   help="masks trained at once (sub-batches per batch)"),
            HParam("allow_empty", bool, False, help="do not fail on a model without dropout"),
        ),
        requirements=("nn.Dropout layers with p > 0 (e.g. before a classifier head)",
                      "a batch size of at least tau", "max_duration convertible to batches"),
        effect="better accuracy than dropout at equal cost (Lee et al. 2022: +0.5..1.9% on CIFAR/ImageNet "
               "classifier heads); Composer lists it for accuracy",
        source="Lee et al. 2022, Gyro Dropout: Maximizing Ensemble Effect in Neural Network Training; Composer "
               "GyroDropout docs",
    )

    def __init__(self, **params):
        super().__init__(**params)  # the card refuses tau > sigma
        self._pending: dict = {}

    def apply(self, event, state, logger):
        try:
            total = state.convert(state.max_duration, TimeUnit.BATCH)
        except ValueError as e:
            raise ValueError(f"gyro_dropout sizes its mask windows from the run's length in batches, but "
                             f"max_duration={state.max_duration} cannot be converted ({e}); give it in ep, ba "
                             f"or sp") from e
        report = apply_gyro_dropout(state.model, int(total), self.params["sigma"], self.params["tau"],
                                    self.params["allow_empty"])
        record_surgery(logger, report)
        if distributed.world_size() > 1:  # the same masks on every rank (see the module docstring)
            for index, layer in enumerate(self._layers(state.model).values()):
                layer.generator = torch.Generator().manual_seed(derive_seed(abs(int(state.seed)), GYRO_DROPOUT, index))
        self._load_layers(state.model)

    # Masks and counters are the method's state: saved here so a resumed run continues the same windows.
    def state_dict(self) -> dict:
        return {"layers": {name: {"masks": m.masks.cpu(), "selected": m.selected.cpu(), "step": m.step,
                                  **({"generator": m.generator.get_state()} if m.generator is not None else {})}
                           for name, m in self._layers(self._model).items()}} if getattr(self, "_model", None) else {}

    def load_state_dict(self, state: dict) -> None:
        self._pending = dict(state.get("layers", {}))

    @staticmethod
    def _layers(model: nn.Module) -> dict[str, GyroDropoutLayer]:
        return {name: m for name, m in model.named_modules() if isinstance(m, GyroDropoutLayer)}

    def _load_layers(self, model: nn.Module) -> None:
        self._model = model
        for name, layer in self._layers(model).items():
            saved = self._pending.pop(name, None)
            if saved is not None:
                device = next((p.device for p in model.parameters()), torch.device("cpu"))
                layer.masks, layer.selected = saved["masks"].to(device), saved["selected"].to(device)
                layer.step = int(saved["step"])
                if layer.generator is not None and saved.get("generator") is not None:
                    layer.generator.set_state(saved["generator"])
