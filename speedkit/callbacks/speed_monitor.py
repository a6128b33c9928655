"""Throughput and hardware efficiency: samples/s, tokens/s, FLOP/s and its fraction of matmul peak."""
from __future__ import annotations

import collections
import functools
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from speedkit.core.devices import synchronize
from speedkit.core.engine import Callback


@functools.cache
def matmul_peak_flops(device_type: str = "cpu", dtype: torch.dtype = torch.float32, size: int = 1024) -> float:
    """Measured FLOP/s of a square matmul on this device, once per process: the honest 'peak' here.

    The best of several short trials, so a moment when another process holds the CPU does not make
    the peak look low (and the fraction of it that training reaches look high).
    """
    device = torch.device(device_type)
    generator = torch.Generator().manual_seed(0)  # the global RNG stream stays untouched
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(5):
        synchronize(device)
        reps, start = 0, time.perf_counter()
        while reps < 3 or time.perf_counter() - start < 0.05:
            a @ b
            reps += 1
        synchronize(device)
        best = max(best, 2 * size ** 3 * reps / (time.perf_counter() - start))
    return best


def count_training_flops_per_sample(model: torch.nn.Module, inputs: torch.Tensor) -> float:
    """Forward FLOPs counted on one batch in eval mode (no side effects), times 3 for fwd+bwd."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(inputs)
    finally:
        model.train(was_training)
    return 3.0 * counter.get_total_flops() / max(1, inputs.shape[0])


class SpeedMonitor(Callback):
    """Logs throughput over a sliding window of batches, and model FLOP/s against the measured peak."""

    def __init__(self, window: int = 20, count_flops: bool = True):
        self.window = window
        self.count_flops = count_flops
        self.flops_per_sample: float | None = None
        self.peak: float | None = None
        self._history: collections.deque = collections.deque(maxlen=window + 1)

    def fit_start(self, state, logger):
        self._history.clear()
        if self.count_flops:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(state.precision, torch.float32)
            self.peak = matmul_peak_flops(state.device.type, dtype)

    def after_dataloader(self, state, logger):
        if self.count_flops and self.flops_per_sample is None:
            inputs = state.batch_inputs()
            if isinstance(inputs, torch.Tensor):
                try:
                    with state.autocast():
                        self.flops_per_sample = count_training_flops_per_sample(state.model, inputs[:8])
                except Exception:  # a batch the model cannot take: the training step reports it, naming both
                    self.count_flops = False
                    return
                if state.record is not None:
                    logger.log_note("flops_per_sample", self.flops_per_sample)
                    state.record.environment["matmul_peak_flops"] = self.peak

    def batch_start(self, state, logger):
        if not self._history:  # the window starts where this fit starts (a resumed run starts mid-way)
            ts = state.timestamp
            self._history.append((ts.wall_s, ts.sample, ts.token))

    def batch_end(self, state, logger):
        ts = state.timestamp
        self._history.append((ts.wall_s, ts.sample, ts.token))
        if ts.batch % state.log_every:
            return
        (t0, s0, k0), (t1, s1, k1) = self._history[0], self._history[-1]
        if t1 <= t0:
            return
        metrics = {"throughput/samples_per_s": (s1 - s0) / (t1 - t0)}
        if k1 > k0:
            metrics["throughput/tokens_per_s"] = (k1 - k0) / (t1 - t0)
        if self.flops_per_sample:
            flops = self.flops_per_sample * metrics["throughput/samples_per_s"]
            metrics["throughput/flops_per_s"] = flops
            if self.peak:
                metrics["throughput/fraction_of_peak"] = flops / self.peak
        logger.log_metrics(metrics)
