"""Lookahead weight averaging (Zhang et al., NeurIPS 2019) as a Trainer method.

Every ``k`` optimizer steps the slow weights move ``alpha`` of the way to the current ("fast")
weights and the fast weights restart from them: ``slow += alpha * (fast - slow); fast = slow``.
airbench copies averaged weights back into the net every few steps in the same way.

Design: the method keeps the slow weights itself and acts after the optimizer step
(AFTER_TRAIN_BATCH) instead of wrapping the optimizer. That works the same for one optimizer or
several (a Muon + AdamW split), composes with optimizer wrappers such as SAM without wrapper-on-wrapper
ordering questions, and keeps the Trainer's optimizer list and checkpoints unchanged. For a plain
PyTorch loop, :class:`speedkit.optim.lookahead.Lookahead` wraps an optimizer with the same update
(:func:`speedkit.optim.lookahead.lookahead_sync`).
"""
from __future__ import annotations

import torch

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.optim.lookahead import lookahead_sync


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by name (a tied weight once); frozen ones included, they just do not move."""
    return dict(model.named_parameters())


class Lookahead(Method):
    CARD = MethodCard(
        name="lookahead",
        summary="Keep slow weights; every k steps move them towards the fast weights and restart from them.",
        domain="any",
        events=(Event.FIT_START, Event.AFTER_TRAIN_BATCH),
        reads=("model",),
        writes=("optimizer",),
        hparams=(
            HParam("k", int, 5, low=1, high=100, step=1, help="fast steps between synchronisations"),
            HParam("alpha", float, 0.5, low=0.05, high=1.0, step=0.05,
                   help="how far the slow weights move towards the fast ones"),
        ),
        requirements=("one extra copy of the weights",),
        effect="steadier training, robust to the inner optimizer's hyperparameters (Zhang et al.); "
               "part of airbench's CIFAR-10 speed-run",
        source="Zhang, Lucas, Hinton & Ba 2019 'Lookahead Optimizer: k steps forward, 1 step back'; airbench",
    )

    def __init__(self, k: int = 5, alpha: float = 0.5):
        super().__init__(k=k, alpha=alpha)
        self.slow: dict[str, torch.Tensor] | None = None

    def match(self, event, state) -> bool:
        if event is Event.AFTER_TRAIN_BATCH:
            # the timestamp still counts the batches before this one, so this was step batch + 1
            return (state.timestamp.batch + 1) % self.params["k"] == 0
        return event in self.CARD.events

    def apply(self, event, state, logger):
        fast = trainable_parameters(state.model)
        if event is Event.FIT_START:
            if self.slow is None:
                self.slow = {name: p.detach().clone() for name, p in fast.items()}
            else:  # restored from a checkpoint
                self.slow = {name: t.to(state.device) for name, t in self.slow.items()}
            return
        names = list(fast)
        lookahead_sync([self.slow[n] for n in names], [fast[n] for n in names], self.params["alpha"])

    def state_dict(self) -> dict:
        return {} if self.slow is None else {"slow": {k: v.clone() for k, v in self.slow.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("slow") is not None:
            self.slow = {k: v.clone() for k, v in state["slow"].items()}
