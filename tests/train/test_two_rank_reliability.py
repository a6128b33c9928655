"""Two CPU processes over gloo, one torchrun launch of tests/support/two_rank_worker.py:

- DDP with gradient accumulation all-reduces once per step (no_sync on every microbatch but the last), with the
  same weights as when every microbatch synced;
- an interrupted DDP run's checkpoint (rank 0 alone) says that it holds rank 0's RNG only, and a resume says so;
- an interrupted FSDP run writes no half checkpoint: the last one stays intact (all shards verify), the record
  says so, and the resumed run logs the same losses as one never interrupted."""
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

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parents[1] / "support" / "two_rank_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("two-ranks")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1",
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(WORKER), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads((out / "result.json").read_text())


def test_accumulation_all_reduces_once_per_step(result):
    result = result["accumulation"]
    steps, whole, accumulated = result["steps"], result["whole_batch"], result["accumulated"]
    synced_each = result["accumulated_synced_each"]
    assert accumulated["microbatches"] == synced_each["microbatches"] == 2 and whole["microbatches"] == 1
    buckets = whole["buckets"]
    assert whole["allreduce_calls"] == steps * buckets
    assert accumulated["allreduce_calls"] == steps * buckets  # once per step, however many microbatches
    assert synced_each["allreduce_calls"] == 2 * steps * buckets  # the behaviour it replaces: once per microbatch


def test_accumulated_weights_equal_syncing_every_microbatch_and_the_whole_batch(result):
    result = result["accumulation"]
    accumulated = result["accumulated"]
    for other in ("accumulated_synced_each", "whole_batch"):
        assert accumulated["losses"] == pytest.approx(result[other]["losses"], rel=1e-6), other
        for name, value in accumulated["weights"].items():
            # the same sums in another order (local adds, then one all-reduce): equal to float rounding
            assert torch.allclose(torch.tensor(value), torch.tensor(result[other]["weights"][name]),
                                  rtol=1e-6, atol=1e-7), (other, name)


def assert_same_losses(resumed, uninterrupted) -> None:
    """Every batch logged once, in order, with the loss of the run never interrupted (none repeated or skipped)."""
    assert [b for b, _ in resumed] == [b for b, _ in uninterrupted] == list(range(1, 9))
    assert [loss for _, loss in resumed] == pytest.approx([loss for _, loss in uninterrupted], rel=1e-6)


def test_an_interrupted_ddp_run_says_its_checkpoint_holds_rank_0s_rng_only(result):
    ddp = result["ddp_interrupted"]
    stop = ddp["after_stop"]
    assert stop["status"] == "interrupted" and stop["latest_batch"] == 5 and stop["rng_by_rank"] == 0
    assert "written by rank 0 alone (the run interrupted), so it holds rank 0's RNG state only" in \
        stop["notes"]["rank_0_rng_only"]
    assert ddp["resumed_status"] == "completed"
    assert "all 2 ranks continue from it" in ddp["resumed_notes"]["rng_not_restored_per_rank"]
    assert_same_losses(ddp["resumed_losses"], ddp["uninterrupted_losses"])  # no dropout here


def test_an_interrupted_fsdp_run_keeps_the_last_complete_checkpoint_and_says_so(result):
    fsdp = result["fsdp_interrupted"]
    stop = fsdp["after_stop"]
    assert stop["status"] == "interrupted"
    assert stop["latest_batch"] == 4 and stop["rng_by_rank"] == 2  # the save before the stop; its shards verified
    note = stop["notes"]["checkpoint_not_written"]
    assert "no checkpoint at batch 5" in note and "ba000000004.ckpt, is kept intact" in note
    assert fsdp["resumed_status"] == "completed"
    assert "rng_not_restored_per_rank" not in fsdp["resumed_notes"]  # every rank's RNG came back
    assert_same_losses(fsdp["resumed_losses"], fsdp["uninterrupted_losses"])
