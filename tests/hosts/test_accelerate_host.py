"""speedkit's methods in an Accelerate script under `accelerate launch` with two CPU processes: the ranks end
with the same weights, which equal one process's on the merged batches, and the clock counts both ranks."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

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


def test_two_cpu_processes_under_accelerate_launch_train_as_one(tmp_path):
    import_or_missing("accelerate", "pip install 'torch-speedkit[accelerate]'")
    # --multi_gpu picks accelerate's torchrun launcher (--cpu would pick its single-process or mpirun one); the
    # worker's Accelerator(cpu=True) then trains on the CPU with gloo.
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(_free_port()), str(WORKER), str(tmp_path)]
    done = subprocess.run(launch, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    import accelerate_loop_worker  # the same run in this process, on the merged batches

    accelerate_loop_worker.main(tmp_path, single=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    single = json.loads((tmp_path / "single.json").read_text())

    assert ranks[0]["world"] == 2 and ranks[0]["optimizer"] == "AcceleratedOptimizer"
    assert ranks[0]["samples"] == single["samples"] == 6 * 64  # the clock counts both processes' samples
    assert ranks[0]["ema_updates"] == 6
    for name, value in single["weights"].items():
        ours = [torch.tensor(r["weights"][name]) for r in ranks]
        assert torch.equal(ours[0], ours[1]), name  # DDP kept the ranks together (EMA's average too)
        assert torch.allclose(ours[0], torch.tensor(value), atol=1e-5), name  # = one process on merged batches
    merged = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]
    assert merged == pytest.approx(single["losses"], rel=1e-5)
