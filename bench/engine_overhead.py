"""The engine's own cost: steps/s of a tiny model through the Trainer (every event, no methods) against a bare loop.

    PYTHONPATH=. python bench/engine_overhead.py [--steps 2000] [--repeats 5] [--device cpu|cuda] [--profile]

Both loops train the same two-layer MLP on the same in-memory batches with the same optimizer; the model is
tiny so that the per-step overhead of the loop (events, callbacks, the timestamp, logging) is what the
difference measures. The runs alternate (bare, trainer, bare, ...) and the best of each is kept, which a
busy machine slows less than it slows one try. ``--profile`` times every method at every event
(``Engine.profile``), to show what that costs. Prints one JSON line: steps/s of each and the overhead in
microseconds per step. Run it on a quiet machine; a shared one gives noise, not figures.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from speedkit.core.devices import synchronize
from speedkit.train.trainer import Trainer


def make_data(steps: int, device: torch.device, batch: int = 32, features: int = 32):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, batch, features, generator=generator).to(device)
    y = torch.randint(0, 4, (64, batch), generator=generator).to(device)
    return [(x[i % 64], y[i % 64]) for i in range(steps)]


def make_model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)


def bare_loop(batches, device) -> float:
    model = make_model(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    synchronize(device)
    start = time.perf_counter()
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return len(batches) / (time.perf_counter() - start)


def trainer_loop(batches, device, profile: bool, run_dir: str) -> float:
    trainer = Trainer(make_model(device), batches, max_duration=f"{len(batches)}ba", device=device,
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.01), log_interval=len(batches),
                      save_checkpoints=False, run_dir=run_dir, run_name="engine-overhead", overwrite=True,
                      progress_bar=False)  # each repeat measures afresh, in the same folder
    trainer.engine.profile = profile
    trainer.fit()
    return len(batches) / trainer.record.timings["train_s"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true", help="time every method at every event")
    parser.add_argument("--run-dir", default="/tmp/speedkit-engine-overhead")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    batches = make_data(args.steps, device)
    warm_up = batches[:50]  # first calls pay for kernel selection and lazy imports
    bare_loop(warm_up, device), trainer_loop(warm_up, device, args.profile, args.run_dir)
    bare, trainer = 0.0, 0.0
    for _ in range(args.repeats):
        bare = max(bare, bare_loop(batches, device))
        trainer = max(trainer, trainer_loop(batches, device, args.profile, args.run_dir))
    print(json.dumps({"device": str(device), "steps": args.steps, "profile": args.profile,
                      "bare_steps_per_s": round(bare, 1), "trainer_steps_per_s": round(trainer, 1),
                      "overhead_us_per_step": round(1e6 * (1 / trainer - 1 / bare), 1),
                      "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
