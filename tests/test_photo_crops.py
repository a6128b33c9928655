"""scripts/build_photo_crops.py: validation crops come only from a strip of each photograph that training crops
never touch, saved sizes stay in 96-512 px, and the set is the same for the same seed."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_photo_crops.py"
spec = importlib.util.spec_from_file_location("build_photo_crops", SCRIPT)
builder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(builder)


def overlap(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def inside(crop, box) -> bool:
    return box[0] <= crop[0] < crop[2] <= box[2] and box[1] <= crop[1] < crop[3] <= box[3]


@pytest.mark.parametrize("size", [(1600, 1000), (1000, 1600), (97, 96), (2, 2), (1600, 301)])
def test_the_validation_strip_never_overlaps_training_and_crops_stay_in_their_region(size):
    for seed in range(20):
        rng = random.Random(seed)
        train, val = builder.split_regions(*size, rng)
        assert not overlap(train, val)
        area = (train[2] - train[0]) * (train[3] - train[1]) + (val[2] - val[0]) * (val[3] - val[1])
        assert area == size[0] * size[1]  # together they cover the photograph
        long_axis = 0 if size[0] >= size[1] else 1
        assert val[2 + long_axis] - val[long_axis] == max(1, round(size[long_axis] * builder.VAL_SHARE))
        for box in (train, val):
            for _ in range(20):
                assert inside(builder.sample_crop(box, rng), box)


def test_saved_sizes_stay_in_range_and_keep_the_aspect_where_they_can():
    rng = random.Random(0)
    for width, height in [(500, 250), (250, 500), (300, 300), (1000, 20), (12, 900)]:
        for _ in range(50):
            w, h = builder.output_size(width, height, rng)
            assert builder.MIN_SIDE <= w <= builder.MAX_SIDE and builder.MIN_SIDE <= h <= builder.MAX_SIDE
            if 0.5 <= width / height <= 2 and max(w, h) >= 2 * builder.MIN_SIDE:
                assert abs(w / h - width / height) < 0.05 * width / height


def gradient_photo(path: Path) -> Path:
    """Red grows with x: a crop's mean red says which columns it came from."""
    red = np.tile(np.linspace(0, 255, 800, dtype=np.float32), (400, 1))
    Image.fromarray(np.stack([red, np.full_like(red, 90), np.full_like(red, 160)], -1).astype(np.uint8)).save(path)
    return path


def test_validation_images_come_from_the_held_out_strip_and_the_set_repeats(tmp_path):
    photos = {"gradient": gradient_photo(tmp_path / "gradient.png"), "other": gradient_photo(tmp_path / "other.png")}
    out = tmp_path / "crops"
    built = builder.build(out, photos, images=30, val_images=10, seed=3, strength=0.0, grey_share=0.0,
                          processes=1, progress=False)
    assert built["images"] == {"train": 30, "val": 10}
    assert len(list((out / "train" / "gradient").glob("*.jpg"))) == 15
    train, val = builder.split_regions(800, 400, random.Random(builder.zlib.crc32(b"3/gradient")))
    val_red = (val[0] * 255 / 800, val[2] * 255 / 800)

    def mean_red(path):
        image = Image.open(path)
        assert builder.MIN_SIDE <= min(image.size) and max(image.size) <= builder.MAX_SIDE and image.mode == "RGB"
        return np.asarray(image, dtype=np.float32)[..., 0].mean()

    for path in (out / "val" / "gradient").glob("*.jpg"):
        assert val_red[0] - 3 <= mean_red(path) <= val_red[1] + 3
    for path in (out / "train" / "gradient").glob("*.jpg"):
        assert not val_red[0] + 3 < mean_red(path) < val_red[1] - 3  # a training crop's centre is outside the strip

    again = tmp_path / "again"
    builder.build(again, photos, images=30, val_images=10, seed=3, strength=0.0, grey_share=0.0, processes=1,
                  progress=False)
    some = sorted((out / "val" / "other").iterdir())[0]
    assert some.read_bytes() == (again / "val" / "other" / some.name).read_bytes()


def test_the_command_refuses_bad_arguments_by_name(tmp_path):
    with pytest.raises(SystemExit):
        builder.main(["--out", str(tmp_path / "x"), "--images", "0"])
    with pytest.raises(SystemExit):
        builder.main(["--out", str(tmp_path / "x"), "--jitter", "1.5"])
