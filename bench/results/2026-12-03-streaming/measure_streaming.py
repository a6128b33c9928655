"""Streamed data, measured: resident memory against the data set's size, and images/s and tokens/s per loader worker.

For each ``--images`` count, writes a folder of generated JPEGs of varied sizes (``--min-side`` to ``--max-side``
pixels, 10 classes), prepares it as shards (``speedkit data prepare``), then in a fresh child process per
(count, workers) streams ``--batches`` training batches at ``--image-size`` and reports:

* ``rss_mb``: the resident memory (PSS) of the child and its loader workers together, the largest of samples
  taken every batch (flat in the data set's size is the point: a 200,000-image set must not need more than a
  20,000-image one);
* ``images_per_s`` and ``images_per_s_per_worker``: batches decoded, cropped, flipped and normalised;
* with ``--step``: a small ResNet's forward and backward on each batch, and ``data_wait_share``, the share of
  the loop's time spent waiting for the next batch.

``--text DIR`` also prepares a text folder as BPE token shards and reports tokens/s per worker.

    .venv/bin/python bench/results/2026-12-03-streaming/measure_streaming.py --images 20000 200000 --workers 1 2 4 \\
        --out bench/results/2026-12-03-streaming/streaming.json

Run it on a quiet machine: the numbers are timings. Folders and shards go to a temporary directory unless
``--dir`` is given (they are kept there, and reused by a later run).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = "--child"


POOL = 2_000  # distinct images; the rest of a folder hard-links them (see write_images)


def write_images(root: Path, count: int, min_side: int, max_side: int, seed: int = 0) -> None:
    """``count`` JPEGs in root/class<k>/ (10 classes), each a smooth random gradient with noise, of varied sizes.

    Only ``POOL`` of them are drawn; the others are hard links to those. What is measured is the loader's memory
    against the number of samples it indexes and streams, and the shards store each file's bytes on their own,
    so pixels that repeat change nothing there, while drawing 200,000 distinct images would take hours."""
    import numpy as np
    from PIL import Image

    if (root / ".complete").is_file() and int((root / ".complete").read_text()) == count:
        return
    rng = np.random.default_rng(seed)
    sizes = random.Random(seed)
    for k in range(10):
        (root / f"class{k}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = root / f"class{i % 10}" / f"{i:07d}.jpg"
        if i >= POOL:
            if not path.exists():
                os.link(root / f"class{i % 10}" / f"{i % POOL:07d}.jpg", path)
            continue
        width, height = sizes.randint(min_side, max_side), sizes.randint(min_side, max_side)
        base = rng.integers(0, 255, size=(2, 2, 3)).astype(np.uint8)
        image = Image.fromarray(base).resize((width, height), Image.BILINEAR)
        noise = rng.integers(-12, 12, size=(height, width, 3))
        pixels = np.clip(np.asarray(image, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path, quality=85)
    (root / ".complete").write_text(str(count))


def tree_rss_mb(pid: int) -> float:
    """Proportional resident memory (PSS: a page shared by the forked workers counted once in all) of ``pid`` and
    its children (Linux /proc), in MB; plain RSS where the kernel has no smaps_rollup."""
    total, seen = 0, set()
    stack = [pid]
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup")
            lines = rollup.read_text().splitlines() if rollup.exists() else Path(f"/proc/{p}/status").read_text().splitlines()
            for line in lines:
                if line.startswith(("Pss:", "VmRSS:")):
                    total += int(line.split()[1])
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        stack += [int(c) for c in children]
    return total / 1024


def child(args) -> None:
    """One measurement in a fresh process: stream ``--batches`` batches, print a JSON line."""
    import torch

    from speedkit.data.streaming import StreamingImageLoader, StreamingTokenLoader

    torch.set_num_threads(1)
    if args.kind == "images":
        loader = StreamingImageLoader(args.shards, args.batch_size, image_size=args.image_size,
                                      num_workers=args.child_workers)
        model = None
        if args.step:
            from speedkit.models import get_model

            model = get_model("resnet8", num_classes=10, in_channels=3, width=8)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        loader = StreamingTokenLoader(args.shards, args.seq_len, args.batch_size, num_workers=args.child_workers)
        model = None
    rss, waited, count, units = [], 0.0, 0, 0
    iterator = iter(loader)
    start = time.perf_counter()
    while count < args.batches:
        before = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            continue
        waited += time.perf_counter() - before
        if model is not None:
            loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        units += batch[0].numel() if args.kind == "tokens" else len(batch[0])
        count += 1
        rss.append(tree_rss_mb(os.getpid()))
    seconds = time.perf_counter() - start
    workers = max(1, args.child_workers)
    rate = units / seconds
    print(json.dumps({"batches": count, "seconds": round(seconds, 3), "rss_mb": round(max(rss), 1),
                      "rss_mb_last": round(rss[-1], 1), f"{args.kind}_per_s": round(rate, 1),
                      f"{args.kind}_per_s_per_worker": round(rate / workers, 1),
                      "data_wait_share": round(waited / seconds, 4) if model is not None else None}))


def measure(shards: Path, kind: str, workers: int, args) -> dict:
    command = [sys.executable, __file__, CHILD, "--kind", kind, "--shards", str(shards), "--child-workers",
               str(workers), "--batches", str(args.batches), "--batch-size", str(args.batch_size), "--image-size",
               str(args.image_size), "--seq-len", str(args.seq_len)] + (["--step"] if args.step else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-side", type=int, default=96)
    parser.add_argument("--max-side", type=int, default=512)
    parser.add_argument("--short-side", type=int, default=160)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--step", action="store_true", help="train a small ResNet on each batch; report data wait")
    parser.add_argument("--text", help="a folder of text files to prepare as token shards and stream")
    parser.add_argument("--prepare-workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--dir", help="where folders and shards are kept (default: a temporary directory)")
    parser.add_argument("--out", help="write the results here as JSON")
    # the child's own arguments
    parser.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="images", help=argparse.SUPPRESS)
    parser.add_argument("--shards", help=argparse.SUPPRESS)
    parser.add_argument("--child-workers", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    from speedkit.data.streaming.prepare import prepare_images, prepare_text

    temporary = None if args.dir else tempfile.TemporaryDirectory(prefix="speedkit-streaming-")
    base = Path(args.dir or temporary.name)
    results = {"config": {k: v for k, v in vars(args).items() if not k.startswith("child") and k not in
                          ("kind", "shards", "out", "dir")}, "images": [], "tokens": []}
    try:
        for count in args.images:
            folder, shards = base / f"images-{count}", base / f"shards-{count}"
            started = time.perf_counter()
            write_images(folder, count, args.min_side, args.max_side)
            written = time.perf_counter() - started
            started = time.perf_counter()
            prepare_images(folder, shards, short_side=args.short_side, val_fraction=0.0,
                           workers=args.prepare_workers, progress=sys.stderr.isatty())
            prepared = time.perf_counter() - started
            for workers in args.workers:
                row = {"images": count, "workers": workers, "write_s": round(written, 1),
                       "prepare_s": round(prepared, 1), **measure(shards, "images", workers, args)}
                print(json.dumps(row), flush=True)
                results["images"].append(row)
        if args.text:
            shards = base / "text-shards"
            prepare_text(args.text, shards, block=1024, workers=args.prepare_workers, progress=sys.stderr.isatty())
            for workers in args.workers:
                row = {"workers": workers, **measure(shards, "tokens", workers, args)}
                print(json.dumps(row), flush=True)
                results["tokens"].append(row)
    finally:
        if temporary is not None:
            temporary.cleanup()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
