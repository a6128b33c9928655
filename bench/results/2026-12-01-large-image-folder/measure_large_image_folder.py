"""An image folder of 100,000 files trained from under a low open-files limit, through the CLI as a user runs it.

Writes Fashion-MNIST as PNG files into DIR/<class>/ (the 60,000 training images, then mirrored copies up to
``--images``), then runs ``speedkit train --task image-folder --data DIR`` in a child process whose open-files limit
is ``--nofile`` (256 by default, below the 1,024 many desktops have), and reports what it took. The folder task
decodes one file at a time, so the limit is never approached; a task that opened every image first would fail
with "Too many open files" at image 256.

    .venv/bin/python bench/results/2026-12-01-large-image-folder/measure_large_image_folder.py --out bench/results/2026-12-01-large-image-folder/large_image_folder.json

The folder (about 400 MB on disk for 100,000 images) is written into a temporary directory unless ``--dir`` is
given, and removed afterwards unless ``--keep``.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from speedkit.data.fashion_mnist import load_fashion_mnist

CLASSES = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")


def write_folder(root: Path, images: int) -> float:
    """``images`` PNG files under root/<class>/; returns the seconds it took."""
    started = time.perf_counter()
    arrays = load_fashion_mnist()
    pixels, labels = arrays.train_x.numpy(), arrays.train_y.numpy()
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(images):
        index = i % len(labels)
        image = pixels[index] if i < len(labels) else pixels[index][:, ::-1]  # past 60,000: mirrored copies
        Image.fromarray(image.copy(), mode="L").save(root / CLASSES[labels[index]] / f"{i:06d}.png")
    return time.perf_counter() - started


def limited(nofile: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    return apply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--nofile", type=int, default=256, help="the child's open-files limit (ulimit -n)")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--dir", help="write the folder here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="speedkit-images-"))
    try:
        write_s = write_folder(root / "images", args.images)
        command = [sys.executable, "-m", "speedkit", "train", "--task", "image-folder", "--data", str(root / "images"),
                   "--image-size", str(args.image_size), "--recipe", "baseline", "--duration", "20ba",
                   "--eval-fraction", "0.02", "--device", "cpu", "--run-dir", str(root / "runs"), "--run-name", "big",
                   "--save-interval", "none", "--no-progress"]
        started = time.perf_counter()
        child = subprocess.run(command, capture_output=True, text=True, preexec_fn=limited(args.nofile))
        train_s = time.perf_counter() - started
        record = json.loads((root / "runs" / "big" / "record.json").read_text()) if child.returncode == 0 else {}
        figures = {"images": args.images, "nofile": args.nofile, "image_size": args.image_size,
                   "write_s": round(write_s, 1), "command_s": round(train_s, 1), "returncode": child.returncode,
                   "status": record.get("status"), "setup_s": record.get("timings", {}).get("setup_s"),
                   "stderr_tail": child.stderr[-1500:] if child.returncode else ""}
        print(json.dumps(figures, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
        if child.returncode:
            sys.exit(child.returncode)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
