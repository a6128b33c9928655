"""The tasks over a user's own files: ``image-folder`` (class folders of images) and ``text-folder`` (a folder
of text files), each with a default model and recipe that train as they are, models by library name, and
clear errors for a folder that holds nothing to train on."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from prerequisites import import_or_missing

from speedkit.data import load_fashion_mnist
from speedkit.data.text import DEFAULT_TEXT_ROOT
from speedkit.tasks import TASKS, make_trainer, resolve_task

pytestmark = pytest.mark.prerequisite("fashion-mnist", "python-docs")  # the folders hold real files
CLASSES = {0: "tshirt", 1: "trouser", 7: "sneaker"}  # three Fashion-MNIST classes, easy to tell apart


def write_image_folder(root: Path, per_class: int, rgb: bool = False, offset: int = 0) -> Path:
    """Real Fashion-MNIST images written as PNG files into root/<class>/."""
    arrays = load_fashion_mnist()
    labels = arrays.train_y.numpy()
    for label, name in CLASSES.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i, index in enumerate(np.flatnonzero(labels == label)[offset:offset + per_class]):
            pixels = arrays.train_x[index].numpy()
            image = Image.fromarray(pixels, mode="L")
            (image.convert("RGB") if rgb else image).save(folder / f"{i:03d}.png")
    return root



@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("images"), per_class=80)


def test_image_folder_trains_with_its_default_model_and_recipe(image_dir, tmp_path):
    trainer = make_trainer("image-folder", "baseline", data=image_dir, duration="3ep", run_dir=tmp_path,
                           save_checkpoints=False)
    task = TASKS["image-folder"]
    assert task.summary.startswith("3-class images") and "1 channel" in task.summary  # grayscale PNGs: 1 channel
    record = trainer.fit()
    assert record.status == "completed" and record.config["task"] == "image-folder"
    assert record.final_metrics["eval/accuracy"] > 0.6  # chance is 1/3


def test_image_folder_reads_train_and_val_folders_in_colour(tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", per_class=20, rgb=True)
    write_image_folder(root / "val", per_class=5, rgb=True, offset=20)
    task = resolve_task("image-folder", data=root)
    from speedkit.tasks.builtin import load_image_folder

    arrays = load_image_folder(str(root.resolve()), 32, 0.1, 0)
    assert tuple(arrays.train_x.shape) == (60, 3, 32, 32) and tuple(arrays.val_x.shape) == (15, 3, 32, 32)
    assert arrays.classes == ("sneaker", "trouser", "tshirt")
    assert "3 channel" in task.summary


@pytest.mark.parametrize("name", ["torchvision:mobilenet_v3_small", "timm:resnet10t"])
def test_image_folder_trains_a_library_model_adapted_to_its_channels_and_classes(image_dir, tmp_path, name):
    if name.startswith("timm:"):
        import_or_missing("timm", "pip install 'torch-speedkit[timm]'")
    trainer = make_trainer("image-folder", "baseline", data=image_dir, model=name, duration="2ba", run_dir=tmp_path,
                           save_checkpoints=False, eval_fraction=0.5)
    first_conv = next(m for m in trainer.state.model.modules() if m.__class__.__name__ == "Conv2d")
    assert first_conv.in_channels == 1
    assert trainer.fit().status == "completed"


def test_a_library_model_that_does_not_exist_is_named(image_dir, tmp_path):
    with pytest.raises(ValueError, match="'no_such_net' is not a torchvision classification model"):
        make_trainer("image-folder", "baseline", data=image_dir, model="torchvision:no_such_net", run_dir=tmp_path)


def test_a_folder_without_images_is_refused_with_the_layout(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("no pictures here")
    with pytest.raises(FileNotFoundError, match=r"class folder\(s\) cats hold no images.*expected the layout"):
        make_trainer("image-folder", data=tmp_path)
    with pytest.raises(FileNotFoundError, match="has no class subfolders"):
        make_trainer("image-folder", data=tmp_path / "cats")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_trainer("image-folder", data=tmp_path / "missing")


def test_one_class_folder_is_not_a_classification_task(tmp_path):
    write_image_folder(tmp_path, per_class=3)
    for name in ("trouser", "sneaker"):
        shutil.rmtree(tmp_path / name)
    with pytest.raises(ValueError, match="one class folder .*needs at least two"):
        resolve_task("image-folder", data=tmp_path)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """Twenty real files of the Python docs' sources, copied into a folder of the user's."""
    root = tmp_path_factory.mktemp("text")
    for path in sorted((DEFAULT_TEXT_ROOT / "library").glob("*.rst.txt"))[:20]:
        shutil.copy(path, root / path.name)
    return root


def test_text_folder_trains_its_default_language_model(text_dir, tmp_path):
    trainer = make_trainer("text-folder", "baseline", data=text_dir, duration="16ba", eval_interval="8ba",
                           batch_size=8, eval_fraction=0.02, run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed" and record.config["task"] == "text-folder"
    first, last = record.evals[0]["eval/bpb"], record.evals[-1]["eval/bpb"]
    assert last < 8.0 and last < first  # 8 bits per byte is knowing nothing; it learned from the text
    assert set(TASKS["text-folder"].recipes) == {"baseline", "mild", "hot"}


def test_a_folder_without_text_is_refused(tmp_path):
    (tmp_path / "picture.png").write_bytes(b"\x89PNG")
    with pytest.raises(FileNotFoundError, match=r"no files ending in .txt, .rst, .md under"):
        make_trainer("text-folder", data=tmp_path)
