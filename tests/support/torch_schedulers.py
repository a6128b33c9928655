"""One of every LR scheduler class torch ships, built on a user's optimizer, for the tests that check a user's own
scheduler reaches the groups speedkit's methods add (the Trainer's and every host's)."""
from __future__ import annotations

from torch.optim import lr_scheduler


def every_torch_scheduler(steps: int, lr: float) -> dict:
    """Class name -> a builder taking the optimizer. OneCycleLR's peak and CyclicLR's base are ``lr``, the
    optimizer's, so for every class the base its schedule is relative to is ``lr``. ReduceLROnPlateau's threshold
    makes no metric an improvement, so it cuts the rate at every step it is given."""
    return {
        "LambdaLR": lambda o: lr_scheduler.LambdaLR(o, lambda step: 1 / (1 + step)),
        "MultiplicativeLR": lambda o: lr_scheduler.MultiplicativeLR(o, lambda step: 0.8),
        "StepLR": lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        "MultiStepLR": lambda o: lr_scheduler.MultiStepLR(o, milestones=[2, 5], gamma=0.3),
        "ConstantLR": lambda o: lr_scheduler.ConstantLR(o, factor=0.25, total_iters=3),
        "LinearLR": lambda o: lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=4),
        "ExponentialLR": lambda o: lr_scheduler.ExponentialLR(o, gamma=0.7),
        "PolynomialLR": lambda o: lr_scheduler.PolynomialLR(o, total_iters=steps, power=2.0),
        "CosineAnnealingLR": lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=steps),
        "ChainedScheduler": lambda o: lr_scheduler.ChainedScheduler(
            [lr_scheduler.ConstantLR(o, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(o, gamma=0.8)]),
        "SequentialLR": lambda o: lr_scheduler.SequentialLR(
            o, [lr_scheduler.LinearLR(o, start_factor=0.2, total_iters=3),
                lr_scheduler.CosineAnnealingLR(o, T_max=5)], milestones=[3]),
        "ReduceLROnPlateau": lambda o: lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0, threshold=1.0),
        "CyclicLR": lambda o: lr_scheduler.CyclicLR(o, base_lr=lr, max_lr=4 * lr, step_size_up=2),
        "OneCycleLR": lambda o: lr_scheduler.OneCycleLR(o, max_lr=lr, total_steps=steps),
        "CosineAnnealingWarmRestarts": lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=3),
    }
