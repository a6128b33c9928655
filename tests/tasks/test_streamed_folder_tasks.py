"""image-folder and text-folder pick streaming by themselves: a shard folder as --data, stream=True, or an image
folder that would not fit in memory; small folders stay in memory."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")

from streaming_data import make_image_folder, make_text_folder  # noqa: E402

from speedkit.data import BatchLoader  # noqa: E402
from speedkit.data.streaming import StreamingImageLoader, StreamingTokenLoader, prepare_images, prepare_text  # noqa: E402
from speedkit.tasks.builtin.image_folder import image_folder_task, load_image_folder  # noqa: E402
from speedkit.tasks.builtin.text_folder import text_folder_task  # noqa: E402
from speedkit.tasks.task import DataRequest  # noqa: E402


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))
    load_image_folder.cache_clear()


def _request(**kw):
    return DataRequest(batch_size=6, device=torch.device("cpu"), **kw)


def test_a_small_image_folder_stays_in_memory_and_a_shard_folder_streams(tmp_path):
    source = make_image_folder(tmp_path / "source", per_class=6)
    task = image_folder_task(source, image_size=16)
    assert isinstance(task.train_data(_request()), BatchLoader)
    prepare_images(source, tmp_path / "shards", short_side=24, progress=False)
    streamed = image_folder_task(tmp_path / "shards")
    loader = streamed.train_data(_request())
    assert isinstance(loader, StreamingImageLoader) and loader.image_size == 24  # the shards' short side
    images, labels = next(iter(loader))
    assert images.shape == (6, 3, 24, 24) and "streamed from shards" in streamed.summary
    assert streamed.model("resnet8")(images).shape == (6, 3)
    assert isinstance(streamed.eval_data(_request()), StreamingImageLoader)


def test_a_folder_that_would_not_fit_in_memory_is_streamed_and_says_so(tmp_path, monkeypatch):
    import speedkit.data.images as images

    source = make_image_folder(tmp_path / "source", per_class=6)
    monkeypatch.setattr(images, "available_memory", lambda: 1000)  # a machine with 1 kB free
    with pytest.warns(UserWarning, match="does not fit in memory.*streaming it from shards"):
        task = image_folder_task(source, image_size=16)
    assert isinstance(task.train_data(_request()), StreamingImageLoader)
    with pytest.raises(MemoryError):
        image_folder_task(source, image_size=16, stream=False)
    with pytest.warns(UserWarning, match="streaming it from shards"):  # prepared once: found in the cache again
        again = image_folder_task(source, image_size=16, stream=True)
    assert isinstance(again.train_data(_request()), StreamingImageLoader)


def test_text_folder_streams_bpe_tokens_from_shards(tmp_path):
    source = make_text_folder(tmp_path / "source")
    prepare_text(source, tmp_path / "shards", vocab_size=300, block=32, progress=False)
    task = text_folder_task(tmp_path / "shards")
    model = task.model("gpt-nano")
    loader = task.train_data(DataRequest(batch_size=8, device=torch.device("cpu"), model=model))
    assert isinstance(loader, StreamingTokenLoader) and loader.seq_len == 32
    inputs, targets = next(iter(loader))
    assert model.config.vocab_size == 300 and task.target_metric == "eval/loss"
    assert model(inputs).shape[-1] == model.config.padded_vocab_size == 320  # the GPT pads its rows to 64s


def test_a_shard_folder_asked_to_load_in_memory_is_refused_not_streamed_anyway(tmp_path):
    source = make_image_folder(tmp_path / "source", per_class=4)
    prepare_images(source, tmp_path / "shards", short_side=24, progress=False)
    with pytest.raises(ValueError, match=r"is a shard folder.*leave out stream=False"):
        image_folder_task(tmp_path / "shards", stream=False)
    text = make_text_folder(tmp_path / "text")
    prepare_text(text, tmp_path / "tokens", vocab_size=300, block=32, progress=False)
    with pytest.raises(ValueError, match=r"is a shard folder.*leave out stream=False"):
        text_folder_task(tmp_path / "tokens", stream=False)
