"""One process of `accelerate launch --multi_gpu --num_processes 2` on the CPU: speedkit in an Accelerate loop.

Writes ``<out>/rank<N>.json``: the per-step losses, the final weights (after FIT_END), EMA's update count and
the samples the clock counted. ``main(out, single=True)`` is the same run in one process on batches twice as large.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import leave_torchrun, toy_classification, toy_model  # noqa: E402

from speedkit.hosts import Speedkit  # noqa: E402
from speedkit.methods import EMA, LabelSmoothing, Muon  # noqa: E402

STEPS = 6


def main(out: Path, single: bool) -> None:
    from accelerate import Accelerator

    accelerator = None if single else Accelerator(cpu=True)
    x, y = toy_classification(n=256)
    loader = DataLoader(TensorDataset(x, y), batch_size=64 if single else 32, shuffle=False)
    model = toy_model()
    sk = Speedkit([EMA(half_life="2ba"), LabelSmoothing(0.1), Muon(lr=0.02)], max_duration=f"{STEPS}ba",
                  train_dataloader=loader, accelerator=accelerator)
    model = sk.prepare_model(model)                                              # speedkit: surgery
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))  # speedkit: Muon
    if accelerator is not None:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    while not sk.done:
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
              "optimizer": type(optimizer).__name__}
    (out / f"{'single' if single else f'rank{rank}'}.json").write_text(json.dumps(result))
    if accelerator is not None:
        accelerator.end_training()  # as accelerate asks every script to end


if __name__ == "__main__":
    main(Path(sys.argv[1]), single=False)
    leave_torchrun()
