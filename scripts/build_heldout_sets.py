"""Build the held-out data sets from Debian packages: data that no preset, default or search was tuned on, so
that what speedkit's ladders and `speedkit tune` reach there says how they carry over to a user's own data.

- ``glyphs``: an image folder of the 62 letters and digits (0-9, A-Z, a-z) rendered from the fonts installed
  under /usr/share/fonts, 32x32 grey, each glyph drawn a few times at a random size, offset and slant. Whole
  font families are held out for validation, so validation comes from typefaces training never saw. A flip
  changes a letter, so train it with ``--no-flips``. Classes that look alike (o/O/0, l/I/1, s/S, ...) cap
  the accuracy below 100%.
- ``perldoc``: a text folder of Perl's documentation (the perl-doc package's .pod files, as .txt).

    sudo apt-get install fonts-dejavu-core fonts-dejavu-extra fonts-liberation fonts-freefont-ttf \\
        fonts-urw-base35 perl-doc
    python scripts/build_heldout_sets.py glyphs --out data/heldout/glyphs
    python scripts/build_heldout_sets.py perldoc --out data/heldout/perldoc

The output is the same for the same fonts and seed. The data goes under data/ (ignored by git); the command
above is what is committed.
"""
from __future__ import annotations

import argparse
import random
import shutil
import string
import subprocess
import zlib
from pathlib import Path

CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase
FONT_SUFFIXES = (".ttf", ".otf", ".t1", ".pfb")  # a font in several of these formats is kept in the first
# Fonts that draw other symbols at the letters' code points (Greek, dingbats, math extensions): wrong labels.
SYMBOL_FONTS = ("symbol", "dingbat", "d050000l", "cmex", "cmsy")
# Families that copy one design (free clones of Helvetica, Times and Courier) go to the same side of the split,
# so that validation never shows a typeface that training saw under another name.
SAME_DESIGN = (("FreeSans", "Nimbus Sans", "Nimbus Sans Narrow", "Liberation Sans", "Liberation Sans Narrow"),
               ("FreeSerif", "Nimbus Roman", "Liberation Serif"),
               ("FreeMono", "Nimbus Mono PS", "Liberation Mono"))


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    sets = parser.add_subparsers(dest="set", required=True)
    glyphs = sets.add_parser("glyphs", allow_abbrev=False, help="62-class letters and digits from the installed fonts")
    glyphs.add_argument("--out", type=Path, required=True, help="the folder to write train/ and val/ into (emptied)")
    glyphs.add_argument("--fonts", type=Path, default=Path("/usr/share/fonts"), help="where the fonts are")
    glyphs.add_argument("--variants", type=int, default=3, help="renderings of each glyph of each font (default 3)")
    glyphs.add_argument("--val-share", type=float, default=0.3, help="share of the designs held out (default 0.3)")
    glyphs.add_argument("--seed", type=int, default=0, help="seed of the family split and the renderings")
    perldoc = sets.add_parser("perldoc", allow_abbrev=False, help="Perl's documentation as a text folder")
    perldoc.add_argument("--out", type=Path, required=True, help="the folder to copy the .txt files into")
    perldoc.add_argument("--pods", type=Path, default=Path("/usr/share/perl/5.36/pod"),
                         help="where perl-doc installed the .pod files")
    args = parser.parse_args(argv)
    if args.set == "glyphs":
        fonts = installed_fonts(args.fonts)
        if len(fonts) < 2:
            raise SystemExit(f"{args.fonts} holds {len(fonts)} font famil{'y' if len(fonts) == 1 else 'ies'}; "
                             f"holding some out needs at least two (see this script's docstring for packages)")
        if args.out.exists():
            shutil.rmtree(args.out)
        built = build_glyphs(args.out, fonts, args.variants, args.val_share, args.seed)
        print(f"{args.out}: {built['images']['train']} training and {built['images']['val']} validation images; "
              f"validation families: {', '.join(built['val_families'])}")
    else:
        print(f"{args.out}: {build_perldoc(args.out, args.pods)} files")


if __name__ == "__main__":
    main()
