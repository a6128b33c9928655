"""The groups a method adds (Muon's) follow the learning rate of the user's own optimizer.

A user's torch LR scheduler, of any class, is built on the user's optimizer before a method splits it, so it
cannot reach the groups the method adds; the user's own code that sets the rate cannot either. Every place that
trains with such a split (speedkit's Trainer and each host) makes those groups follow the user's rate through
:func:`follow_user_schedule`.
"""
from __future__ import annotations

import gc
from typing import Sequence

import torch

__all__ = ["TORCH_SCHEDULERS", "user_schedulers", "FollowSchedule", "follow_user_schedule", "scale_learning_rates"]

# Every scheduler class torch ships: ReduceLROnPlateau subclasses LRScheduler only in recent torch.
TORCH_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def user_schedulers(optimizers: Sequence[torch.optim.Optimizer]) -> list:
    """The torch LR schedulers alive in this process that drive one of ``optimizers``, of every class torch ships.

    Found among the live objects rather than by a mark on the param groups: torch's schedulers write
    ``initial_lr`` into each group, but ``ReduceLROnPlateau`` writes nothing, and a search of the groups misses it."""
    targets = {id(optimizer) for optimizer in optimizers}
    # type(), not isinstance: isinstance reads __class__, which some live objects answer with a warning.
    return [obj for obj in gc.get_objects()
            if issubclass(type(obj), TORCH_SCHEDULERS) and id(getattr(obj, "optimizer", None)) in targets]


class FollowSchedule:
    """The groups of optimizers a method added (Muon's) follow the lr of the user's optimizer, which the user's
    LR scheduler (of any class, ``ReduceLROnPlateau`` included) or the user's own code sets, and which was built
    before the split and so cannot reach them.

    Each follower group's lr is its own lr times the reference group's relative change: that group's lr over its
    base, the base being ``max_lr`` for a one-cycle schedule (whose base is its peak), ``initial_lr`` for the
    other schedulers that write it, and otherwise the group's lr when speedkit first saw it (kept in the group as
    ``speedkit_reference_lr``, so a resumed optimizer brings it back). So Muon's ``lr`` is to Muon what the
    scheduler's base lr is to the user's optimizer, and warmup, decay, cycles and cuts on a plateau reach Muon's
    groups at the same moments.
    """

    def __init__(self, reference: tuple[torch.optim.Optimizer, int], followers: Sequence[torch.optim.Optimizer]):
        # Optimizers and indices, not group dicts: loading a state dict (a resume) replaces the group dicts.
        self.reference, self.followers = reference, list(followers)
        optimizer, index = reference
        group = optimizer.param_groups[index]
        group.setdefault("speedkit_reference_lr", float(group["lr"]))
        for optimizer in self.followers:
            for group in optimizer.param_groups:
                group.setdefault("speedkit_base_lr", float(group["lr"]))

    @property
    def multiplier(self) -> float | torch.Tensor:
        optimizer, index = self.reference
        group = optimizer.param_groups[index]
        lr, base = group["lr"], group.get("max_lr", group.get("initial_lr", group.get("speedkit_reference_lr",
                                                                                         group["lr"])))
        if isinstance(lr, torch.Tensor) or isinstance(base, torch.Tensor):
            # A tensor rate (a capturable, fused or compiled optimizer's, on the GPU) stays a tensor: reading it
            # as a number would make the host wait for the device at every step. A zero base gives no rate.
            return torch.nan_to_num(lr / base, nan=0.0, posinf=0.0, neginf=0.0)
        return float(lr) / float(base) if base else 0.0

    def __call__(self) -> None:
        multiplier = self.multiplier
        for optimizer in self.followers:
            for group in optimizer.param_groups:
                group["lr"] = group["speedkit_base_lr"] * multiplier


def follow_user_schedule(given: Sequence[torch.optim.Optimizer],
                         optimizers: Sequence[torch.optim.Optimizer]) -> FollowSchedule | None:
    """A :class:`FollowSchedule` for the optimizers in ``optimizers`` whose groups are none of ``given``'s (added
    by a method at FIT_START; a wrapper that shares a given optimizer's groups, as SAM does, is not one); None
    when no method added one. The reference is the first group a user's scheduler marked (``initial_lr``), else
    the first group of the first optimizer a live scheduler drives, else the first group given: a follower then
    keeps any change the user's code makes to that group's lr."""
    given_groups = {id(group) for optimizer in given for group in optimizer.param_groups}
    added = [o for o in optimizers if not any(id(group) in given_groups for group in o.param_groups)]
    if not added or not given:
        return None
    reference = next(((o, i) for o in given for i, g in enumerate(o.param_groups) if "initial_lr" in g), None)
    if reference is None and len(given) > 1:
        driven = [s.optimizer for s in user_schedulers(given)]
        reference = (next((o for o in given if any(o is d for d in driven)), given[0]), 0)
    follow = FollowSchedule(reference or (given[0], 0), added)
    follow()
    return follow


# What a group's lr is measured against: the base torch's schedulers keep (OneCycleLR's peak and floor too) and the
# followers' (FollowSchedule's).
_BASES = ("initial_lr", "max_lr", "min_lr", "speedkit_base_lr", "speedkit_reference_lr")


def scale_learning_rates(optimizers: Sequence[torch.optim.Optimizer], factor: float) -> None:
    """Multiply every group's lr by ``factor``, and the bases it is measured against, so that the schedule that
    sets it next (torch's or speedkit's) and the groups that follow it keep the cut."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] *= factor
            for key in _BASES:
                if key in group:
                    group[key] *= factor
