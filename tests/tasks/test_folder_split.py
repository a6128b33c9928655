"""An image folder is split into training and validation by one rule, in memory and streamed: the in-memory
image-folder task and `speedkit data prepare` hold the same validation files."""
from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("litdata")

from speedkit.data.streaming import prepare_images  # noqa: E402
from speedkit.data.streaming.errors import MANIFEST  # noqa: E402
from speedkit.tasks.builtin.image_folder import image_folder_task, load_image_folder  # noqa: E402


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))
    load_image_folder.cache_clear()


def _gray_folder(root, sizes=(11, 3)):
    """Class folders of solid gray PNGs, each image its own gray level, so a decoded image names its file."""
    from PIL import Image

    level = 10
    for label, count in enumerate(sizes):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (20, 20), (level, level, level)).save(folder / f"im{i:02d}.png")
            level += 15
    return root


def _streamed_validation(shards) -> set:
    from litdata import StreamingDataset
    from PIL import Image

    dataset = StreamingDataset(str(shards / "val"))
    seen = set()
    for index in range(len(dataset)):
        item = dataset[index]
        with Image.open(io.BytesIO(bytes(item["image"]))) as image:
            gray = image.convert("L").getpixel((0, 0))
        seen.add((int(item["label"]), round(gray / 15)))  # JPEG moves a solid gray by a level or two at most
    return seen


def test_the_in_memory_task_and_the_streamed_shards_hold_the_same_validation_files(tmp_path):
    source = _gray_folder(tmp_path / "source")
    for seed in (0, 1, 2):
        load_image_folder.cache_clear()
        arrays = load_image_folder(str(source), 8, 0.3, seed)
        in_memory = {(int(label), round(int(x[0, 0, 0]) / 15)) for x, label in zip(arrays.val_x, arrays.val_y)}
        prepare_images(source, tmp_path / f"shards{seed}", short_side=16, val_fraction=0.3, seed=seed, progress=False)
        assert _streamed_validation(tmp_path / f"shards{seed}") == in_memory
        labels = sorted(label for label, _ in in_memory)
        assert labels.count(0) == 3 and labels.count(1) == 1  # round(0.3 * 11); a class of 3 keeps one aside
    assert json.loads((tmp_path / "shards0" / MANIFEST).read_text())["split_rule"] == "by-class-1"


def test_shards_prepared_before_the_shared_split_rule_say_their_validation_set_may_differ(tmp_path, recwarn):
    source = _gray_folder(tmp_path / "source")
    shards = tmp_path / "shards"
    prepare_images(source, shards, short_side=16, progress=False)
    image_folder_task(shards)
    assert not [w for w in recwarn if "prepared before" in str(w.message)]
    manifest = json.loads((shards / MANIFEST).read_text())
    del manifest["split_rule"]  # as an older prepare wrote it
    (shards / MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match=r"prepared before .*--overwrite"):
        image_folder_task(shards)
    recwarn.clear()
    _gray_folder(tmp_path / "layout" / "train"), _gray_folder(tmp_path / "layout" / "val")  # never split: no warning
    prepare_images(tmp_path / "layout", tmp_path / "layout-shards", short_side=16, progress=False)
    manifest = json.loads((tmp_path / "layout-shards" / MANIFEST).read_text())
    assert manifest.pop("split_rule") == "given"
    (tmp_path / "layout-shards" / MANIFEST).write_text(json.dumps(manifest))
    image_folder_task(tmp_path / "layout-shards")
    assert not [w for w in recwarn if "prepared before" in str(w.message)]


def test_cached_shards_split_by_the_older_rule_are_prepared_again(tmp_path):
    from speedkit.data.streaming.shards import read_shards

    source = _gray_folder(tmp_path / "source")
    with pytest.warns(UserWarning, match="preparing them now"):
        task = image_folder_task(source, stream=True)
    cache = next((tmp_path / "cache").iterdir())
    manifest = json.loads((cache / MANIFEST).read_text())
    del manifest["split_rule"]  # as an older prepare wrote it
    (cache / MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="split an image folder by one rule: preparing them again"):
        again = image_folder_task(source, stream=True)
    assert read_shards(cache).manifest["split_rule"] == "by-class-1"
    assert again.summary == task.summary


def test_an_unfinished_prepare_split_by_the_older_rule_is_not_continued_by_the_new_one(tmp_path):
    from speedkit.data.streaming.shards import PLAN_DIR

    source, out = _gray_folder(tmp_path / "source"), tmp_path / "shards"
    prepare_images(source, out, short_side=16, progress=False)
    plan_path = out / PLAN_DIR / "plan.json"
    plan = json.loads(plan_path.read_text())
    del plan["split_rule"]  # as an older prepare planned it: no rule recorded, and its fingerprint without one
    plan["fingerprint"] = "older"
    plan_path.write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=r"older rule.*--overwrite"):
        prepare_images(source, out, short_side=16, progress=False)


def _marked_text_folder(root, files=10):
    """Text files each repeating its own marker word, so a stretch of text names its file; and a hidden copy."""
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"doc{i}.txt").write_text(f"marker{i} says hello to the corpus. " * 40)
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "doc0-checkpoint.txt").write_text("hidden copy. " * 80)
    return root


def _markers(text: str) -> set:
    import re

    return set(re.findall(r"marker(\d+)", text))


def test_a_text_folder_holds_the_same_validation_files_in_memory_and_streamed_whatever_the_runs_seed(tmp_path):
    pytest.importorskip("tokenizers")
    import torch
    from litdata import StreamingDataset
    from tokenizers import Tokenizer

    from speedkit.data.streaming import prepare_text
    from speedkit.tasks.builtin.text_folder import text_folder_task
    from speedkit.tasks.task import DataRequest

    source = _marked_text_folder(tmp_path / "text")
    shards = tmp_path / "tokens"
    prepare_text(source, shards, vocab_size=300, block=32, progress=False)
    tokenizer = Tokenizer.from_file(str(shards / "tokenizer.json"))
    dataset = StreamingDataset(str(shards / "val"))
    streamed = set()
    for index in range(len(dataset)):
        streamed |= _markers(tokenizer.decode([int(t) for t in dataset[index]["tokens"]]).replace(" ", ""))
    task = text_folder_task(source)
    for seed in (0, 1, 2, 3):
        in_memory = set()
        for inputs, _ in task.eval_data(DataRequest(batch_size=4, device=torch.device("cpu"), seed=seed)):
            in_memory |= _markers(bytes(inputs.flatten().tolist()).decode(errors="replace"))
        assert in_memory == streamed and len(streamed) == 1  # round(0.1 * 10) files, the hidden copy left out
