"""Two ranks (torchrun, gloo), small runs for tests/train/test_two_rank_reliability.py, which reads ``OUT/result.json``:

- accumulation: the same DDP run with and without gradient accumulation, counting DDP's gradient all-reduces;
- ddp_interrupted / fsdp_interrupted: a run stopped by a KeyboardInterrupt at batch 5 on both ranks (Ctrl-C in a
  terminal reaches every rank), what its checkpoint folder and record say, then the same run resumed.

    python -m torch.distributed.run --nproc-per-node 2 tests/support/two_rank_worker.py OUT
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
from helpers import leave_torchrun
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from speedkit import Callback, RunRecord, Trainer
from speedkit.core import distributed
from speedkit.data import BatchLoader
from speedkit.train.checkpoint import load_checkpoint, load_sharded_checkpoint

STEPS, GLOBAL_BATCH = 6, 16  # 8 samples per rank per step; accumulation splits them into microbatches of 4


def data() -> BatchLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) * 3).long() % 3
    return BatchLoader(x, y, GLOBAL_BATCH, shuffle=True, seed=0, augment=None)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def trainer(out: Path, name: str, **kwargs) -> Trainer:
    options = dict(max_duration=f"{STEPS}ba", device="cpu", precision="fp32", seed=0, run_dir=out / "runs",
                   run_name=name, save_checkpoints=False, log_interval=1)
    return Trainer(model(), data(), optimizers=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                   **{**options, **kwargs})


def accumulation_run(out: Path, name: str, sync_every_microbatch: bool = False, **kwargs) -> dict:
    run = trainer(out, name, parallel="ddp", **kwargs)
    assert run.parallel == "ddp"
    if sync_every_microbatch:  # what the Trainer did before no_sync: every microbatch's backward all-reduces
        run.plan.gradient_sync = lambda module, last: contextlib.nullcontext()
    calls = []

    def counting_allreduce(state, bucket):  # DDP calls its comm hook once per bucket per all-reduce
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(None, bucket)

    run._train_module.register_comm_hook(None, counting_allreduce)  # the DDP wrapper the forward runs
    record = run.fit()
    weights = {k: v.tolist() for k, v in run.state.model.state_dict().items()}
    return {"allreduce_calls": len(calls), "buckets": len(set(calls)), "weights": weights,
            "microbatches": run.state.num_microbatches, "losses": [s["loss"] for s in record.steps]}


def accumulation(out: Path) -> dict:
    return {"steps": STEPS,
            "whole_batch": accumulation_run(out, "whole"),
            "accumulated": accumulation_run(out, "accumulated", grad_accum=2),
            "accumulated_synced_each": accumulation_run(out, "synced-each", grad_accum=2, sync_every_microbatch=True)}


class InterruptAfter(Callback):
    """A KeyboardInterrupt at the end of batch ``batch`` on every rank (Ctrl-C reaches them all)."""

    def __init__(self, batch: int):
        self.batch = batch

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            raise KeyboardInterrupt


def interrupted_then_resumed(out: Path, parallel: str) -> dict:
    """Stopped at batch 5 (checkpoints every 2), then resumed to the end; beside it the run never stopped."""
    options = dict(parallel=parallel, save_checkpoints=True, save_interval="2ba", max_duration="8ba")
    try:
        trainer(out, f"{parallel}-interrupted", callbacks=[InterruptAfter(5)], **options).fit()
        raise AssertionError("the interrupt did not stop the run")
    except KeyboardInterrupt:
        pass
    distributed.barrier()  # rank 0 has written what it writes
    folder = out / "runs" / f"{parallel}-interrupted"
    latest = folder / "checkpoints" / "latest.ckpt"
    payload = load_checkpoint(latest)
    if payload.get("sharded") is not None:  # every rank checks its share of the shard files (a collective)
        payload = load_sharded_checkpoint(latest, payload)
    after_stop = {"status": RunRecord.load(folder).status, "notes": RunRecord.load(folder).notes,
                  "latest_batch": payload["timestamp"]["batch"], "rng_by_rank": len(payload.get("rng_by_rank") or ())}
    distributed.barrier()  # rank 0 has read the record before the resumed run rewrites it
    resumed = trainer(out, f"{parallel}-interrupted", autoresume=True, **options).fit()
    uninterrupted = trainer(out, f"{parallel}-uninterrupted", **options).fit()
    return {"after_stop": after_stop, "resumed_status": resumed.status, "resumed_notes": resumed.notes,
            "resumed_losses": [(s["batch"], s["loss"]) for s in resumed.steps],
            "uninterrupted_losses": [(s["batch"], s["loss"]) for s in uninterrupted.steps]}


def main(out: Path) -> None:
    results = {"accumulation": accumulation(out),
               "ddp_interrupted": interrupted_then_resumed(out, "ddp"),
               "fsdp_interrupted": interrupted_then_resumed(out, "fsdp")}
    if distributed.is_main():
        (out / "result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    leave_torchrun()
