"""Optimisation helpers: learning-rate schedules that are functions of the fraction of training done."""
from speedkit.optim.schedulers import (
    SCHEDULES,
    Constant,
    Cosine,
    Linear,
    LinearToZero,
    MultiStep,
    OneCycle,
    Schedule,
    Step,
    WarmupStableDecay,
    apply_schedule,
    dur_to_fraction,
    get_schedule,
)

__all__ = [
    "Schedule",
    "Constant",
    "Linear",
    "Cosine",
    "OneCycle",
    "Step",
    "MultiStep",
    "LinearToZero",
    "WarmupStableDecay",
    "SCHEDULES",
    "get_schedule",
    "apply_schedule",
    "dur_to_fraction",
]
