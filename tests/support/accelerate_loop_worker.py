"""One process of `accelerate launch --multi_gpu --num_processes 2` on the CPU: speedkit in an Accelerate loop.

Writes ``<out>/rank<N>.json``: the per-step losses, the final weights (after FIT_END), EMA's update count, the
samples, epochs and epoch length the clock counted, the passes the loop made over the loader, and what speedkit
said to a process that iterates the loader accelerate did not prepare. ``main(out, single=True)`` is the same run
in one process on batches twice as large. ``duration`` (the second argument) is the run's ``max_duration``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import leave_torchrun, toy_classification, toy_model  # noqa: E402

from speedkit.hosts import HostCannotServeError, Speedkit  # noqa: E402
from speedkit.methods import EMA, LabelSmoothing, Muon  # noqa: E402

STEPS = 6


def unprepared_loader_refusal(loader, accelerator, duration: str) -> str | None:
    """What speedkit says at the first batch of a process that iterates the loader it was given, not prepared."""
    sk = Speedkit([], max_duration=duration, train_dataloader=loader, accelerator=accelerator)
    try:
        sk.batch(next(iter(loader)))
    except HostCannotServeError as refusal:
        return str(refusal)
    return None


def main(out: Path, single: bool, duration: str = f"{STEPS}ba") -> None:
    from accelerate import Accelerator

    accelerator = None if single else Accelerator(cpu=True)
    x, y = toy_classification(n=256)
    loader = DataLoader(TensorDataset(x, y), batch_size=64 if single else 32, shuffle=False)
    refusal = None if single else unprepared_loader_refusal(loader, accelerator, duration)
    model = toy_model()
    # The guide's order: speedkit sees the loader before accelerator.prepare splits it between the processes.
    sk = Speedkit([EMA(half_life="2ba"), LabelSmoothing(0.1), Muon(lr=0.02)], max_duration=duration,
                  train_dataloader=loader, accelerator=accelerator)
    model = sk.prepare_model(model)                                              # speedkit: surgery
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))  # speedkit: Muon
    if accelerator is not None:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, passes = [], 0
    while not sk.done:
        passes += 1
        for batch in loader:
            batch = sk.batch(batch)
            loss = sk.loss(model(batch[0]), batch)
            sk.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            sk.step_end()
            losses.append(loss.item())
            if sk.done:
                break
    sk.finish()
    plain = sk.state.model
    rank = accelerator.process_index if accelerator is not None else 0
    ema = next(m for m in sk.methods if m.name == "ema")
    result = {"losses": losses, "weights": {k: v.tolist() for k, v in plain.state_dict().items()},
              "ema_updates": ema.updates, "samples": sk.state.timestamp.sample, "world": sk.world,
              "optimizer": type(optimizer).__name__, "epochs": sk.state.timestamp.epoch, "passes": passes,
              "batches_per_epoch": sk.state.batches_per_epoch, "refusal": refusal}
    (out / f"{'single' if single else f'rank{rank}'}.json").write_text(json.dumps(result))
    if accelerator is not None:
        accelerator.end_training()  # as accelerate asks every script to end


if __name__ == "__main__":
    main(Path(sys.argv[1]), single=False, duration=sys.argv[2])
    leave_torchrun()
