"""The engine's own cost: steps/s of a tiny model through the Trainer (every event, no methods) against a bare loop.

    PYTHONPATH=. python bench/engine_overhead.py [--steps 2000] [--repeats 5] [--device cpu|cuda] [--profile]

The loops train the same two-layer MLP on the same in-memory batches with the same optimizer; the model is
tiny so that the per-step overhead of the loop is what the differences measure. Three loops:

- ``bare``: forward, loss, backward, step, zero_grad;
- ``loop_only``: the Trainer with no methods and no callbacks: every event fires, nobody handles it (what the
  engine, the timestamp, the step's bookkeeping cost);
- ``trainer``: the Trainer as a user gets it, with its default callbacks (speed and learning-rate monitors,
  the NaN guard's on-device check of every loss and gradient).

The runs alternate (bare, loop_only, trainer, bare, ...) and the best of each is kept, which a busy machine
slows less than it slows one try. Beside them, ``event_ns`` is one event that nobody handles, dispatched a
million times. ``--profile`` times every method at every event (``Engine.profile``), to show what that costs.
Prints one JSON line. Run it on a quiet machine; a shared one gives noise, not figures.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from speedkit.core.devices import synchronize
from speedkit.core.event import Event
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


def make_trainer(batches, device, profile: bool, run_dir: str, callbacks: bool = True) -> Trainer:
    trainer = Trainer(make_model(device), batches, max_duration=f"{len(batches)}ba", device=device,
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.01), log_interval=len(batches),
                      save_checkpoints=False, run_dir=run_dir, run_name="engine-overhead", overwrite=True,
                      progress_bar=False)  # each repeat measures afresh, in the same folder
    trainer.engine.profile = profile
    if not callbacks:
        trainer.state.callbacks = []  # the engine rebuilds its handler table at FIT_START
    return trainer


def trainer_loop(batches, device, profile: bool, run_dir: str, callbacks: bool = True) -> float:
    trainer = make_trainer(batches, device, profile, run_dir, callbacks)
    trainer.fit()
    return len(batches) / trainer.record.timings["train_s"]


def unhandled_event_ns(device, run_dir: str, calls: int = 1_000_000) -> float:
    """Nanoseconds for one event that no method and no callback handles, default callbacks present."""
    engine = make_trainer(make_data(1, device), device, False, run_dir).engine
    event = Event.BEFORE_FORWARD  # handled by none of the default callbacks
    run = engine.run_event
    start = time.perf_counter()
    for _ in range(calls):
        run(event)
    return 1e9 * (time.perf_counter() - start) / calls


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
    best = {"bare": 0.0, "loop_only": 0.0, "trainer": 0.0}
    for _ in range(args.repeats):
        best["bare"] = max(best["bare"], bare_loop(batches, device))
        best["loop_only"] = max(best["loop_only"], trainer_loop(batches, device, args.profile, args.run_dir, False))
        best["trainer"] = max(best["trainer"], trainer_loop(batches, device, args.profile, args.run_dir))
    over = lambda arm: round(1e6 * (1 / best[arm] - 1 / best["bare"]), 1)  # noqa: E731
    print(json.dumps({"device": str(device), "steps": args.steps, "profile": args.profile,
                      **{f"{arm}_steps_per_s": round(rate, 1) for arm, rate in best.items()},
                      "loop_only_overhead_us_per_step": over("loop_only"), "overhead_us_per_step": over("trainer"),
                      "event_ns": round(unhandled_event_ns(device, args.run_dir), 1),
                      "torch_threads": torch.get_num_threads()}))

if __name__ == "__main__":
    main()
