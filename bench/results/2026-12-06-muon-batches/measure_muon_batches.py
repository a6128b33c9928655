"""How Muon batches a model's hidden matrices, what a step dispatches, and what it costs on this CPU.

For each model, the batched Newton-Schulz iterations of a Muon step and the aten ops it dispatches (on a GPU about
one launch each, views aside) under three plans: one batch per shape (padding worth nothing), the plan for a CPU
and the plan for a GPU (``DISPATCHES_WORTH_FLOPS``, ``PAD_SHARE``); then the step's milliseconds on this CPU, one
batch per shape against the CPU's plan, medians of interleaved tries. Run it on a quiet machine:

    OMP_NUM_THREADS=2 .venv/bin/python bench/results/2026-12-06-muon-batches/measure_muon_batches.py --out bench/results/2026-12-06-muon-batches/muon_batches.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from pathlib import Path
from unittest import mock

import torch
import torchvision
from torch.utils._python_dispatch import TorchDispatchMode

import speedkit.optim.muon as muon
from speedkit.methods.muon import muon_parameter_names
from speedkit.models import get_model
from speedkit.record.runs import cpu_name

MODELS = {"resnet8": lambda: get_model("resnet8"), "resnet9": lambda: get_model("resnet9", num_classes=62),
          "gpt-nano": lambda: get_model("gpt-nano", vocab_size=256),
          "resnet50": lambda: torchvision.models.resnet50(), "gpt2-124m": lambda: get_model("gpt2-124m")}
TIMED = ("resnet8", "resnet9", "gpt-nano")  # the models of the tasks that run Muon on a CPU
PLANS = {plan: (muon.DISPATCHES_WORTH_FLOPS[kind], muon.PAD_SHARE[kind])  # (worth_flops, pad share)
         for plan, kind in (("cpu", "cpu"), ("gpu", "accelerator"))}
PLANS["by_shape"] = (0.0, 0.0)


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def muon_step(shapes, costs: tuple[float, float]):
    """A Muon optimizer over fresh matrices of ``shapes`` with gradients, and its step under the plan ``costs``."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = muon.Muon(params, lr=0.02)

    def step():
        with as_costs(costs):
            optimizer.step()
    step()  # the momentum buffers are made; the bf16 probe runs
    return params, step


def as_costs(costs: tuple[float, float]):
    """The CPU's dispatch costs set to ``costs`` (what an iteration's dispatches are worth, a pad's share)."""
    worth, pad_share = costs
    patches = contextlib.ExitStack()
    patches.enter_context(mock.patch.dict(muon.DISPATCHES_WORTH_FLOPS, cpu=worth))
    patches.enter_context(mock.patch.dict(muon.PAD_SHARE, cpu=pad_share))
    return patches


def planned(shapes, costs: tuple[float, float]) -> dict:
    params, step = muon_step(shapes, costs)
    with as_costs(costs):
        batches = list(muon.iteration_batches([p.grad for p in params], 5))
    with Ops() as ops:
        step()
    return {"iterations": len(batches), "largest_batch": max(len(b) for b, _ in batches), "aten_ops": ops.count}


def interleaved_ms(shapes, tries: int, repeats: int = 20) -> dict:
    steps = {plan: muon_step(shapes, PLANS[plan])[1] for plan in ("by_shape", "cpu")}
    times = {plan: [] for plan in steps}
    for _ in range(tries):
        for plan, step in steps.items():
            started = time.perf_counter()
            for _ in range(repeats):
                step()
            times[plan].append((time.perf_counter() - started) / repeats)
    return {plan: round(statistics.median(t) * 1e3, 3) for plan, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tries", type=int, default=15)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    results = {"what": __doc__.split("\n\n")[0], "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, "
               f"torch {torch.__version__}", "dispatches_worth_flops": dict(muon.DISPATCHES_WORTH_FLOPS),
               "pad_share": dict(muon.PAD_SHARE), "models": {}}
    for name, build in MODELS.items():
        model = build()
        names = set(muon_parameter_names(model))
        shapes = [tuple(p.shape) for n, p in model.named_parameters() if n in names]
        wide_shapes = {tuple(sorted((shape[0], math.prod(shape[1:])))) for shape in shapes}
        row = {"matrices": len(shapes), "wide_shapes": len(wide_shapes)}
        row["plans"] = {plan: planned(shapes, costs) for plan, costs in PLANS.items()}
        if name in TIMED:
            row["cpu_step_ms"] = interleaved_ms(shapes, args.tries)
        results["models"][name] = row
        print(name, json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
