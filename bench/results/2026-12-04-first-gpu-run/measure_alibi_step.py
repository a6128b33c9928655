"""A training step with ALiBi against the same step with causal attention, on this machine's CPU: ALiBi's bias as
speedkit hands it to SDPA now ([1, H, T, T], which SDPA's fused kernels take) and as it did before ([H, T, T],
which sends SDPA to its unfused math kernel; both arms reuse one bias per shape, so they differ in the kernel
alone). The three arms are interleaved step by step; each figure is the
median step time after warm-up. Run it on a quiet machine:

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/results/2026-12-04-first-gpu-run/measure_alibi_step.py \
        --out bench/results/2026-12-04-first-gpu-run/alibi_step.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speedkit.methods import alibi
from speedkit.models.gpt import GPT, gpt_config
from speedkit.record.runs import cpu_name


class BiasAs3D(alibi.ALiBiTransform):
    """ALiBi's bias in the shape speedkit passed before: [H, Tq, Tk]."""

    def __call__(self, q, k, v, attn_mask, is_causal, scale):
        q, k, v, mask, is_causal, scale = super().__call__(q, k, v, attn_mask, is_causal, scale)
        return q, k, v, mask[0], is_causal, scale


def model_for(arm: str, length: int) -> GPT:
    torch.manual_seed(0)
    model = GPT(gpt_config("gpt-mini", block_size=length))
    if arm != "causal":
        alibi.apply_alibi(model)
    if arm == "alibi, 3-D bias (before)":
        for module in model.modules():
            transforms = getattr(module, "_speedkit_attention_transforms", [])  # (order, name, transform)
            transforms[:] = [(order, name, BiasAs3D()) for order, name, _ in transforms]
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,512,1024")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    arms = ("causal", "alibi, 4-D bias (now)", "alibi, 3-D bias (before)")
    rows = []
    for length in (int(n) for n in args.lengths.split(",")):
        models = {arm: model_for(arm, length) for arm in arms}
        optimizers = {arm: torch.optim.AdamW(m.parameters(), 1e-3) for arm, m in models.items()}
        tokens = torch.randint(0, 256, (args.batch, length), generator=torch.Generator().manual_seed(0))
        times = {arm: [] for arm in arms}
        for step in range(args.steps + 2):
            for arm in arms:
                start = time.perf_counter()
                with torch.autocast("cpu", torch.bfloat16):
                    logits = models[arm](tokens)
                F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten()).backward()
                optimizers[arm].step()
                optimizers[arm].zero_grad(set_to_none=True)
                if step >= 2:  # the first two are warm-up
                    times[arm].append(time.perf_counter() - start)
        causal = statistics.median(times["causal"])
        for arm in arms:
            median = statistics.median(times[arm])
            rows.append({"length": length, "arm": arm, "step_s": round(median, 4), "vs_causal": round(median / causal, 3)})
            print(f"T={length:5d} {arm:26s} {median * 1000:7.0f} ms/step  {median / causal:.2f}x causal")
    args.out.write_text(json.dumps({
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "model": "speedkit GPT gpt-mini (6 layers, 6 heads, width 384), bf16 autocast",
        "batch": args.batch, "steps": args.steps,
        "command": "OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/results/2026-12-04-first-gpu-run/"
                   "measure_alibi_step.py --out bench/results/2026-12-04-first-gpu-run/alibi_step.json",
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
