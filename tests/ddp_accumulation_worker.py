"""Two ranks (torchrun, gloo): the same small DDP run with and without gradient accumulation, counting the
gradient all-reduces DDP makes. tests/test_ddp_accumulation.py starts it and reads ``OUT/result.json``.

    python -m torch.distributed.run --nproc-per-node 2 tests/ddp_accumulation_worker.py OUT
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from speedkit import Trainer, distributed
from speedkit.data import BatchLoader

STEPS, GLOBAL_BATCH = 6, 16  # 8 samples per rank per step; accumulation splits them into microbatches of 4


def data() -> BatchLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) * 3).long() % 3
    return BatchLoader(x, y, GLOBAL_BATCH, shuffle=True, seed=0, augment=None)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def run(out: Path, name: str, sync_every_microbatch: bool = False, **kwargs) -> dict:
    trainer = Trainer(model(), data(), max_duration=f"{STEPS}ba", device="cpu", precision="fp32", seed=0,
                      run_dir=out / "runs", run_name=name, save_checkpoints=False, log_interval=1,
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), **kwargs)
    assert trainer.parallel == "ddp"
    if sync_every_microbatch:  # what the Trainer did before no_sync: every microbatch's backward all-reduces
        trainer.plan.gradient_sync = lambda module, last: contextlib.nullcontext()
    calls = []

    def counting_allreduce(state, bucket):  # DDP calls its comm hook once per bucket per all-reduce
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(None, bucket)

    trainer._train_module.register_comm_hook(None, counting_allreduce)  # the DDP wrapper the forward runs
    record = trainer.fit()
    weights = {k: v.tolist() for k, v in trainer.state.model.state_dict().items()}
    return {"allreduce_calls": len(calls), "buckets": len(set(calls)), "weights": weights,
            "microbatches": trainer.state.num_microbatches, "losses": [s["loss"] for s in record.steps]}


def main(out: Path) -> None:
    results = {"steps": STEPS,
               "whole_batch": run(out, "whole"),
               "accumulated": run(out, "accumulated", grad_accum=2),
               "accumulated_synced_each": run(out, "synced-each", grad_accum=2, sync_every_microbatch=True)}
    if distributed.is_main():
        (out / "result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
