"""scripts/build_heldout_sets.py: the held-out glyph folder holds whole font families out of training, is
the same for the same fonts and seed, and loads as an image-folder task of 62 classes; the objects folder holds
whole stamps out and leaves the drawn ones out; the clipart folder holds whole designs out."""
from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
from pathlib import Path

import matplotlib
from PIL import Image

from speedkit.tasks import resolve_task

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_heldout_sets.py"
spec = importlib.util.spec_from_file_location("build_heldout_sets", SCRIPT)
builder = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = builder  # its dataclass looks itself up there
spec.loader.exec_module(builder)

MPL_FONTS = Path(matplotlib.get_data_path()) / "fonts" / "ttf"  # real fonts that ship with matplotlib


def font_folder(root: Path) -> Path:
    root.mkdir()
    for name in ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "cmex10.ttf"):
        shutil.copy(MPL_FONTS / name, root / name)
    return root


def test_glyphs_hold_whole_families_out_and_load_as_a_62_class_folder(tmp_path):
    fonts = builder.installed_fonts(font_folder(tmp_path / "fonts"))
    assert set(fonts) == {"DejaVuSans", "DejaVuSerif", "DejaVuSansMono"}  # the math-symbol font is left out
    assert len(fonts["DejaVuSans"]) == 2  # Bold goes with its family
    out = tmp_path / "glyphs"
    built = builder.build_glyphs(out, fonts, variants=2, val_share=0.34, seed=0)
    assert len(built["val_families"]) == 1 and not set(built["val_families"]) & set(built["train_families"])

    def stems(split):
        return {p.stem.rsplit("_", 1)[0] for p in (out / split).rglob("*.png")}

    val_stems = {f.stem for family in built["val_families"] for f in fonts[family]}
    assert stems("val") == val_stems and not stems("train") & val_stems
    classes = sorted(p.name for p in (out / "train").iterdir())
    assert len(classes) == 62 and "upper_A" in classes and "lower_a" in classes
    assert built["images"]["train"] == len(list((out / "train").rglob("*.png")))
    image = Image.open(next((out / "val" / "upper_A").iterdir()))
    assert image.size == (32, 32) and image.mode == "L" and image.getbbox() is not None

    again = tmp_path / "again"
    builder.build_glyphs(again, fonts, variants=2, val_share=0.34, seed=0)
    some = sorted((out / "train" / "lower_g").iterdir())[0]
    assert some.read_bytes() == (again / "train" / "lower_g" / some.name).read_bytes()  # the same set again

    task = resolve_task("image-folder", data=out, flips_keep_labels=False)
    assert "62-class" in task.summary and task.flips_keep_labels is False


def test_the_glyph_command_refuses_a_folder_with_one_family(tmp_path):
    import pytest

    (tmp_path / "fonts").mkdir()
    shutil.copy(MPL_FONTS / "DejaVuSans.ttf", tmp_path / "fonts")
    with pytest.raises(SystemExit, match="1 font family"):
        builder.main(["glyphs", "--out", str(tmp_path / "out"), "--fonts", str(tmp_path / "fonts")])


def test_the_glyph_command_builds_the_measured_families_alone_and_refuses_a_font_set_without_them(tmp_path, capsys):
    """Another machine's fonts must not silently make another set: the families the committed studies measured
    are kept and any others left out; one of them missing is refused, naming it and the packages, unless
    --any-fonts asks for the fonts installed."""
    import pytest

    paths = {family: [Path(f"/fonts/{family}.ttf")] for family in (*builder.MEASURED_FAMILIES, "Comic Neue")}
    assert list(builder.measured_fonts(paths, Path("/fonts"))) == list(builder.MEASURED_FAMILIES)
    fonts = font_folder(tmp_path / "fonts")  # three DejaVu families as matplotlib ships them, none by that name
    with pytest.raises(SystemExit, match=r"lacks 20 of the font families.*C059.*apt-get install fonts-dejavu-core.*"
                                         r"--any-fonts"):
        builder.main(["glyphs", "--out", str(tmp_path / "out"), "--fonts", str(fonts)])
    assert not (tmp_path / "out").exists()
    builder.main(["glyphs", "--out", str(tmp_path / "out"), "--fonts", str(fonts), "--any-fonts", "--variants", "1"])
    assert "validation families" in capsys.readouterr().out and (tmp_path / "out" / "val").is_dir()


def test_perldoc_copies_the_pods_as_text_files_and_names_the_package_when_there_are_none(tmp_path):
    import pytest

    pods = tmp_path / "pods"
    pods.mkdir()
    (pods / "perlintro.pod").write_text("=head1 NAME\n\nperlintro - a brief introduction\n")
    (pods / "README").write_text("not a pod")
    assert builder.build_perldoc(tmp_path / "text", pods) == 1
    assert (tmp_path / "text" / "perlintro.txt").read_text().startswith("=head1 NAME")
    with pytest.raises(SystemExit, match="install the perl-doc package"):
        builder.build_perldoc(tmp_path / "none", tmp_path / "empty")


def stamp_tree(root: Path) -> Path:
    """A stamps folder laid out as tuxpaint's: photographed stamps per kind, drawn ones under cartoon/ and toys/."""
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    for kind, folders in builder.OBJECTS.kinds.items():
        for n, folder in enumerate(folders):
            for i, colour in enumerate(colours[: 4 - n]):
                stamp = Image.new("RGBA", (60 + 10 * i, 40), (0, 0, 0, 0))
                stamp.paste(colour + (255,), (5, 5, 50 + 10 * i, 35))
                (root / folder).mkdir(parents=True, exist_ok=True)
                stamp.save(root / folder / f"{kind}{n}{i}.png")
        for drawn in ("cartoon", "toys"):
            (root / folders[0] / drawn).mkdir()
            Image.new("RGBA", (30, 30), (9, 9, 9, 255)).save(root / folders[0] / drawn / "drawn.png")
    return root


def test_objects_hold_whole_stamps_out_leave_drawn_ones_out_and_load_as_an_imagenet_folder(tmp_path):
    root = stamp_tree(tmp_path / "stamps")
    source = dataclasses.replace(builder.OBJECTS, root=root)
    stamps = builder.cutout_pictures(source)
    assert set(stamps) == set(builder.OBJECTS.kinds) and len(stamps["vehicles"]) == 7  # both of its folders
    assert not any("cartoon" in str(p) or "toys" in str(p) for paths in stamps.values() for p in paths)
    out = tmp_path / "objects"
    built = builder.build_cutouts(out, source, stamps, images=45, val_images=18, val_share=0.25, seed=0, processes=1)
    assert built["images"] == {"train": 45, "val": 18}
    for kind, held in built["val_pictures"].items():  # a quarter of each kind's stamps, never in training
        trained = {Path(p).relative_to(root).as_posix()
                   for p in builder.split_families([str(p) for p in stamps[kind]], 0.25, 0)[0]}
        assert len(held) == round(len(stamps[kind]) * 0.25) and not set(held) & trained
        assert len(trained) + len(held) == len(stamps[kind])
    images = sorted((out / "train").rglob("*.jpg"))
    assert len(images) == 45 and len({p.parent.name for p in images}) == 9
    sizes = {Image.open(p).size for p in images}
    assert all(96 <= side <= 512 for size in sizes for side in size) and len(sizes) > 10
    again = tmp_path / "again"
    builder.build_cutouts(again, source, stamps, images=45, val_images=18, val_share=0.25, seed=0, processes=1)
    assert images[0].read_bytes() == (again / images[0].relative_to(out)).read_bytes()  # the same set again

    task = resolve_task("image-folder", data=out)
    assert "9-class" in task.summary


def test_the_objects_command_names_the_package_when_the_stamps_are_missing(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="apt-get install tuxpaint-stamps-default"):
        builder.main(["objects", "--out", str(tmp_path / "out"), "--pictures", str(tmp_path / "none")])


def test_clipart_holds_whole_designs_out_and_leaves_out_what_is_filed_under_two_kinds(tmp_path):
    """A drawing's colour and black-and-white prints and its numbered variants are one design, held out whole; a
    drawing filed under two kinds and the toys among the tools are left out; a very large drawing is shrunk."""
    root = tmp_path / "openclipart"
    for kind, folders in builder.CLIPART.kinds.items():
        folder = root / folders[0]
        folder.mkdir(parents=True, exist_ok=True)
        for n, name in enumerate(("cone1_bw_ganson", "cone2_ganson", "cone_3-ganson", "bus_01", "tree", "ant")):
            drawing = Image.new("RGBA", (50, 40), (0, 0, 0, 0))
            drawing.paste((40 * n, 90, 200, 255), (5, 5, 45, 35))
            drawing.save(folder / f"{kind}_{name}.png")
    Image.new("RGBA", (3000, 1000), (9, 9, 9, 255)).save(root / "animals/mammals/poster.png")
    Image.new("RGBA", (40, 40), (9, 9, 9, 255)).save(root / "food/fruit/apple_juice_box.png")
    Image.new("RGBA", (40, 40), (9, 9, 9, 255)).save(root / "food/beverages/apple_juice_box.png")
    (root / "tools/toys").mkdir()
    Image.new("RGBA", (40, 40), (9, 9, 9, 255)).save(root / "tools/toys/kite.png")

    source = dataclasses.replace(builder.CLIPART, root=root)
    pictures = builder.cutout_pictures(source)
    names = {kind: {p.name for p in paths} for kind, paths in pictures.items()}
    assert "apple_juice_box.png" not in names["fruit"] | names["drinks"] and "kite.png" not in names["tools"]
    assert names["mammals"] == {f"mammals_{name}.png" for name in ("cone1_bw_ganson", "cone2_ganson", "cone_3-ganson",
                                                                   "bus_01", "tree", "ant")} | {"poster.png"}
    for seed in range(4):  # the cones go to one side, whichever it is
        split = builder.held_out_whole(pictures["birds"], builder.CLIPART.design, 0.25, seed)
        sides = {side for side, paths in split.items() for p in paths if "cone" in p}
        assert len(sides) == 1 and len(split["val"]) in (1, 3) and len(split["train"]) + len(split["val"]) == 6
    assert builder.load_cutout(str(root / "animals/mammals/poster.png"), 1024).size == (1024, 341)
    assert builder.load_cutout(str(root / "animals/birds/birds_tree.png"), trim=True).size == (40, 30)

    out = tmp_path / "clipart"
    built = builder.build_cutouts(out, source, pictures, images=30, val_images=10, val_share=0.25, seed=0, processes=1)
    assert built["images"] == {"train": 30, "val": 10}
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(builder.CLIPART.kinds)
    task = resolve_task("image-folder", data=out)
    assert "10-class" in task.summary
