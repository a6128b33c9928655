"""What Muon's step costs on a model's hidden matrices, and where its Newton-Schulz dtype switches.

For each matrix shape Muon would own in ``--model``, the orthogonalization is timed three ways: the
textbook form (``b * A + c * A @ A``, one op per term), the fused form Muon runs (``addmm``) in fp32, and
the fused form in bf16; then the whole optimizer step as shipped. Medians of interleaved tries. The
fp32/bf16 columns are what ``CPU_BF16_MIN_ENTRIES`` was read from. Run it on a quiet machine:

    OMP_NUM_THREADS=2 .venv/bin/python bench/results/2026-12-03-muon-step/measure_muon_step.py --out bench/results/2026-12-03-muon-step/muon_step.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from speedkit.core.devices import cpu_has_fast_bf16
from speedkit.methods.muon import muon_parameter_names
from speedkit.models import get_model
from speedkit.optim.muon import CPU_BF16_MIN_ENTRIES, NS_COEFFICIENTS, Muon, zeropower_via_newtonschulz
from speedkit.record.runs import cpu_name


def textbook_newton_schulz(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The iteration written term by term, as papers state it: the form the fused one replaced."""
    a, b, c = NS_COEFFICIENTS
    X = G.mT if G.size(0) > G.size(1) else G
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.mT if G.size(0) > G.size(1) else X


def median_ms(fn, tries: int) -> float:
    fn()  # the first call pays for kernel selection
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default="resnet9", help="a speedkit model name (default resnet9)")
    parser.add_argument("--num-classes", type=int, default=62)
    parser.add_argument("--tries", type=int, default=30)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = get_model(args.model, num_classes=args.num_classes)
    names = set(muon_parameter_names(model))
    params = [p for name, p in model.named_parameters() if name in names]
    shapes = sorted({(p.size(0), p[0].numel()) for p in params})
    rows = []
    for shape in shapes:
        G = torch.randn(shape)
        rows.append({"shape": list(shape), "entries": shape[0] * shape[1],
                     "textbook_fp32_ms": median_ms(lambda: textbook_newton_schulz(G), args.tries),
                     "fused_fp32_ms": median_ms(lambda: zeropower_via_newtonschulz(G, dtype=torch.float32), args.tries),
                     "fused_bf16_ms": median_ms(lambda: zeropower_via_newtonschulz(G, dtype=torch.bfloat16), args.tries)})
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = Muon(params, lr=0.02)
    result = {"what": f"Muon on {args.model}'s hidden matrices: Newton-Schulz per shape, and one optimizer step",
              "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
              "cpu_has_fast_bf16": cpu_has_fast_bf16(), "cpu_bf16_min_entries": CPU_BF16_MIN_ENTRIES,
              "shapes": rows, "step_ms": median_ms(optimizer.step, args.tries),
              "matrices": len(params)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
