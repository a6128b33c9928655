"""One optimizer object over several: what a host sees when a method (Muon) splits the user's optimizer in two.

Lightning's automatic optimisation, the Hugging Face Trainer and most hand-written loops step one optimizer;
:class:`OptimizerGroup` steps all of its members as one (a closure runs once), and its ``param_groups`` are the
members' own group dicts, so a host's LR scheduler reaches every member.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import MutableMapping
from typing import Sequence

import torch

from speedkit.hosts.session import HostCannotServeError
# Shared with speedkit's Trainer, a layer below; loop.py and lightning.py import follow_user_schedule from here.
from speedkit.optim.follow import follow_user_schedule, user_schedulers  # noqa: F401


class _MergedState(MutableMapping):
    """The members' ``state`` dicts seen as one, writing each entry back to the member that holds it."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]):
        self._optimizers = optimizers

    def _holder(self, key):
        for optimizer in self._optimizers:
            if key in optimizer.state:
                return optimizer.state
        return None

    def __getitem__(self, key):
        holder = self._holder(key)
        if holder is None:
            raise KeyError(key)
        return holder[key]

    def __setitem__(self, key, value):
        holder = self._holder(key)
        if holder is None:  # a new entry belongs to the member that owns the parameter
            holder = next((o.state for o in self._optimizers
                           if any(p is key for g in o.param_groups for p in g["params"])), self._optimizers[0].state)
        holder[key] = value

    def __delitem__(self, key):
        holder = self._holder(key)
        if holder is None:
            raise KeyError(key)
        del holder[key]

    def __iter__(self):
        for optimizer in self._optimizers:
            yield from optimizer.state

    def __len__(self):
        return sum(len(o.state) for o in self._optimizers)


class OptimizerGroup(torch.optim.Optimizer):
    """Several optimizers stepped as one: ``step(closure)`` evaluates the closure once, then steps each member.

    ``state_dict()`` holds each member's, so a host's checkpoint of this one optimizer resumes all of them.
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]):
        optimizers = list(optimizers)
        if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            raise TypeError(f"OptimizerGroup takes a non-empty list of torch optimizers, got {optimizers!r}")
        # Not Optimizer.__init__: the groups stay the members' (shared dicts), never copies.
        self.optimizers = optimizers
        self.defaults = dict(optimizers[0].defaults)
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                      "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, OrderedDict())

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def state(self) -> _MergedState:
        return _MergedState(self.optimizers)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        raise NotImplementedError("add parameter groups to a member of the OptimizerGroup (group.optimizers[i])")

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers")
        if saved is None or len(saved) != len(self.optimizers):
            count = "no member list" if saved is None else f"{len(saved)} member(s)"
            raise ValueError(f"this optimizer state has {count}, the OptimizerGroup has {len(self.optimizers)}: "
                             f"it was saved with other optimizer methods (muon, lookahead) on or off; resume "
                             f"with the same methods")
        for optimizer, member in zip(self.optimizers, saved):
            optimizer.load_state_dict(member)

    def __repr__(self) -> str:
        return f"OptimizerGroup({', '.join(type(o).__name__ for o in self.optimizers)})"


def as_one_optimizer(optimizers: Sequence[torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """The single optimizer a host steps: the only one, or an :class:`OptimizerGroup` of several."""
    optimizers = list(optimizers)
    return optimizers[0] if len(optimizers) == 1 else OptimizerGroup(optimizers)


def as_configured_state_dict(optimizer: torch.optim.Optimizer,
                              configured: Sequence[Sequence[torch.Tensor]]) -> dict | None:
    """``optimizer``'s state dict in torch's own form, for the parameter groups as the user configured them
    (``configured``: each group's parameters before a method moved some out): the moved parameters (Muon's
    matrices) are back at their places in their groups, without state. So the user's optimizer, built again
    without speedkit, loads it: those parameters then start afresh in it, the others keep their state.
    None when the groups no longer line up with ``configured``."""
    if len(configured) != len(optimizer.param_groups):
        return None
    saved = optimizer.state_dict()
    old = {id(p): index for group, packed in zip(optimizer.param_groups, saved["param_groups"])
           for p, index in zip(group["params"], packed["params"])}
    new: dict[int, int] = {}
    for params in configured:
        for p in params:
            new.setdefault(id(p), len(new))
    if not set(old) <= set(new):  # a parameter the user never gave this optimizer
        return None
    groups = [{**packed, "params": [new[id(p)] for p in params]}
              for packed, params in zip(saved["param_groups"], configured)]
    state = {new[key]: saved["state"][index] for key, index in old.items() if index in saved["state"]}
    return {"state": state, "param_groups": groups}


def refuse_two_schedules(optimizers: Sequence[torch.optim.Optimizer], schedules, host: str, fix: str) -> None:
    """Refuse, before the first step, speedkit ``schedules=`` on optimizers a user's LR scheduler also drives:
    both would set the same groups' lr each step (the issue measured a peak lr of 1e-4 where 3e-3 was asked).
    A group with ``initial_lr`` before speedkit's first step was given it by a scheduler; the live schedulers
    are searched too, for the one class (``ReduceLROnPlateau``) that leaves no mark."""
    if not schedules:
        return
    marked = any("initial_lr" in group for optimizer in optimizers for group in optimizer.param_groups)
    found = user_schedulers(optimizers)
    if marked or found:
        names = f" (found: your {', '.join(sorted({type(s).__name__ for s in found}))})" if found else ""
        raise HostCannotServeError(f"speedkit schedules={schedules!r} and your own LR scheduler would both set the "
                                   f"learning rate in {host}; keep one: {fix}{names}")


def gradients_kept(optimizers) -> bool:
    """Whether the optimizers' parameters still hold finite, non-zero gradients after a batch none of them stepped:
    kept for a step to come, as a loop accumulating by hand keeps them. A step skipped after an overflow (a
    GradScaler's) holds non-finite ones, or zeroed ones where the loop zeroes them after the step. Read only on
    such a batch, so its device sync is rare."""
    grads = [p.grad for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    return (bool(grads) and all(bool(grad.isfinite().all()) for grad in grads)
            and any(bool(grad.any()) for grad in grads))


class StepScaler:
    """A user's fp16 GradScaler as the methods see it (``state.grad_scaler``): ``unscale_`` of any optimizer
    unscales the one the scaler steps, once a step. A method unscales the optimizers it knows, which are an
    OptimizerGroup's members where Muon split the user's optimizer; ``scaler.step(group)`` would then find the
    group itself not unscaled and divide its gradients by the scale again. ``step_ended`` after each step."""

    def __init__(self, scaler, stepped: torch.optim.Optimizer):
        self.scaler, self.stepped, self.unscaled = scaler, stepped, False

    def unscale_(self, optimizer=None) -> None:
        if not self.unscaled:
            self.scaler.unscale_(self.stepped)
            self.unscaled = True

    def step_ended(self) -> None:
        self.unscaled = False
