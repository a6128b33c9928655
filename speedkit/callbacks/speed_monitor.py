"""Throughput and hardware efficiency: samples/s, tokens/s, FLOP/s and its fraction of the device's peak.

On a GPU the peak is the vendor's dense figure for the precision the run trains in (``SPEC_PEAK_TFLOPS``,
looked up by device name): a measured 1024x1024 matmul reaches a fraction of it, so dividing by the
measurement makes the efficiency read high. The measured matmul is kept as a second figure. On a CPU (and on
a GPU the table does not know) the measured matmul is the peak.
"""
from __future__ import annotations

import collections
import functools
import math
import re
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from speedkit.core.devices import synchronize
from speedkit.core.engine import Callback


@functools.cache
def matmul_peak_flops(device_type: str = "cpu", dtype: torch.dtype = torch.float32, size: int = 1024) -> float:
    """Measured FLOP/s of a square matmul on this device, once per process: the honest 'peak' here.

    The best of several short trials, so a moment when another process holds the CPU does not make
    the peak look low (and the fraction of it that training reaches look high); one timed matmul where a
    single one is already long (an emulated precision).
    """
    device = torch.device(device_type)
    generator = torch.Generator().manual_seed(0)  # the global RNG stream stays untouched
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    a @ b  # the first call pays for kernel selection
    synchronize(device)
    start = time.perf_counter()
    a @ b
    synchronize(device)
    one = time.perf_counter() - start
    if one > 0.25:
        # A precision the device only emulates (bf16 on a CPU without bf16 units): one matmul already spans
        # many scheduler slices, so best-of-trials would measure the same figure at many times the wait.
        return 2 * size ** 3 / one
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


# Dense (not 2:4-sparse) tensor-core TFLOP/s from the vendors' public spec sheets and architecture
# whitepapers, per GPU, at FP32 accumulation where the sheet gives both (GeForce cards double with FP16
# accumulation, which training does not use). "fp32" is the plain (non-tensor-core) FP32 figure, for runs
# that keep float32 matmuls at "highest" precision; None: the part has no such unit.
# Rows are tried in order and the first whose pattern matches the device name wins (more specific first).
SPEC_PEAK_TFLOPS: tuple[tuple[str, str, dict], ...] = (
    # pattern on torch.cuda.get_device_name(), the part as the sheet names it, {precision: TFLOP/s}
    (r"\bGH200\b", "NVIDIA GH200 (H100 SXM5 GPU)", {"fp8": 1979, "bf16": 989, "fp16": 989, "tf32": 495, "fp32": 67}),
    (r"\bH200\b.*\bNVL\b", "NVIDIA H200 NVL", {"fp8": 1671, "bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
    (r"\bH200\b", "NVIDIA H200 SXM", {"fp8": 1979, "bf16": 989, "fp16": 989, "tf32": 495, "fp32": 67}),
    (r"\bH100\b.*\bNVL\b", "NVIDIA H100 NVL", {"fp8": 1671, "bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
    (r"\bH100\b.*\bPCIe\b", "NVIDIA H100 PCIe", {"fp8": 1513, "bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    (r"\bH100\b", "NVIDIA H100 SXM5", {"fp8": 1979, "bf16": 989, "fp16": 989, "tf32": 495, "fp32": 67}),
    (r"\bB200\b", "NVIDIA B200 (HGX, per GPU)", {"fp8": 4500, "bf16": 2250, "fp16": 2250, "tf32": 1100}),
    (r"\bA100\b", "NVIDIA A100 (SXM4 and PCIe)", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    (r"\bA10G\b", None, {}),  # AWS's A10 variant: its figures are not on a public NVIDIA sheet
    (r"\bA10\b", "NVIDIA A10", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
    (r"\bL40S\b", "NVIDIA L40S", {"fp8": 733, "bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
    (r"\bL40\b", "NVIDIA L40", {"fp8": 362, "bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5}),
    (r"\bL4\b", "NVIDIA L4", {"fp8": 242, "bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    (r"\bRTX 4090\b", "NVIDIA GeForce RTX 4090 (Ada whitepaper)",
     {"fp8": 330.3, "bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"\bRTX 3090\b", "NVIDIA GeForce RTX 3090 (Ampere whitepaper)",
     {"bf16": 71, "fp16": 71, "tf32": 35.6, "fp32": 35.6}),
    (r"\bV100\b", "NVIDIA V100 SXM2", {"fp16": 125, "fp32": 15.7}),
    (r"\bT4\b", "NVIDIA T4", {"fp16": 65, "fp32": 8.1}),
    (r"\bMI300X\b", "AMD Instinct MI300X", {"fp8": 2615, "bf16": 1307, "fp16": 1307, "tf32": 654, "fp32": 163.4}),
)


def spec_peak_flops(device_name: str, precision: str) -> tuple[float, str] | None:
    """The vendor's dense peak FLOP/s for ``precision`` ("fp8", "bf16", "fp16", "tf32", "fp32") on the GPU
    named ``device_name``, and where the figure comes from; None when the table does not know the part or
    the part has no unit for that precision (then the measured matmul is the peak)."""
    for pattern, part, peaks in SPEC_PEAK_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            tflops = peaks.get(precision)
            if part is None or tflops is None:
                return None
            return tflops * 1e12, f"{part}, dense {precision}, vendor spec sheet"
    return None


def matmul_precision(precision: str, methods=()) -> str:
    """Which tensor-core format a run's matmuls use: fp8 under the fp8 method, else bf16/fp16 autocast, else
    tf32 where torch lets float32 matmuls use it, else plain fp32."""
    if any(getattr(m, "name", None) == "fp8" for m in methods):
        return "fp8"
    if precision in ("bf16", "fp16"):
        return precision
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


def count_training_flops_per_sample(model: torch.nn.Module, inputs: torch.Tensor) -> float:
    """Forward FLOPs counted on one batch in eval mode (no side effects), times 3 for fwd+bwd.

    A compiled model counts as it runs eager (the same arithmetic), with TorchDynamo told so: a compiled forward
    that TorchDynamo first meets under the counter's dispatch mode is skipped, on torch 2.11 for good, so the
    model (and every module sharing its forward's code) would never compile afterwards and train eager, silently.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.compiler.set_stance("force_eager"), torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(inputs)
    finally:
        model.train(was_training)
    return 3.0 * counter.get_total_flops() / max(1, inputs.shape[0])


# Input shapes whose FLOPs are counted exactly (each count is a forward pass of 8 samples in training time);
# sequence-length warmup in steps of 8 tokens to 256 brings 24, a step of 1 could bring thousands.
MAX_COUNTED_SHAPES = 32


class SpeedMonitor(Callback):
    """Logs throughput over a sliding window of batches, and model FLOP/s against the device's peak.

    ``throughput/fraction_of_peak`` divides by the vendor's dense figure on a GPU the table knows
    (``record.environment["peak_flops"]`` says which) and by the measured matmul elsewhere;
    ``throughput/fraction_of_measured_peak`` always divides by the measured matmul.

    FLOPs are counted once per input shape and summed batch by batch: a method that changes the shape
    during training (sequence-length warmup, progressive resizing) makes the first batches cheaper than the
    last, and one count at the first batch would credit every later one with its few FLOPs.
    """

    def __init__(self, window: int = 20, count_flops: bool = True):
        self.window = window
        self.count_flops = count_flops
        self.flops_per_sample: float | None = None  # of the current batch's input shape
        self._flops_by_shape: dict[tuple, float] = {}
        self._flops_done = 0.0  # training FLOPs summed over the batches since fit start
        self.peak: float | None = None  # what fraction_of_peak divides by
        self.measured_peak: float | None = None
        self.peak_source: str | None = None
        self._history: collections.deque = collections.deque(maxlen=window + 1)

    def fit_start(self, state, logger):
        self._history.clear()
        self._flops_done = 0.0
        if self.count_flops:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(state.precision, torch.float32)
            self.measured_peak = matmul_peak_flops(state.device.type, dtype)
            self.peak, self.peak_source = self.measured_peak, f"measured {1024}x{1024} matmul on {state.device.type}"
            if state.device.type == "cuda":
                name = torch.cuda.get_device_name(state.device)
                spec = spec_peak_flops(name, matmul_precision(state.precision, state.methods))
                if spec is not None:
                    self.peak, self.peak_source = spec

    def after_dataloader(self, state, logger):
        if not self.count_flops:
            return
        inputs = state.batch_inputs()
        if not isinstance(inputs, torch.Tensor):
            return
        shape = tuple(inputs.shape[1:])
        if shape not in self._flops_by_shape:
            if len(self._flops_by_shape) >= MAX_COUNTED_SHAPES:
                self._flops_by_shape[shape] = self._scaled_from_nearest(shape)
            else:
                try:
                    with state.autocast():
                        self._flops_by_shape[shape] = count_training_flops_per_sample(state.model, inputs[:8])
                except Exception:  # a batch the model cannot take: the training step reports it, naming both
                    self.count_flops = False
                    self.flops_per_sample = None
                    return
        first = self.flops_per_sample is None
        self.flops_per_sample = self._flops_by_shape[shape]
        if first and state.record is not None:
            logger.log_note("flops_per_sample", self.flops_per_sample)
            state.record.environment["matmul_peak_flops"] = self.measured_peak
            state.record.environment["peak_flops"] = {"value": self.peak, "source": self.peak_source}

    def _scaled_from_nearest(self, shape: tuple) -> float:
        """A shape past the counting limit: the count of the counted shape nearest in size, scaled by size."""
        size = math.prod(shape)
        nearest = min(self._flops_by_shape, key=lambda counted: abs(math.prod(counted) - size))
        return self._flops_by_shape[nearest] * size / max(1, math.prod(nearest))

    def batch_start(self, state, logger):
        if not self._history:  # the window starts where this fit starts (a resumed run starts mid-way)
            ts = state.timestamp
            self._history.append((ts.wall_s, ts.sample, ts.token, self._flops_done))

    def batch_end(self, state, logger):
        ts = state.timestamp
        if self.flops_per_sample and self._history:
            self._flops_done += self.flops_per_sample * (ts.sample - self._history[-1][1])
        self._history.append((ts.wall_s, ts.sample, ts.token, self._flops_done))
        if ts.batch % state.log_every:
            return
        (t0, s0, k0, f0), (t1, s1, k1, f1) = self._history[0], self._history[-1]
        if t1 <= t0:
            return
        metrics = {"throughput/samples_per_s": (s1 - s0) / (t1 - t0)}
        if k1 > k0:
            metrics["throughput/tokens_per_s"] = (k1 - k0) / (t1 - t0)
        if self.flops_per_sample and f1 > f0:
            flops = (f1 - f0) / (t1 - t0)
            metrics["throughput/flops_per_s"] = flops
            if self.peak:
                metrics["throughput/fraction_of_peak"] = flops / self.peak
            if self.measured_peak and self.measured_peak != self.peak:
                metrics["throughput/fraction_of_measured_peak"] = flops / self.measured_peak
        logger.log_metrics(metrics)
