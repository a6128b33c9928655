"""Counting never costs a compiled model its compile. SpeedMonitor counts FLOPs and SyncCounter counts waits under
dispatch modes, where TorchDynamo does not compile; the model runs eager there, and TorchDynamo is told so (stance
``force_eager``). Were it not, it would meet the compiled forward under the mode and skip it, on torch 2.11 (the
version the GPU machines have) for the rest of the process: the model, and every module sharing its forward's code,
would train eager after the count, silently. On torch 2.14 that skip is not kept, so there these tests check the
stance the count runs at as well as the compile after it."""
from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from helpers import toy_loaders
from speedkit.callbacks import SyncCounter, count_training_flops_per_sample


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile's graph capture with no code generation (seconds less a compile), counters fresh."""
    monkeypatch.setattr(torch.nn.Module, "compile",
                        functools.partialmethod(torch.nn.Module.compile, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def stance() -> str:
    return torch._dynamo.eval_frame._stance.stance


class StanceSeen(torch.nn.Module):
    """A user's model (its forward's code outside torch, which TorchDynamo compiles on every version) that notes
    TorchDynamo's stance each time its forward runs eager."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out, self.seen = torch.nn.Linear(8, 32), torch.nn.Linear(32, 3), []

    def forward(self, x):
        if not torch.compiler.is_compiling():
            self.seen.append(stance())
        return self.out(torch.relu(self.hidden(x)))


def compiled_frames() -> int:
    return int(counters["frames"]["ok"])


def test_a_compiled_model_compiles_after_its_flops_are_counted(eager_backend):
    model = StanceSeen()
    model.compile()
    x = torch.randn(4, 8)
    flops = count_training_flops_per_sample(model, x)
    assert flops == count_training_flops_per_sample(StanceSeen(), x) > 0  # counted as it runs eager
    assert compiled_frames() == 0
    model(x)
    assert compiled_frames() == 1


def test_flops_are_counted_with_torchdynamo_told_to_run_eager(eager_backend):
    model = StanceSeen()
    model.compile()
    count_training_flops_per_sample(model, torch.randn(4, 8))
    assert model.seen == ["force_eager"] and stance() == "default"


def test_a_compiled_model_compiles_after_a_sync_count_and_runs_eager_within_it(eager_backend):
    model = StanceSeen()
    model.compile()
    x = torch.randn(4, 8)
    with SyncCounter():
        model(x)
    assert model.seen == ["force_eager"] and stance() == "default" and compiled_frames() == 0
    model(x)
    assert compiled_frames() == 1 and len(model.seen) == 1  # the second call ran compiled


def test_a_sync_count_that_raises_leaves_the_stance_as_it_was(eager_backend):
    with pytest.raises(ValueError, match="inside"):
        with SyncCounter():
            raise ValueError("raised inside the count")
    assert stance() == "default"


def test_the_trainer_compiles_the_model_it_counts_flops_of(eager_backend, tmp_path):
    from speedkit.methods import TorchCompile
    from speedkit.train.trainer import Trainer

    train, _ = toy_loaders()
    record = Trainer(StanceSeen(), train, max_duration="3ba", device="cpu", run_dir=tmp_path, methods=[TorchCompile()],
                     save_checkpoints=False, progress_bar=False).fit()
    assert record.environment.get("matmul_peak_flops")  # SpeedMonitor counted the FLOPs at the first batch
    assert compiled_frames() >= 1
