"""DDP with gradient accumulation all-reduces once per step (no_sync on every microbatch but the last), with the
same weights as when every microbatch synced. Two CPU processes over gloo (one torchrun launch)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ddp_accumulation_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ddp-accumulation")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1",
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(WORKER), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads((out / "result.json").read_text())


def test_accumulation_all_reduces_once_per_step(result):
    steps, whole, accumulated = result["steps"], result["whole_batch"], result["accumulated"]
    synced_each = result["accumulated_synced_each"]
    assert accumulated["microbatches"] == synced_each["microbatches"] == 2 and whole["microbatches"] == 1
    buckets = whole["buckets"]
    assert whole["allreduce_calls"] == steps * buckets
    assert accumulated["allreduce_calls"] == steps * buckets  # once per step, however many microbatches
    assert synced_each["allreduce_calls"] == 2 * steps * buckets  # the behaviour it replaces: once per microbatch


def test_accumulated_weights_equal_syncing_every_microbatch_and_the_whole_batch(result):
    accumulated = result["accumulated"]
    for other in ("accumulated_synced_each", "whole_batch"):
        assert accumulated["losses"] == pytest.approx(result[other]["losses"], rel=1e-6), other
        for name, value in accumulated["weights"].items():
            # the same sums in another order (local adds, then one all-reduce): equal to float rounding
            assert torch.allclose(torch.tensor(value), torch.tensor(result[other]["weights"][name]),
                                  rtol=1e-6, atol=1e-7), (other, name)
