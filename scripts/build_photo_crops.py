"""Build the photo-crops rehearsal set from Debian packages' photographs: an ImageNet-layout JPEG folder of
real photographs at varied sizes (96-512 px on each side, varied aspect ratios), large enough (50,000 training
images by default) that it is streamed from shards rather than held in memory, for rehearsing the `imagenet`
task's CPU profile on data no preset was tuned on. Fashion-MNIST and the font glyphs are small, grey and
centred; this set is colour photographs of scenes, as a user's folder is.

Each class is one photograph from the desktop-wallpaper packages below (photographs only: drawn, rendered and
abstract wallpapers are left out, as they are told apart by one colour). Each sample is a random crop of it
(random position, scale and aspect), resized to a random size, with a small random colour jitter (and a share
in greyscale), saved as JPEG. A strip along each photograph's long side is held out: validation crops come only
from it and training crops never touch it, so validation measures recognising a scene from parts of it never
seen, not memorised pixels.

    apt-get install mate-backgrounds plasma-workspace-wallpapers lomiri-wallpapers-16.04 \\
        lomiri-wallpapers-20.04 lxqt-themes palapeli-data sddm-theme-maldives
    python scripts/build_photo_crops.py --out data/photo-crops --images 50000
    speedkit data prepare data/photo-crops --out data/photo-crops-shards --short-side 96

The output is the same for the same photographs, arguments and seed. The data goes under data/ (ignored by
git); the command above is what is committed. Photographs that are not installed are left out and named.
"""
from __future__ import annotations

import argparse
import math
import random
import re
import shutil
import sys
import time
import zlib
from multiprocessing import Pool
from pathlib import Path

# The photographs, by package. A folder under /usr/share/wallpapers is a Plasma wallpaper package: its largest
# image is used. Chosen by eye from everything these packages install: photographs of scenes and things.
PHOTOS = {
    "mate-backgrounds": [f"/usr/share/backgrounds/mate/nature/{name}.jpg" for name in (
        "Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird", "RainDrops", "Storm",
        "TwoWings", "Wood", "YellowFlower")],
    "plasma-workspace-wallpapers": [f"/usr/share/wallpapers/{name}" for name in (
        "BytheWater", "ColdRipple", "ColorfulCups", "DarkestHour", "EveningGlow", "FallenLeaf", "Grey", "Kite",
        "OneStandsOut", "Path", "summer_1am")],
    "lomiri-wallpapers-16.04": [f"/usr/share/backgrounds/{name}.jpg" for name in (
        "Bridge_by_Sander_Klootwijk", "Dragonfly_by_Bolly", "Picture_0B_by_freespace", "Picture_1A_by_freespace",
        "Wine_by_Jakkub_Mede", "aitzgorri_by_Aitzol_Berasategi", "analogpattern_by_Peter_Nerlich",
        "free_by_Peter_Nerlich", "friends_by_Aitzol_Berasategi", "greentock_by_Peter_Nerlich",
        "life_by_Aitzol_Berasategi", "picosdeeuropa_by_Aitzol_Berasategi", "seeding_by_Clements_Engelhardt",
        "sunset_by_Aitzol_Berasategi")],
    "lomiri-wallpapers-20.04": ["/usr/share/backgrounds/Infinite-Sea_by_Aury88.jpg",
                                "/usr/share/backgrounds/Kleiber_by_Lukas_Baubkus.jpg"],
    "lxqt-themes": [f"/usr/share/lxqt/wallpapers/{name}" for name in (
        "Butterfly-Kenneth-Wimer.jpg", "Valendas.png", "after-the-rain.jpg", "appleflower.png", "beam.png",
        "butterfly.png", "cloud.png", "drop.png", "flowers.png", "fog.jpg", "this-is-not-windows.jpg")],
    "palapeli-data": [f"/usr/share/palapeli/collection/{name}.jpg" for name in (
        "castle-maintenon", "cincinnati-bridge", "citrus-fruits", "european-honey-bee", "panther-chameleon-female")],
    "sddm-theme-maldives": ["/usr/share/sddm/themes/maldives/background.jpg"],
}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
MIN_SIDE, MAX_SIDE = 96, 512  # each saved image's width and height
WORKING_SIDE = 1600  # photographs are reduced to this long side once: crops of up to 512 px need no more
VAL_SHARE = 0.25  # of each photograph's long side, held out for validation


def photo_file(path: Path) -> Path | None:
    """The image file for an entry of PHOTOS: the file itself, or a Plasma package's largest image."""
    if path.is_dir():
        images = [p for p in (path / "contents" / "images").glob("*") if p.suffix.lower() in IMAGE_SUFFIXES]
        return max(images, key=lambda p: (p.stat().st_size, p.name)) if images else None
    return path if path.is_file() else None


def class_name(path: Path) -> str:
    """A folder name: the photograph's (or Plasma package's) name, lower case, without its author; a theme's
    ``background.jpg`` is named after its theme's folder."""
    name = path.name if path.is_dir() else path.parent.name if path.stem == "background" else path.stem
    name = re.sub(r"_by_.*$", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def installed_photos(photos: dict[str, list[str]] = PHOTOS) -> tuple[dict[str, Path], list[str]]:
    """({class: image file}, [entries not installed])."""
    found: dict[str, Path] = {}
    missing = []
    for entries in photos.values():
        for entry in entries:
            file = photo_file(Path(entry))
            if file is None:
                missing.append(entry)
                continue
            name = class_name(Path(entry))
            if name in found:
                name = f"{name}-{len(found)}"
            found[name] = file
    return found, missing


def split_regions(width: int, height: int, rng: random.Random, val_share: float = VAL_SHARE):
    """(train box, val box), each (left, top, right, bottom): a strip of ``val_share`` of the long side, at its
    start or its end (seeded), held out for validation; training gets the rest. The boxes touch, never overlap."""
    if width <= 1 or height <= 1:
        raise ValueError(f"a photograph of {width}x{height} px is too small to split")
    horizontal = width >= height
    long_side = width if horizontal else height
    cut = max(1, min(long_side - 1, round(long_side * val_share)))
    at_start = rng.random() < 0.5
    if horizontal:
        val = (0, 0, cut, height) if at_start else (width - cut, 0, width, height)
        train = (cut, 0, width, height) if at_start else (0, 0, width - cut, height)
    else:
        val = (0, 0, width, cut) if at_start else (0, height - cut, width, height)
        train = (0, cut, width, height) if at_start else (0, 0, width, height - cut)
    return train, val


def sample_crop(box, rng: random.Random, min_scale: float = 0.2, max_aspect: float = 2.0):
    """A crop (left, top, right, bottom) inside ``box``: random position, area (``min_scale`` to all of the
    largest square that fits, as a share) and aspect (1/``max_aspect`` to ``max_aspect``, width to height),
    shrunk to fit where the aspect does not."""
    left, top, right, bottom = box
    bw, bh = right - left, bottom - top
    side = min(bw, bh) * math.sqrt(rng.uniform(min_scale, 1.0))
    aspect = math.exp(rng.uniform(-math.log(max_aspect), math.log(max_aspect)))
    cw, ch = side * math.sqrt(aspect), side / math.sqrt(aspect)
    shrink = min(1.0, bw / cw, bh / ch)
    cw, ch = max(1, int(cw * shrink)), max(1, int(ch * shrink))
    x = left + rng.randint(0, bw - cw)
    y = top + rng.randint(0, bh - ch)
    return x, y, x + cw, y + ch


def output_size(crop_width: int, crop_height: int, rng: random.Random) -> tuple[int, int]:
    """A random saved size, each side in MIN_SIDE..MAX_SIDE, keeping the crop's aspect as far as that allows."""
    aspect = crop_width / crop_height
    long_side = rng.randint(MIN_SIDE, MAX_SIDE)
    if aspect >= 1:
        width, height = long_side, round(long_side / aspect)
    else:
        width, height = round(long_side * aspect), long_side
    clamp = lambda v: max(MIN_SIDE, min(MAX_SIDE, v))  # noqa: E731
    return clamp(width), clamp(height)


def jitter(image, rng: random.Random, strength: float, grey_share: float):
    """Brightness, contrast and saturation each scaled by 1 +- ``strength``; a ``grey_share`` of images grey
    (stored as RGB, as a user's folder mixes them)."""
    from PIL import ImageEnhance

    for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhancer(image).enhance(rng.uniform(1 - strength, 1 + strength))
    if rng.random() < grey_share:
        image = image.convert("L").convert("RGB")
    return image


def load_photo(file: Path):
    """The photograph in RGB, its long side reduced to WORKING_SIDE (transparency flattened on grey)."""
    from PIL import Image

    with Image.open(file) as opened:
        opened.draft("RGB", (WORKING_SIDE, WORKING_SIDE))  # JPEG: decode at a reduced scale, faster
        image = opened.convert("RGBA") if opened.mode in ("RGBA", "LA", "P") else opened.convert("RGB")
    if image.mode == "RGBA":
        flat = Image.new("RGB", image.size, (128, 128, 128))
        flat.paste(image, mask=image.getchannel("A"))
        image = flat
    scale = WORKING_SIDE / max(image.size)
    if scale < 1:
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.LANCZOS)
    return image


def build_class(job) -> tuple[str, int, int]:
    """Writes one class's training and validation crops; returns (class, train count, val count)."""
    name, file, out, counts, seed, strength, grey_share, quality = job
    from PIL import Image

    photo = load_photo(Path(file))
    strip_rng = random.Random(zlib.crc32(f"{seed}/{name}".encode()))
    regions = dict(zip(("train", "val"), split_regions(*photo.size, strip_rng)))
    for split, count in counts.items():
        folder = Path(out) / split / name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            rng = random.Random(zlib.crc32(f"{seed}/{name}/{split}/{index}".encode()))
            crop = sample_crop(regions[split], rng)
            size = output_size(crop[2] - crop[0], crop[3] - crop[1], rng)
            image = photo.resize(size, Image.BICUBIC, box=crop, reducing_gap=2.0)
            jitter(image, rng, strength, grey_share).save(folder / f"{name}_{index:05d}.jpg", quality=quality)
    return name, counts["train"], counts["val"]


def per_class(total: int, classes: list[str]) -> dict[str, int]:
    """``total`` spread over the classes as evenly as it divides (the first ones get the remainder)."""
    base, extra = divmod(total, len(classes))
    return {name: base + (i < extra) for i, name in enumerate(classes)}


def build(out: Path, photos: dict[str, Path], images: int, val_images: int, seed: int = 0, strength: float = 0.3,
          grey_share: float = 0.1, quality: int = 90, processes: int = 2, progress: bool = True) -> dict:
    classes = sorted(photos)
    train, val = per_class(images, classes), per_class(val_images, classes)
    jobs = [(name, str(photos[name]), str(out), {"train": train[name], "val": val[name]}, seed, strength,
             grey_share, quality) for name in classes]
    done = {"train": 0, "val": 0}
    start = time.monotonic()
    pool = Pool(processes) if processes > 1 else None  # 1: in this process (a test, a debugger)
    try:
        results = pool.imap_unordered(build_class, jobs) if pool else map(build_class, jobs)
        for finished, (name, n_train, n_val) in enumerate(results, 1):
            done["train"] += n_train
            done["val"] += n_val
            if progress:
                print(f"\r{finished}/{len(classes)} classes, {done['train'] + done['val']:,} images "
                      f"({time.monotonic() - start:.0f} s)", end="", file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
    if progress:
        print(file=sys.stderr)
    return {"classes": classes, "images": done}


def mean_colour_accuracy(out: Path, per_class_train: int = 100) -> float:
    """The validation accuracy of a nearest-mean-colour classifier (each image's mean RGB against each class's
    mean over up to ``per_class_train`` training images): high means one colour statistic tells the classes
    apart, and the set does not test recognising a scene."""
    import numpy as np
    from PIL import Image

    def mean_rgb(path: Path):
        with Image.open(path) as image:
            image.draft("RGB", (64, 64))
            return np.asarray(image.convert("RGB"), dtype=np.float32).reshape(-1, 3).mean(0)

    classes = sorted(p.name for p in (out / "train").iterdir())
    centres = np.stack([np.mean([mean_rgb(p) for p in sorted((out / "train" / c).glob("*.jpg"))[:per_class_train]],
                                axis=0) for c in classes])
    hits = total = 0
    for label, name in enumerate(classes):
        for path in sorted((out / "val" / name).glob("*.jpg")):
            hits += int(np.argmin(((centres - mean_rgb(path)) ** 2).sum(1)) == label)
            total += 1
    return hits / total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="the folder to write train/ and val/ into (emptied)")
    parser.add_argument("--images", type=int, default=50_000, help="training images in all (default 50000)")
    parser.add_argument("--val-images", type=int, default=None,
                        help="validation images in all (default: a tenth of --images)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the strips, crops, sizes and jitter")
    parser.add_argument("--jitter", type=float, default=0.3,
                        help="brightness, contrast and saturation each scaled by 1 +- this (default 0.3)")
    parser.add_argument("--grey-share", type=float, default=0.1, help="share of images made grey (default 0.1)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    parser.add_argument("--processes", type=int, default=2, help="processes writing classes (default 2)")
    parser.add_argument("--check", action="store_true",
                        help="then print a nearest-mean-colour classifier's validation accuracy (should be low)")
    args = parser.parse_args(argv)
    if args.images < 1 or (args.val_images is not None and args.val_images < 1):
        parser.error("--images and --val-images must be at least 1")
    if not 0 <= args.jitter < 1 or not 0 <= args.grey_share <= 1:
        parser.error("--jitter must be in [0, 1) and --grey-share in [0, 1]")
    photos, missing = installed_photos()
    if missing:
        print(f"not installed, left out ({len(missing)}): {', '.join(missing)}", file=sys.stderr)
    if len(photos) < 2:
        raise SystemExit(f"{len(photos)} of the photographs are installed; install the packages named in this "
                         f"script's docstring (apt-get install ...)")
    if args.out.exists():
        shutil.rmtree(args.out)
    val_images = args.val_images if args.val_images is not None else max(len(photos), args.images // 10)
    built = build(args.out, photos, args.images, val_images, args.seed, args.jitter, args.grey_share, args.quality,
                  args.processes)
    print(f"{args.out}: {len(built['classes'])} classes, {built['images']['train']} training and "
          f"{built['images']['val']} validation images")
    if args.check:
        print(f"nearest-mean-colour validation accuracy: {mean_colour_accuracy(args.out):.3f} "
              f"(chance {1 / len(built['classes']):.3f})")


if __name__ == "__main__":
    main()
