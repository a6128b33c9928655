"""Lookahead (Zhang, Lucas, Hinton & Ba, NeurIPS 2019): slow weights that follow the fast ones.

The base ("fast") optimizer takes ``k`` steps; then the slow weights move part of the way towards
where the fast weights ended, ``slow += alpha * (fast - slow)``, and the fast weights restart from
the slow ones. It damps the oscillation of the fast optimizer at little cost (one lerp and copy every
``k`` steps). airbench's weight averaging copied back every few steps works the same way.

:func:`lookahead_sync` is the update on lists of tensors; :class:`Lookahead` wraps any optimizer for
a plain PyTorch loop. The Trainer method ``lookahead`` keeps its own slow weights instead (see
``speedkit.methods.lookahead``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


@torch.no_grad()
def lookahead_sync(slow: Sequence[torch.Tensor], fast: Sequence[torch.Tensor], alpha: float) -> None:
    """``slow += alpha * (fast - slow)``, then ``fast = slow``, in place: a multi-tensor op each for the
    pairs of one dtype and device, tensor by tensor for the rest."""
    if len(slow) != len(fast):
        raise ValueError(f"lookahead_sync: {len(slow)} slow tensors for {len(fast)} fast ones")
    alike = [(s, f) for s, f in zip(slow, fast) if s.dtype == f.dtype and s.device == f.device]
    if alike:
        slow_alike, fast_alike = [s for s, _ in alike], [f for _, f in alike]
        torch._foreach_lerp_(slow_alike, fast_alike, alpha)
        torch._foreach_copy_(fast_alike, slow_alike)
    for s, f in zip(slow, fast):
        if s.dtype != f.dtype or s.device != f.device:
            s.lerp_(f.to(s.dtype), alpha)
            f.copy_(s)


class Lookahead(torch.optim.Optimizer):
    """Wrap ``base_optimizer``: every ``k`` steps pull the slow weights ``alpha`` of the way to the fast ones.

    ``param_groups`` are the base's (schedules keep working); ``state_dict`` holds the base's state plus
    the slow weights and the step count.
    """

    def __init__(self, base_optimizer: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5):
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(f"Lookahead wraps a torch optimizer, got {type(base_optimizer).__name__}")
        if int(k) != k or k < 1:
            raise ValueError(f"Lookahead k must be a whole number >= 1, got {k}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"Lookahead alpha must be in (0, 1], got {alpha}")
        self.base_optimizer, self.k, self.alpha = base_optimizer, int(k), float(alpha)
        self._ready = False
        super().__init__(base_optimizer.param_groups, {})
        self.param_groups = base_optimizer.param_groups
        self.state = base_optimizer.state
        self.defaults = base_optimizer.defaults
        self._ready = True
        self.fast_steps = 0
        self.slow = [p.detach().clone() for p in self._params()]

    @property
    def needs_closure(self) -> bool:
        return bool(getattr(self.base_optimizer, "needs_closure", False))

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def step(self, closure: Callable | None = None):
        loss = self.base_optimizer.step(closure) if closure is not None else self.base_optimizer.step()
        self.fast_steps += 1
        if self.fast_steps % self.k == 0:
            lookahead_sync(self.slow, self._params(), self.alpha)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        if self._ready:
            self.base_optimizer.add_param_group(param_group)
            self.slow.extend(p.detach().clone() for p in self.param_groups[-1]["params"])

    def state_dict(self) -> dict:
        return {"base": self.base_optimizer.state_dict(), "slow": [s.clone() for s in self.slow],
                "fast_steps": self.fast_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        self.base_optimizer.load_state_dict(state_dict["base"])
        with torch.no_grad():
            for s, saved in zip(self.slow, state_dict["slow"], strict=True):
                s.copy_(saved)
        self.fast_steps = int(state_dict["fast_steps"])

    def __repr__(self) -> str:
        return f"Lookahead(k={self.k}, alpha={self.alpha}, base={self.base_optimizer!r})"
