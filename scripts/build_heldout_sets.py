"""Build the held-out data sets from Debian packages: data that no preset, default or search was tuned on, so
that what speedkit's ladders and `speedkit tune` reach there says how they carry over to a user's own data.

- ``glyphs``: an image folder of the 62 letters and digits (0-9, A-Z, a-z) rendered from the fonts installed
  under /usr/share/fonts, 32x32 grey, each glyph drawn a few times at a random size, offset and slant. Whole
  font families are held out for validation, so validation comes from typefaces training never saw. A flip
  changes a letter, so train it with ``--no-flips``. Classes that look alike (o/O/0, l/I/1, s/S, ...) cap
  the accuracy below 100%. It is built from the 20 families the packages below install (``MEASURED_FAMILIES``),
  whatever else is installed; ``--any-fonts`` builds from every family there.
- ``perldoc``: a text folder of Perl's documentation (the perl-doc package's .pod files, as .txt).
- ``objects``: an ImageNet-layout JPEG folder of 9 kinds of things (mammals, birds, fish, fruit, vegetables,
  flowers, tools, musical instruments, vehicles) from the photographs among tuxpaint-stamps-default's stamps
  (cut-out photographs of about 200 px; its drawn stamps are left out). Each image is one stamp, scaled, turned a
  little and placed on a random smooth background, saved at 96-512 px a side with a colour jitter. A quarter of
  each kind's stamps is held out whole for validation, so validation asks for the kind of a thing never seen, as
  ImageNet's does, not for a known picture (photo-crops' classes are one photograph each).
- ``clipart``: the same, from openclipart-png's drawings, of 10 kinds (mammals, birds, insects, fruit, desserts,
  drinks, tools, music, vehicles, plants; 798 drawings). A quarter of each kind's designs is held out whole: a
  drawing's colour and black-and-white prints and its numbered variants are one design (``clipart_design``).

    sudo apt-get install fonts-dejavu-core fonts-dejavu-extra fonts-liberation fonts-freefont-ttf \\
        fonts-urw-base35 perl-doc tuxpaint-stamps-default openclipart-png
    python scripts/build_heldout_sets.py glyphs --out data/heldout/glyphs
    python scripts/build_heldout_sets.py perldoc --out data/heldout/perldoc
    python scripts/build_heldout_sets.py objects --out data/heldout/objects --images 50000
    python scripts/build_heldout_sets.py clipart --out data/heldout/clipart --images 50000

The output is the same for the same fonts (pictures) and seed. The data goes under data/ (ignored by git); the command
above is what is committed.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import re
import shutil
import string
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_photo_crops import jitter, per_class  # noqa: E402  (the cut-out sets are built as photo-crops is)

CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase
FONT_SUFFIXES = (".ttf", ".otf", ".t1", ".pfb")  # a font in several of these formats is kept in the first
# Fonts that draw other symbols at the letters' code points (Greek, dingbats, math extensions): wrong labels.
SYMBOL_FONTS = ("symbol", "dingbat", "d050000l", "cmex", "cmsy")
# Families that copy one design (free clones of Helvetica, Times and Courier) go to the same side of the split,
# so that validation never shows a typeface that training saw under another name.
SAME_DESIGN = (("FreeSans", "Nimbus Sans", "Nimbus Sans Narrow", "Liberation Sans", "Liberation Sans Narrow"),
               ("FreeSerif", "Nimbus Roman", "Liberation Serif"),
               ("FreeMono", "Nimbus Mono PS", "Liberation Mono"))

# The font families of the glyphs set every committed study measured (11,532 training and 3,906 validation images),
# as fontconfig names them with the packages above installed. By default the set is built from these alone, so that
# other fonts on a machine do not change it; one missing would make another set, and is refused.
MEASURED_FAMILIES = ("C059", "DejaVu Math TeX Gyre", "DejaVu Sans", "DejaVu Sans Mono", "DejaVu Serif", "FreeMono",
                     "FreeSans", "FreeSerif", "Liberation Mono", "Liberation Sans", "Liberation Sans Narrow",
                     "Liberation Serif", "Nimbus Mono PS", "Nimbus Roman", "Nimbus Sans", "Nimbus Sans Narrow", "P052",
                     "URW Bookman", "URW Gothic", "Z003")
FONT_PACKAGES = "fonts-dejavu-core fonts-dejavu-extra fonts-liberation fonts-freefont-ttf fonts-urw-base35"


def class_name(character: str) -> str:
    """A folder name per character that stays distinct on case-insensitive file systems (A and a)."""
    kind = "digit" if character.isdigit() else "upper" if character.isupper() else "lower"
    return f"{kind}_{character}"


def installed_fonts(root: Path = Path("/usr/share/fonts")) -> dict[str, list[Path]]:
    """Font files by family (fontconfig's first family name, else the file's stem before any '-')."""
    by_stem: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in FONT_SUFFIXES):
        if any(word in path.stem.lower() for word in SYMBOL_FONTS):
            continue
        kept = by_stem.get(path.stem)
        if kept is None or FONT_SUFFIXES.index(path.suffix.lower()) < FONT_SUFFIXES.index(kept.suffix.lower()):
            by_stem[path.stem] = path
    listed = _fc_list()
    families: dict[str, list[Path]] = {}
    for path in sorted(by_stem.values()):
        family = listed.get(str(path)) or path.stem.split("-")[0]
        families.setdefault(family, []).append(path)
    return families


def _fc_list() -> dict[str, str]:
    try:
        out = subprocess.run(["fc-list", "--format", "%{file}\t%{family[0]}\n"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def measured_fonts(fonts: dict[str, list[Path]], root: Path) -> dict[str, list[Path]]:
    """``fonts`` narrowed to ``MEASURED_FAMILIES``; refused, naming what is missing and the fix, where one of them
    is not installed: the set built would be another than the one the committed studies measured."""
    missing = [family for family in MEASURED_FAMILIES if family not in fonts]
    if missing:
        raise SystemExit(f"{root} lacks {len(missing)} of the font families the committed glyphs set was built from "
                         f"({', '.join(missing)}), so this would build another set, whose results do not compare with "
                         f"bench/results: apt-get install {FONT_PACKAGES}, or pass --any-fonts to build from the fonts "
                         f"installed here")
    return {family: fonts[family] for family in MEASURED_FAMILIES}


def split_families(families: list[str], val_share: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, val) families: a seeded ``val_share`` of the designs (a family, or the clones of one design in
    SAME_DESIGN) held out whole, at least one."""
    designs: dict[str, list[str]] = {}
    for family in sorted(families):
        group = next((g for g in SAME_DESIGN if family in g), (family,))
        designs.setdefault(group[0], []).append(family)
    ordered = sorted(designs)
    random.Random(seed).shuffle(ordered)
    n_val = max(1, round(len(ordered) * val_share))
    val = [f for design in ordered[:n_val] for f in designs[design]]
    return sorted(f for f in families if f not in val), sorted(val)


def render(font_path: Path, character: str, rng: random.Random, size: int = 32):
    """One glyph, white on black, ``size`` square, at a random size, offset and slant; None where the font has
    no such glyph (nothing drawn, or the font's placeholder box)."""
    from PIL import Image, ImageDraw, ImageFont

    points = rng.randint(int(size * 0.55), int(size * 0.85))
    try:
        font = ImageFont.truetype(str(font_path), points)
    except OSError:
        return None
    if _is_placeholder(font, character):
        return None
    canvas = Image.new("L", (size * 2, size * 2), 0)
    draw = ImageDraw.Draw(canvas)
    left, top, right, bottom = draw.textbbox((0, 0), character, font=font)
    if right - left < 1 or bottom - top < 1:
        return None
    x = size - (left + right) / 2 + rng.uniform(-size * 0.08, size * 0.08)
    y = size - (top + bottom) / 2 + rng.uniform(-size * 0.08, size * 0.08)
    draw.text((x, y), character, fill=255, font=font)
    canvas = canvas.rotate(rng.uniform(-10, 10), resample=Image.BILINEAR, center=(size, size))
    glyph = canvas.crop((size // 2, size // 2, size // 2 + size, size // 2 + size))
    return glyph if glyph.getbbox() is not None else None


def _is_placeholder(font, character: str) -> bool:
    """Whether the font draws ``character`` as its missing-glyph box (the same mask as an unassigned code point)."""
    missing = font.getmask("\uffff")
    drawn = font.getmask(character)
    return drawn.size == missing.size and bytes(drawn) == bytes(missing)


def build_glyphs(out: Path, fonts: dict[str, list[Path]], variants: int, val_share: float, seed: int) -> dict:
    train_families, val_families = split_families(list(fonts), val_share, seed)
    counts = {"train": 0, "val": 0}
    for split, families in (("train", train_families), ("val", val_families)):
        for character in CHARACTERS:
            (out / split / class_name(character)).mkdir(parents=True, exist_ok=True)
        for family in families:
            for font_path in fonts[family]:
                for character in CHARACTERS:
                    rng = random.Random(zlib.crc32(f"{seed}/{font_path.name}/{character}".encode()))
                    for variant in range(variants):
                        glyph = render(font_path, character, rng)
                        if glyph is None:
                            break  # the font lacks it: no variants of it either
                        glyph.save(out / split / class_name(character) / f"{font_path.stem}_{variant}.png")
                        counts[split] += 1
    return {"images": counts, "train_families": train_families, "val_families": val_families}


def build_perldoc(out: Path, pods: Path) -> int:
    files = sorted(pods.glob("*.pod"))
    if not files:
        raise SystemExit(f"no .pod files in {pods}: install the perl-doc package (apt-get install perl-doc)")
    out.mkdir(parents=True, exist_ok=True)
    for pod in files:
        shutil.copyfile(pod, out / f"{pod.stem}.txt")
    return len(files)


@dataclasses.dataclass(frozen=True)
class Cutouts:
    """A package's cut-out pictures (transparent around the thing), sorted into kinds by the folders they are in."""
    package: str
    root: Path
    kinds: dict[str, tuple[str, ...]]  # a kind: the folders (under ``root``) its pictures are in, sub-folders too
    left_out: str  # a pattern of paths under ``root`` whose pictures are not of their folder's kind
    # the pictures of one design share a key and go to the same side of the split (as fonts' SAME_DESIGN do)
    design: Callable[[str], str] = str
    largest_side: int | None = None  # pictures larger than this are shrunk on loading: no image needs more
    trim: bool = False  # cut each picture to its opaque part: a thing drawn small in a wide frame would be tiny


def clipart_design(path: str) -> str:
    """A drawing's colour and black-and-white prints and its numbered variants (cone1_bw_ganson, cone2_ganson)
    are one design."""
    words = (re.sub(r"\d+", "", word) for word in re.split(r"[_\-. ]+", Path(path).stem.lower()) if word != "bw")
    return "_".join(word for word in words if word)


# tuxpaint's photographed stamps; its drawn ones sit in cartoon/ and toys/ folders.
OBJECTS = Cutouts("tuxpaint-stamps-default", Path("/usr/share/tuxpaint/stamps"),
                  {"mammals": ("animals/mammals",), "birds": ("animals/birds",), "fish": ("animals/fish",),
                   "fruit": ("food/fruit",), "vegetables": ("food/vegetables",), "flowers": ("plants/flowers",),
                   "tools": ("household/tools",), "instruments": ("hobbies/music",),
                   "vehicles": ("vehicles", "military/vehicles")},
                  left_out=r"(^|/)(cartoon|toys)/")
# Open Clip Art's drawings, of 10 kinds (five of them the objects set's, drawn instead of photographed); its toys
# are not tools, a few posters are drawn 16,000 px wide, and a tenth of the drawings fill under a quarter of their
# frame. (tuxpaint's stamps are cut close: the objects set is built, and was measured, untrimmed.)
CLIPART = Cutouts("openclipart-png", Path("/usr/share/openclipart/png"),
                  {"mammals": ("animals/mammals",), "birds": ("animals/birds",), "insects": ("animals/bugs",),
                   "fruit": ("food/fruit",), "desserts": ("food/desserts",), "drinks": ("food/beverages",),
                   "tools": ("tools",), "music": ("recreation/music",), "vehicles": ("transportation/vehicles",),
                   "plants": ("plants",)},
                  left_out=r"^tools/toys/", design=clipart_design, largest_side=1024, trim=True)
OBJECT_SIDES = (96, 512)  # each saved image's width and height


def cutout_pictures(source: Cutouts) -> dict[str, list[Path]]:
    """{kind: its pictures}, each kind's in a stable order; a picture filed under two kinds (an apple-juice box
    under fruit and drinks) is left out of both, its label being either."""
    root = source.root
    found = {kind: {path for folder in folders for path in (root / folder).rglob("*.png")
                    if not re.search(source.left_out, path.relative_to(root).as_posix())}
             for kind, folders in source.kinds.items()}
    names = Counter(name for paths in found.values() for name in {path.name for path in paths})
    return {kind: sorted((p for p in paths if names[p.name] == 1), key=lambda p: p.relative_to(root).as_posix())
            for kind, paths in found.items()}


def background(width: int, height: int, rng: random.Random):
    """A smooth random field of two to three colours a side, softened towards grey, with a little grain: no
    colour or texture that goes with a kind."""
    import numpy as np
    from PIL import Image

    cells = rng.randint(2, 3)
    grid = Image.new("RGB", (cells, cells))
    grid.putdata([tuple(rng.randint(0, 255) for _ in range(3)) for _ in range(cells * cells)])
    field = Image.blend(grid.resize((width, height), Image.BILINEAR), Image.new("RGB", (width, height), (128,) * 3),
                        rng.uniform(0.2, 0.6))
    noise = np.random.default_rng(rng.getrandbits(32)).normal(128, rng.uniform(5, 25), (height, width, 1))
    grain = Image.fromarray(np.clip(noise, 0, 255).astype(np.uint8).repeat(3, axis=2))  # seeded, unlike PIL's
    return Image.blend(field, grain, 0.1)


def compose(stamp, rng: random.Random):
    """One image: ``stamp`` (RGBA) scaled to 40-95% of a random canvas's short side, turned up to 20 degrees
    either way and placed at a random position on a ``background``; a colour jitter over all, a tenth grey."""
    from PIL import Image

    width, height = rng.randint(*OBJECT_SIDES), rng.randint(*OBJECT_SIDES)
    if max(width, height) > 2 * min(width, height):  # aspect 1:2 to 2:1
        width, height = (min(width, 2 * height), height) if width > height else (width, min(height, 2 * width))
    image = background(width, height, rng)
    thing = stamp.rotate(rng.uniform(-20, 20), resample=Image.BICUBIC, expand=True)
    scale = rng.uniform(0.4, 0.95) * min(width, height) / max(thing.size)
    thing = thing.resize((max(1, round(thing.width * scale)), max(1, round(thing.height * scale))), Image.LANCZOS)
    x, y = rng.randint(0, width - thing.width), rng.randint(0, height - thing.height)
    image.paste(thing, (x, y), thing.getchannel("A"))
    return jitter(image, rng, strength=0.3, grey_share=0.1)


def load_cutout(path: str, largest_side: int | None = None, trim: bool = False):
    """A picture as RGBA: cut to its opaque part with ``trim``, no larger than ``largest_side`` a side."""
    import warnings

    from PIL import Image

    with warnings.catch_warnings():  # a package's own posters, not a decompression bomb
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        picture = Image.open(path).convert("RGBA")
    if trim:
        picture = picture.crop(picture.getchannel("A").getbbox())
    if largest_side is not None:
        picture.thumbnail((largest_side, largest_side), Image.LANCZOS)
    return picture


def _write_kind(job) -> int:
    """Writes one kind's images of one split; returns how many."""
    kind, split, paths, count, seed, out, largest_side, trim = job
    folder = Path(out) / split / kind
    folder.mkdir(parents=True, exist_ok=True)
    pictures = [load_cutout(path, largest_side, trim) for path in paths]
    for index in range(count):
        rng = random.Random(zlib.crc32(f"{seed}/{kind}/{split}/{index}".encode()))
        compose(pictures[index % len(pictures)], rng).save(folder / f"{kind}_{index:05d}.jpg", quality=90)
    return count


def build_cutouts(out: Path, source: Cutouts, pictures: dict[str, list[Path]], images: int, val_images: int,
                  val_share: float, seed: int, processes: int = 2) -> dict:
    """Writes ``images`` training and ``val_images`` validation images, spread evenly over the kinds and, within
    a kind, over its pictures of that split; returns the counts and the held-out pictures."""
    from multiprocessing import Pool

    splits = {kind: held_out_whole(paths, source.design, val_share, seed) for kind, paths in pictures.items()}
    jobs = [(kind, split, splits[kind][split], count, seed, str(out), source.largest_side, source.trim)
            for split, total in (("train", images), ("val", val_images))
            for kind, count in per_class(total, sorted(splits)).items()]
    counts = {"train": 0, "val": 0}
    if processes > 1:
        with Pool(processes) as pool:
            written = pool.map(_write_kind, jobs)
    else:  # in this process (a test, a debugger)
        written = list(map(_write_kind, jobs))
    for job, count in zip(jobs, written):
        counts[job[1]] += count
    held_out = {kind: [Path(p).relative_to(source.root).as_posix() for p in s["val"]] for kind, s in splits.items()}
    return {"images": counts, "val_pictures": held_out}


def held_out_whole(paths: list[Path], design: Callable[[str], str], val_share: float, seed: int) -> dict:
    """{"train": paths, "val": paths}: a ``val_share`` of the designs held out whole, as a font family is."""
    by_design: dict[str, list[str]] = {}
    for path in map(str, paths):
        by_design.setdefault(design(path), []).append(path)
    train, val = split_families(list(by_design), val_share, seed)
    return {"train": sorted(p for key in train for p in by_design[key]),
            "val": sorted(p for key in val for p in by_design[key])}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    sets = parser.add_subparsers(dest="set", required=True)
    glyphs = sets.add_parser("glyphs", allow_abbrev=False, help="62-class letters and digits from the installed fonts")
    glyphs.add_argument("--out", type=Path, required=True, help="the folder to write train/ and val/ into (emptied)")
    glyphs.add_argument("--fonts", type=Path, default=Path("/usr/share/fonts"), help="where the fonts are")
    glyphs.add_argument("--variants", type=int, default=3, help="renderings of each glyph of each font (default 3)")
    glyphs.add_argument("--val-share", type=float, default=0.3, help="share of the designs held out (default 0.3)")
    glyphs.add_argument("--seed", type=int, default=0, help="seed of the family split and the renderings")
    glyphs.add_argument("--any-fonts", action="store_true",
                        help="build from every font family installed, not only those the committed set was built from")
    perldoc = sets.add_parser("perldoc", allow_abbrev=False, help="Perl's documentation as a text folder")
    perldoc.add_argument("--out", type=Path, required=True, help="the folder to copy the .txt files into")
    perldoc.add_argument("--pods", type=Path, default=Path("/usr/share/perl/5.36/pod"),
                         help="where perl-doc installed the .pod files")
    for name, source, about in (("objects", OBJECTS, "9 kinds of things from tuxpaint-stamps-default's photographs"),
                                ("clipart", CLIPART, "10 kinds of things from openclipart-png's drawings")):
        cutouts = sets.add_parser(name, allow_abbrev=False, help=f"{about}, as JPEGs")
        cutouts.add_argument("--out", type=Path, required=True,
                             help="the folder to write train/ and val/ into (emptied)")
        cutouts.add_argument("--pictures", type=Path, default=source.root,
                             help=f"where {source.package} is installed (default {source.root})")
        cutouts.add_argument("--images", type=int, default=50_000, help="training images in all (default 50000)")
        cutouts.add_argument("--val-images", type=int, default=None,
                             help="validation images in all (default: a tenth of --images)")
        cutouts.add_argument("--val-share", type=float, default=0.25,
                             help="share of each kind's pictures held out for validation (default 0.25)")
        cutouts.add_argument("--seed", type=int, default=0, help="seed of the split and the images")
        cutouts.add_argument("--processes", type=int, default=2, help="processes writing images (default 2)")
    args = parser.parse_args(argv)
    if args.set in ("objects", "clipart"):
        source = dataclasses.replace(OBJECTS if args.set == "objects" else CLIPART, root=args.pictures)
        pictures = cutout_pictures(source)
        few = [kind for kind, paths in pictures.items() if len({source.design(str(p)) for p in paths}) < 2]
        if few:
            raise SystemExit(f"{args.pictures}: kinds {few} have fewer than 2 designs to split; install "
                             f"{source.package} (apt-get install {source.package})")
        if args.out.exists():
            shutil.rmtree(args.out)
        val_images = args.val_images if args.val_images is not None else max(len(pictures), args.images // 10)
        built = build_cutouts(args.out, source, pictures, args.images, val_images, args.val_share, args.seed,
                              args.processes)
        print(f"{args.out}: {len(pictures)} kinds, {built['images']['train']} training and "
              f"{built['images']['val']} validation images, from {sum(map(len, pictures.values()))} pictures")
    elif args.set == "glyphs":
        fonts = installed_fonts(args.fonts)
        if len(fonts) < 2:
            raise SystemExit(f"{args.fonts} holds {len(fonts)} font famil{'y' if len(fonts) == 1 else 'ies'}; "
                             f"holding some out needs at least two (see this script's docstring for packages)")
        if not args.any_fonts:
            left_out = sorted(set(fonts) - set(MEASURED_FAMILIES))
            fonts = measured_fonts(fonts, args.fonts)
            if left_out:
                print(f"left out {len(left_out)} installed font families the committed set was not built from "
                      f"(--any-fonts takes them): {', '.join(left_out)}")
        if args.out.exists():
            shutil.rmtree(args.out)
        built = build_glyphs(args.out, fonts, args.variants, args.val_share, args.seed)
        print(f"{args.out}: {built['images']['train']} training and {built['images']['val']} validation images; "
              f"validation families: {', '.join(built['val_families'])}")
    else:
        print(f"{args.out}: {build_perldoc(args.out, args.pods)} files")


if __name__ == "__main__":
    main()
