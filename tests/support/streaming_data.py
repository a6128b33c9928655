"""Small generated data for the streaming tests: image folders (JPEG and PNG of varied sizes) and text folders."""
from __future__ import annotations

import random
from pathlib import Path

CLASSES, PER_CLASS = 3, 14


def make_image_folder(root: Path, per_class: int = PER_CLASS, seed: int = 0) -> Path:
    """Class folders of JPEG and PNG images of varied sizes (and a hidden folder that must be ignored)."""
    from PIL import Image

    rng = random.Random(seed)
    for c in range(CLASSES):
        folder = root / f"class{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            width, height = rng.randint(12, 96), rng.randint(12, 96)
            image = Image.new("RGB", (width, height), (80 * c, rng.randint(0, 255), 40))
            image.save(folder / f"im{i}.{'png' if i % 4 == 0 else 'jpg'}")
    hidden = root / ".thumbnails" / "x"
    hidden.mkdir(parents=True)
    Image.new("RGB", (20, 20)).save(hidden / "t.jpg")
    return root


def make_text_folder(root: Path, files: int = 6) -> Path:
    rng = random.Random(1)
    words = ["stream", "shard", "token", "epoch", "batch", "resume", "rank", "worker", "image", "the", "a", "of"]
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(900)) + "\n")
    return root
