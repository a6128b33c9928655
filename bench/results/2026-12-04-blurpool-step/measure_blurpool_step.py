"""A ResNet training step with BlurPool against the same step without it, on this machine's CPU: BlurPool's blur
as speedkit computes its gradient now (its own forward convolution, ``blurpool._Blur``) and as autograd did before
(through the strided depthwise convolution's backward kernel). torchvision ResNet-18 at the imagenet task's `cpu`
rehearsal size (64 px, batch 64, channels_last, SGD with momentum), in bf16 autocast and in fp32. The arms are
interleaved step by step; each figure is the median step time after warm-up. Run it on a quiet machine:

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/results/2026-12-04-blurpool-step/measure_blurpool_step.py --out bench/results/2026-12-04-blurpool-step/blurpool_step.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

from speedkit.methods import blurpool
from speedkit.record.runs import cpu_name

ARMS = ("plain", "blurpool (now)", "blurpool, autograd's gradient (before)")


def autograd_blur(x: torch.Tensor, stride: int = 1, filter: torch.Tensor | None = None) -> torch.Tensor:
    """The blur as speedkit computed it before: one strided depthwise convolution, differentiated by autograd."""
    if filter is None:
        filter = blurpool.blur_filter(x.shape[1], x.device, x.dtype)
    return F.conv2d(x, filter.to(x.dtype), stride=stride, padding=1, groups=x.shape[1])


def model_for(arm: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=100)
    if arm != "plain":
        blurpool.apply_blurpool(model)
    return model.to(memory_format=torch.channels_last)


def timed_step(model, optimizer, images, labels, precision: str) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=generator)
    images = images.to(memory_format=torch.channels_last)
    labels = torch.randint(0, 100, (args.batch,), generator=generator)
    now, rows = blurpool.blur_2d, []
    for precision in ("bf16", "fp32"):
        models = {arm: model_for(arm) for arm in ARMS}
        optimizers = {arm: torch.optim.SGD(m.parameters(), 0.1, momentum=0.9) for arm, m in models.items()}
        times = {arm: [] for arm in ARMS}
        for step in range(args.steps + 2):
            for arm in ARMS:
                blurpool.blur_2d = autograd_blur if arm.endswith("(before)") else now  # the layers call it by name
                took = timed_step(models[arm], optimizers[arm], images, labels, precision)
                if step >= 2:  # the first two are warm-up
                    times[arm].append(took)
        blurpool.blur_2d = now
        plain = statistics.median(times["plain"])
        for arm in ARMS:
            median = statistics.median(times[arm])
            rows.append({"precision": precision, "arm": arm, "step_s": round(median, 4),
                         "vs_plain": round(median / plain, 3)})
            print(f"{precision} {arm:40s} {median * 1000:6.0f} ms/step  {median / plain:.2f}x plain")
    args.out.write_text(json.dumps({
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "model": f"torchvision resnet18, {args.image_size} px, batch {args.batch}, channels_last, SGD momentum 0.9",
        "steps": args.steps,
        "command": "OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/results/2026-12-04-blurpool-step/measure_blurpool_step.py "
                   "--out bench/results/2026-12-04-blurpool-step/blurpool_step.json",
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
