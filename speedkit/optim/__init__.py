"""Optimisation: schedules that are functions of the fraction of training done, and optimizers torch lacks."""
from speedkit.optim.factory import OPTIMIZERS, make_optimizer_factory
from speedkit.optim.lookahead import Lookahead, lookahead_sync
from speedkit.optim.muon import Muon, zeropower_via_newtonschulz
from speedkit.optim.sam import SAM
from speedkit.optim.schedulers import (SCHEDULES, Constant, Cosine, Linear, LinearToZero, MultiStep, OneCycle,
                                       Schedule, Step, WarmupStableDecay, apply_schedule, dur_to_fraction,
                                       get_schedule)

__all__ = [
    "Schedule", "Constant", "Linear", "Cosine", "OneCycle", "Step", "MultiStep", "LinearToZero",
    "WarmupStableDecay", "SCHEDULES", "get_schedule", "apply_schedule", "dur_to_fraction",
    "OPTIMIZERS", "make_optimizer_factory", "Muon", "zeropower_via_newtonschulz", "SAM", "Lookahead",
    "lookahead_sync",
]
