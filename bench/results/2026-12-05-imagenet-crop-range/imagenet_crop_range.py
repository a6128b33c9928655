"""`speedkit bench` with the imagenet task's cpu rehearsal cropping training images over another range: the share of
an image each random-resized crop may take (the cpu sizes' own is 0.35-1; the published ResNet-50 pipeline's,
which the gpu sizes take, 0.08-1). It measures what the range does at the rehearsal's 64-80 px:

    python bench/results/2026-12-05-imagenet-crop-range/imagenet_crop_range.py 0.08 --task imagenet --sizes cpu --data SHARDS ...

Every argument after the smallest share is speedkit bench's own.
"""
import dataclasses
import sys

from speedkit.cli.main import main
from speedkit.tasks.builtin import imagenet

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        smallest = float(sys.argv[1])
    except ValueError:
        sys.exit(f"the first argument is the smallest share of an image a crop may take, got {sys.argv[1]!r}\n{__doc__}")
    if not 0 < smallest <= 1:
        sys.exit(f"the smallest share must be in (0, 1], got {smallest}\n{__doc__}")
    imagenet.SIZES["cpu"] = dataclasses.replace(imagenet.SIZES["cpu"], crop_scale=(smallest, 1.0))
    sys.exit(main(["bench", *sys.argv[2:]]))
