"""Callbacks: things that watch a run (speed, LR, progress, target, NaN, host-device waits, time by phase) or save it."""
from speedkit.callbacks.checkpoint_saver import CheckpointSaver
from speedkit.callbacks.monitors import (LRMonitor, NaNGuard, NonFiniteLossError, ProgressBar, StopAtTarget,
                                        resolve_progress_bar, someone_is_watching)
from speedkit.callbacks.phase_timer import PhaseTimer
from speedkit.callbacks.speed_monitor import SpeedMonitor, count_training_flops_per_sample, matmul_peak_flops
from speedkit.callbacks.sync_counter import SyncCounter
from speedkit.core.engine import Callback

__all__ = ["Callback", "CheckpointSaver", "LRMonitor", "NaNGuard", "NonFiniteLossError", "PhaseTimer", "ProgressBar",
           "SpeedMonitor", "StopAtTarget", "SyncCounter", "count_training_flops_per_sample", "matmul_peak_flops",
           "resolve_progress_bar", "someone_is_watching"]
