"""Where the byte-level GPT's training step spends its time, and how much of the matmul peak it reaches.

For each variant (a pydocs preset, optionally at another batch size with the same tokens per run), trains
``--steps`` batches twice: once plain, for the FLOP/s the SpeedMonitor logs (the median of its windows,
against the measured 1024x1024 matmul of the run's precision), and once under torch.profiler, for the
share of the step by phase (``speedkit.callbacks.phase_timer``) and by kind of operator: matmuls,
attention, normalization, and the rest (elementwise work, the optimizer's foreach kernels, copies). Run it
on a quiet machine:

    OMP_NUM_THREADS=2 .venv/bin/python bench/results/2026-12-02-language-step-profile/profile_language_step.py --out bench/results/2026-12-02-language-step-profile/language_step_profile.json
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
from pathlib import Path

import torch

from speedkit.callbacks.phase_timer import profile_steps
from speedkit.record.runs import cpu_name
from speedkit.tasks import make_trainer

KINDS = {  # operator name fragments -> kind; the first match wins
    "attention": ("scaled_dot_product", "flash_attention", "_efficient_attention"),
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"),
    "normalization": ("layer_norm", "rms_norm", "aten::norm", "linalg_vector_norm"),
}


def kind_of(operator: str) -> str:
    return next((kind for kind, parts in KINDS.items() if any(p in operator for p in parts)), "other")


def variant_trainer(recipe: str, batch_size: int | None, precision: str | None, run_dir: str, **kwargs):
    changes = {"batch_size": batch_size, "precision": precision}
    changes = {k: v for k, v in changes.items() if v is not None}
    return make_trainer("pydocs", recipe, device="cpu", run_dir=run_dir, save_checkpoints=False, eval_fraction=0.05,
                        **changes, **kwargs)


def measure(recipe: str, batch_size: int | None, precision: str | None, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        record = variant_trainer(recipe, batch_size, precision, run_dir, duration=f"{steps}ba", run_name="plain").fit()
        rows = [r for r in record.steps if "throughput/flops_per_s" in r][1:]  # the first window holds start-up
        flops = statistics.median(r["throughput/flops_per_s"] for r in rows)
        tokens = statistics.median(r["throughput/tokens_per_s"] for r in rows)
        peak = record.environment["matmul_peak_flops"]
        factory = functools.partial(variant_trainer, recipe, batch_size, precision, run_dir, run_name="profiled")
        profile = profile_steps(factory, steps, torch_profiler=True, top=200)
    by_kind: dict[str, float] = {}
    for row in profile.pop("top_operators"):
        kind = kind_of(row["name"])
        by_kind[kind] = by_kind.get(kind, 0.0) + row["self_cpu_ms"]
    total = sum(by_kind.values())
    return {"recipe": recipe, "batch_size": batch_size or record.config.get("batch_size"),
            "precision": record.config.get("precision_resolved", record.config.get("precision")),
            "tokens_per_s": round(tokens), "flops_per_s": flops, "matmul_peak_flops": peak,
            "fraction_of_peak": round(flops / peak, 4),
            "operator_share": {k: round(v / total, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "phase_share": {k: v["share"] for k, v in profile["phases"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=60, help="batches per measurement (default 60)")
    parser.add_argument("--variants", default="baseline,hot,hot/fp32,hot@64",
                        help="comma-separated RECIPE[@BATCH_SIZE][/PRECISION] (default baseline,hot,hot/fp32,hot@64)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    results = []
    for variant in args.variants.split(","):
        variant, _, precision = variant.partition("/")
        recipe, _, batch = variant.partition("@")
        result = measure(recipe, int(batch) if batch else None, precision or None, args.steps)
        print(json.dumps(result))
        results.append(result)
    if args.out:
        args.out.write_text(json.dumps({"machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch "
                                                   f"{torch.__version__}", "steps": args.steps,
                                        "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
