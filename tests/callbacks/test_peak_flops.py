"""The efficiency figure's peak: the vendor's dense TFLOP/s looked up by GPU name, the measured matmul elsewhere."""
from __future__ import annotations

import pytest
import torch

from speedkit.callbacks.speed_monitor import SPEC_PEAK_TFLOPS, matmul_precision, spec_peak_flops


@pytest.mark.parametrize("name, precision, tflops, part", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989, "H100 SXM5"),
    ("NVIDIA H100 PCIe", "bf16", 756, "H100 PCIe"),
    ("NVIDIA H100 NVL", "fp8", 1671, "H100 NVL"),
    ("NVIDIA H200", "bf16", 989, "H200 SXM"),
    ("NVIDIA GH200 480GB", "tf32", 495, "GH200"),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312, "A100"),
    ("NVIDIA A100 80GB PCIe", "tf32", 156, "A100"),
    ("NVIDIA L4", "fp8", 242, "L4"),
    ("NVIDIA L40S", "bf16", 362, "L40S"),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2, "RTX 4090"),
    ("Tesla T4", "fp16", 65, "T4"),
])
def test_known_gpus_get_their_dense_spec_figure(name, precision, tflops, part):
    flops, source = spec_peak_flops(name, precision)
    assert flops == pytest.approx(tflops * 1e12) and part in source and "dense" in source


@pytest.mark.parametrize("name, precision", [("NVIDIA A100-SXM4-40GB", "fp8"),  # no fp8 units on Ampere
                                             ("Tesla T4", "bf16"), ("NVIDIA A10G", "bf16"),
                                             ("NVIDIA GeForce GTX 1080", "fp32"), ("cpu", "bf16")])
def test_unknown_parts_and_missing_units_fall_back_to_the_measured_matmul(name, precision):
    assert spec_peak_flops(name, precision) is None


def test_an_l4_is_not_an_l40_and_every_figure_is_dense():
    assert "L4," in spec_peak_flops("NVIDIA L4", "bf16")[1]
    assert "L40," in spec_peak_flops("NVIDIA L40", "bf16")[1]
    for _, _, peaks in SPEC_PEAK_TFLOPS:  # fp8 is twice bf16 on every sheet (dense or sparse alike)
        if "fp8" in peaks and "bf16" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.03)


def test_the_matmul_precision_follows_the_run(monkeypatch):
    assert matmul_precision("bf16") == "bf16" and matmul_precision("fp16") == "fp16"
    class Fp8:
        name = "fp8"
    assert matmul_precision("bf16", [Fp8()]) == "fp8"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert matmul_precision("fp32") == "fp32"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert matmul_precision("fp32") == "tf32"


class _CountMatmuls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("matmul", "__matmul__"):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seconds_per_matmul, most_matmuls", [(1.0, 2), (0.001, None)])
def test_a_precision_the_device_emulates_is_timed_once_not_in_best_of_trials(monkeypatch, seconds_per_matmul,
                                                                              most_matmuls):
    """bf16 on a CPU without bf16 units is emulated, many times slower per matmul: best of five trials of three
    made every process that trains in bf16 there wait eighteen slow matmuls at its first fit. A fast matmul
    keeps the trials (a busy moment must not make the peak look low)."""
    import speedkit.callbacks.speed_monitor as speed_monitor

    clock = iter(range(1_000_000))  # each reading of the clock is one matmul later
    monkeypatch.setattr(speed_monitor.time, "perf_counter", lambda: next(clock) * seconds_per_matmul)
    with _CountMatmuls() as counted:
        peak = speed_monitor.matmul_peak_flops.__wrapped__("cpu", torch.float32, size=16)
    if most_matmuls:
        assert counted.calls <= most_matmuls
        assert peak == pytest.approx(2 * 16 ** 3 / seconds_per_matmul)
    else:
        assert counted.calls >= 3 + 5 * 3  # warm-ups, then best of five trials of at least three
