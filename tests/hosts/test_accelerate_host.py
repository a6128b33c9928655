"""speedkit's methods in an Accelerate script under `accelerate launch` with two CPU processes: the ranks end
with the same weights, which equal one process's on the merged batches, the clock counts both ranks, and an epoch
is each process's share of the loader speedkit was given before accelerator.prepare split it."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from prerequisites import import_or_missing

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "accelerate_loop_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("duration, steps", [("6ba", 6), ("2ep", 8)])
def test_two_cpu_processes_under_accelerate_launch_train_as_one(tmp_path, duration, steps):
    import_or_missing("accelerate", "pip install 'torch-speedkit[accelerate]'")
    # --multi_gpu picks accelerate's torchrun launcher (--cpu would pick its single-process or mpirun one); the
    # worker's Accelerator(cpu=True) then trains on the CPU with gloo.
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(_free_port()), str(WORKER), str(tmp_path), duration]
    done = subprocess.run(launch, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    import accelerate_loop_worker  # the same run in this process, on the merged batches

    accelerate_loop_worker.main(tmp_path, single=True, duration=duration)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    single = json.loads((tmp_path / "single.json").read_text())

    assert ranks[0]["world"] == 2 and ranks[0]["optimizer"] == "AcceleratedOptimizer"
    # The worker's loader has 8 batches of 32; prepared, each process takes 4 of them an epoch.
    per_epoch = 4
    for result in (*ranks, single):
        assert result["batches_per_epoch"] == per_epoch
        assert len(result["losses"]) == result["ema_updates"] == steps
        assert result["epochs"] == steps // per_epoch and result["passes"] == -(-steps // per_epoch)
        assert result["samples"] == steps * 64  # the clock counts both processes' samples
    for name, value in single["weights"].items():
        ours = [torch.tensor(r["weights"][name]) for r in ranks]
        assert torch.equal(ours[0], ours[1]), name  # DDP kept the ranks together (EMA's average too)
        assert torch.allclose(ours[0], torch.tensor(value), atol=1e-5), name  # = one process on merged batches
    merged = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]
    assert merged == pytest.approx(single["losses"], rel=1e-5)
    # A process that iterates the loader it gave speedkit, not the prepared one, is refused at its first batch.
    for rank in ranks:
        assert re.search(r"speedkit counted 4 batches an epoch in each process, its share of the 8 .*not iterating "
                         r"a loader accelerator prepared: iterate the loader accelerator.prepare\(loader\) returns",
                         rank["refusal"])


@pytest.mark.parametrize("batches, drop_last, split_batches, even_batches",
                         [(b, d, s, e) for b in (6, 7, 8) for d in (False, True) for s in (False, True)
                          for e in (True, False)])
def test_the_share_counted_before_prepare_is_the_prepared_loaders_length(batches, drop_last, split_batches,
                                                                           even_batches):
    """speedkit's count of an unprepared loader's share is the length accelerate's own prepare gives each process."""
    import_or_missing("accelerate", "pip install 'torch-speedkit[accelerate]'")
    from accelerate.data_loader import prepare_data_loader

    from speedkit.hosts.loop import _share

    data = torch.utils.data.TensorDataset(torch.arange(batches * 4 - 1).float())  # the last batch is short
    loader = torch.utils.data.DataLoader(data, batch_size=4, drop_last=drop_last)
    for process in range(2):
        settings = dict(num_processes=2, process_index=process, split_batches=split_batches, even_batches=even_batches)
        prepared = prepare_data_loader(loader, **settings)
        counted = _share(loader, SimpleNamespace(**settings, dispatch_batches=None))
        assert counted.batches == len(prepared)
        assert counted.samples == (4 if split_batches else 8)
