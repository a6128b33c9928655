"""scripts/build_heldout_sets.py: the held-out glyph folder holds whole font families out of training, is
the same for the same fonts and seed, and loads as an image-folder task of 62 classes."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import matplotlib
from PIL import Image

from speedkit.tasks import resolve_task

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_heldout_sets.py"
spec = importlib.util.spec_from_file_location("build_heldout_sets", SCRIPT)
builder = importlib.util.module_from_spec(spec)
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
