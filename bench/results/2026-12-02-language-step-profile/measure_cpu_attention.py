"""The GPT's attention on a CPU under bf16 autocast: PyTorch's bf16 SDPA kernel against the same attention in fp32
(what ``speedkit.models.gpt.CausalSelfAttention._attend`` does on a CPU). Trains the pydocs ``hot`` preset to its
target on fresh seeds, the two kernels interleaved seed by seed, and writes each run's time to 3.30 bits per byte.
Run it on a quiet machine (on a CPU where ``precision="auto"`` picks bf16; elsewhere both arms are fp32):

    OMP_NUM_THREADS=2 .venv/bin/python bench/results/2026-12-02-language-step-profile/measure_cpu_attention.py --out bench/results/2026-12-02-language-step-profile/language_cpu_attention.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from speedkit.models import gpt
from speedkit.record.runs import cpu_name
from speedkit.tasks import make_trainer

FP32_ATTENTION = gpt.CausalSelfAttention._attend


def bf16_attention(self, q, k, v):
    """The attention before: SDPA in the autocast dtype."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5],
                        help="seeds (default 3 4 5, fresh to the benchmark)")
    parser.add_argument("--out", type=Path, help="write the runs and the paired speed-ups here as JSON")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        for arm, attend in (("bf16 kernel", bf16_attention), ("fp32", FP32_ATTENTION)):
            gpt.CausalSelfAttention._attend = attend
            with tempfile.TemporaryDirectory() as run_dir:
                record = make_trainer("pydocs", "hot", seed=seed, device="cpu", run_dir=run_dir, save_checkpoints=False,
                                      stop_at_target=True, run_name=f"hot-s{seed}").fit()
            runs.append({"seed": seed, "attention": arm, "precision": record.config.get("precision_resolved"),
                         "time_to_target_s": record.time_to("eval/bpb", 3.30), "best_bpb": record.best("eval/bpb")})
            print(json.dumps(runs[-1]), flush=True)
    pairs = [a["time_to_target_s"] / b["time_to_target_s"] for a, b in zip(runs[::2], runs[1::2])
             if a["time_to_target_s"] and b["time_to_target_s"]]
    print(f"fp32 attention reaches 3.30 bpb {statistics.median(pairs):.2f}x sooner (median of {len(pairs)} seeds)")
    if args.out:
        machine = f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
        median = statistics.median(pairs) if pairs else None
        args.out.write_text(json.dumps({"machine": machine, "runs": runs, "speedups": pairs, "speedup_median": median},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
