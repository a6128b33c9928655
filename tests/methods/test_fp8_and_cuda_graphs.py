"""fp8 (torchao float8) and CUDA graphs (torch.compile modes): what each does and refuses, checked on a CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import toy_loaders

from speedkit.methods import REGISTRY
from speedkit.methods.fp8 import FP8, convert_to_fp8, eligible_linears, fp8_refusal
from speedkit.methods.torch_compile import mode_for_device
from speedkit.train.trainer import Trainer


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def test_fp8_is_registered_with_a_card():
    assert REGISTRY["fp8"] is FP8 and "8.9" in " ".join(FP8.CARD.requirements)


def test_fp8_is_refused_on_a_cpu_with_the_reason_before_training(tmp_path):
    assert "compute capability >= 8.9" in fp8_refusal(torch.device("cpu"))
    train, _ = toy_loaders()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    with pytest.raises(ValueError, match="method fp8 refused: fp8 needs a CUDA GPU"):
        Trainer(model, train, methods=[FP8()], device="cpu", run_dir=tmp_path, max_duration="1ba")


def test_fp8_is_refused_on_a_gpu_older_than_ada(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    reason = fp8_refusal(torch.device("cuda"))
    assert "A100" in reason and "8.0" in reason and "bf16" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8_refusal(torch.device("cuda")) is None


def test_fp8_converts_the_eligible_linear_layers_and_keeps_their_parameters():
    pytest.importorskip("torchao", reason="the fp8 extra (speedkit[fp8]) installs torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = mlp()
    model.append(nn.Linear(10, 16))  # 10 is not divisible by 16: not eligible
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert eligible_linears(model) == ["0", "2"]  # "4" (48 -> 10) fails the 16 rule, "5" is the last layer
    report = convert_to_fp8(model)
    assert report.changed == {"linear layers": 2}
    assert [type(m) for m in model] == [Float8Linear, nn.ReLU, Float8Linear, nn.ReLU, nn.Linear, nn.Linear]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # same weights, same keys
    with pytest.raises(ValueError, match="found no linear layers"):
        convert_to_fp8(nn.Sequential(nn.Linear(3, 5)))


@pytest.mark.parametrize("mode, cpu_mode", [("reduce-overhead", "default"),
                                            ("max-autotune", "max-autotune-no-cudagraphs"),
                                            ("default", "default")])
def test_cuda_graph_modes_fall_back_off_cuda_and_stay_on_cuda(mode, cpu_mode):
    chosen, note = mode_for_device(mode, torch.device("cpu"))
    assert chosen == cpu_mode and (note is None) == (mode == cpu_mode)
    if note:
        assert "CUDA graphs" in note
    assert mode_for_device(mode, torch.device("cuda")) == (mode, None)
    with pytest.raises(ValueError, match="mode must be one of"):
        mode_for_device("graphs", torch.device("cpu"))
