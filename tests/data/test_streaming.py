"""Data larger than memory: shards written by ``speedkit data prepare`` and streamed by the litdata loaders.

Small generated folders (JPEG and PNG of varied sizes, a few text files); every test runs in seconds."""
from __future__ import annotations

import errno
import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")

from speedkit.data.streaming import (ShardError, StreamingImageLoader, StreamingTokenLoader,  # noqa: E402
                                     prepare_images, prepare_text, read_shards)
import speedkit.data.streaming.prepare as prepare_module  # noqa: E402
from speedkit.core.engine import Callback  # noqa: E402
from speedkit.data.streaming.prepare import PrepareStopped  # noqa: E402

from streaming_data import CLASSES, PER_CLASS, make_image_folder, make_text_folder  # noqa: E402


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("images")
    source = make_image_folder(base / "source")
    result = prepare_images(source, base / "shards", short_side=32, part_size=10, progress=False)
    return source, base / "shards", result


@pytest.fixture(scope="module")
def text_shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("text")
    source = make_text_folder(base / "source")
    result = prepare_text(source, base / "shards", vocab_size=300, block=32, progress=False)
    return source, base / "shards", result


def _epoch_ids(loader) -> list:
    loader.seen_ids = []
    for _ in loader:
        pass
    return loader.seen_ids


# -- prepare --------------------------------------------------------------------------------------------------
def test_prepare_images_writes_every_image_once_resized_with_a_stable_id(image_shards):
    source, out, result = image_shards
    shards = read_shards(out, need_complete=True)
    assert result.complete and shards.kind == "images"
    assert shards.samples("train") + shards.samples("val") == CLASSES * PER_CLASS  # the hidden folder left out
    assert shards.manifest["classes"] == [f"class{c}" for c in range(CLASSES)]
    assert len(shards.manifest["mean"]) == 3 and all(0 < s for s in shards.manifest["std"])
    from litdata import StreamingDataset
    from PIL import Image
    import io

    dataset = StreamingDataset(str(out / "train"))
    ids, sizes = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        ids.append(int(item["id"]))
        with Image.open(io.BytesIO(bytes(item["image"]))) as image:
            assert image.format == "JPEG"
            sizes.append(min(image.size))
    assert sorted(ids) == list(range(shards.samples("train")))
    assert max(sizes) == 32 and min(sizes) < 32  # larger images shrunk to the short side, smaller ones kept


def test_a_streamed_epoch_serves_every_sample_once_in_the_in_memory_loaders_form(image_shards):
    _, out, _ = image_shards
    loader = StreamingImageLoader(out, 8, image_size=24, seed=3)
    loader.seen_ids = []
    batches = list(loader)
    assert len(batches) == len(loader) == -(-loader.dataset_size // 8)
    images, labels = batches[0]
    assert images.shape == (8, 3, 24, 24) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert sorted(loader.seen_ids) == list(range(loader.dataset_size))
    assert loader.epoch == 1  # a consumed iteration moves to the next epoch, like BatchLoader
    second = _epoch_ids(loader)
    assert sorted(second) == sorted(loader.seen_ids[:0] + second) and second != batches and len(set(second)) == len(second)


def test_the_order_and_augmentation_are_a_function_of_seed_and_epoch_and_not_of_the_workers(image_shards):
    _, out, _ = image_shards

    def epoch(workers, seed=0, e=1):
        loader = StreamingImageLoader(out, 6, image_size=16, seed=seed, num_workers=workers)
        loader.set_epoch(e)
        loader.seen_ids = []
        batches = list(loader)
        return loader.seen_ids, batches

    ids, batches = epoch(0)
    again_ids, again = epoch(0)
    assert ids == again_ids and all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    other_ids, _ = epoch(0, e=2)
    assert other_ids != ids and sorted(other_ids) == sorted(ids)
    two_ids, two = epoch(2)  # two worker processes: each sample once, its crop the same as decoded in one process
    assert sorted(two_ids) == sorted(ids)
    by_id = {i: img for (x, _), chunk in zip(batches, _chunks(ids, [len(b[1]) for b in batches])) for i, img in zip(chunk, x)}
    two_by_id = {i: img for (x, _), chunk in zip(two, _chunks(two_ids, [len(b[1]) for b in two])) for i, img in zip(chunk, x)}
    assert all(torch.equal(by_id[i], two_by_id[i]) for i in by_id)


def _worker_pids(loader) -> list:
    return sorted(process.pid for process in loader.loader._iterator._workers)


def test_workers_persist_across_epochs_and_read_the_epoch_and_size_from_shared_memory(image_shards):
    _, out, _ = image_shards
    loader = StreamingImageLoader(out, 6, image_size=16, seed=2, num_workers=2)
    next(iter(loader))  # an epoch left after one batch: the workers do not see its end
    pids = [_worker_pids(loader)]
    orders, sizes = {}, {}
    for epoch, size in ((2, 16), (3, 24)):  # an epoch chosen by set_epoch, then the next one at a new size
        loader.set_epoch(epoch)
        loader.set_image_size(size)
        loader.seen_ids = []
        sizes[epoch] = {tuple(images.shape[1:]) for images, _ in loader}
        orders[epoch] = loader.seen_ids
        pids.append(_worker_pids(loader))
    assert loader.persistent_workers and pids[0] == pids[1] == pids[2] and len(pids[0]) == 2  # the same two
    assert sizes == {2: {(3, 16, 16)}, 3: {(3, 24, 24)}}  # the new size reached them
    for epoch in (2, 3):  # each epoch's order is the one a loader started at that epoch has
        fresh = StreamingImageLoader(out, 6, image_size=16, seed=2, num_workers=2)
        fresh.set_epoch(epoch)
        assert _epoch_ids(fresh) == orders[epoch]
    assert orders[2] != orders[3]


def test_workers_hand_over_uint8_hwc_batches_that_the_loader_normalises_in_channels_last(image_shards):
    _, out, _ = image_shards
    loader = StreamingImageLoader(out, 4, split="val", image_size=16, channels_last=True)
    raw, _, _ = next(iter(loader.loader))  # as the workers' collate made it
    assert raw.dtype == torch.uint8 and raw.shape[1:] == (16, 16, 3) and raw.is_contiguous()
    images, _ = next(iter(loader))
    assert images.is_contiguous(memory_format=torch.channels_last)
    mean = torch.tensor(loader.mean).reshape(1, 3, 1, 1)
    std = torch.tensor(loader.std).reshape(1, 3, 1, 1)
    torch.testing.assert_close(images, (raw.permute(0, 3, 1, 2) / 255.0 - mean) / std)
    plain, _ = next(iter(StreamingImageLoader(out, 4, split="val", image_size=16)))
    assert plain.is_contiguous() and torch.equal(plain, images)


def _chunks(ids, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(ids[start:start + size])
        start += size
    return out


def test_evaluation_batches_are_centre_crops_in_a_fixed_order(image_shards):
    _, out, _ = image_shards
    first = StreamingImageLoader(out, 4, split="val", image_size=16)
    second = StreamingImageLoader(out, 4, split="val", image_size=16)
    a, b = list(first), list(second)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b)) and sum(len(y) for _, y in a) == first.dataset_size


def test_two_ranks_see_disjoint_samples_that_cover_the_epoch(image_shards):
    _, out, _ = image_shards
    ranks = [StreamingImageLoader(out, 4, image_size=16, rank=r, world_size=2) for r in range(2)]
    seen = [_epoch_ids(loader) for loader in ranks]
    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) == len(seen[1]) and len(ranks[0]) == len(ranks[1])  # the same steps on every rank
    total = ranks[0].dataset_size
    covered = set(seen[0]) | set(seen[1])
    assert total - 4 < len(covered) <= total  # at most the last part of a global batch is dropped


@pytest.mark.parametrize("workers", [0, 2])
def test_resuming_mid_epoch_from_the_state_serves_the_rest_exactly(image_shards, workers):
    _, out, _ = image_shards
    full = StreamingImageLoader(out, 5, image_size=16, num_workers=workers, seed=1)
    full.set_epoch(2)
    full.seen_ids = []
    expected = list(full)
    first = StreamingImageLoader(out, 5, image_size=16, num_workers=workers, seed=1)
    first.set_epoch(2)
    first.seen_ids = []
    iterator = first.iter_from(0)
    head = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))  # plain data, as the checkpoint holds it
    del iterator
    second = StreamingImageLoader(out, 5, image_size=16, num_workers=workers, seed=1)
    second.load_state_dict(state)
    second.set_epoch(2)
    second.seen_ids = []
    tail = list(second.iter_from(3))
    assert second.resumed_at == (2, 3)  # from litdata's state, not by replaying the first batches
    assert sorted(first.seen_ids[:15] + second.seen_ids) == list(range(full.dataset_size))
    assert first.seen_ids[:15] + second.seen_ids == full.seen_ids
    assert all(torch.equal(a[0], b[0]) for a, b in zip(head + tail, expected))


def test_resuming_on_other_data_is_refused_with_the_fix(image_shards, tmp_path):
    source, out, _ = image_shards
    loader = StreamingImageLoader(out, 5, image_size=16)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    prepare_images(source, tmp_path / "other", short_side=24, part_size=10, progress=False)
    other = StreamingImageLoader(tmp_path / "other", 5, image_size=16)
    with pytest.raises(ValueError, match="trained on other data.*start a new run"):
        other.load_state_dict(state)


# -- bad input ------------------------------------------------------------------------------------------------
def test_a_chunk_that_does_not_match_its_index_is_refused_naming_it(image_shards, tmp_path):
    _, out, _ = image_shards
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[1]
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(ShardError, match=f"{chunk.name}.*cut short"):
        StreamingImageLoader(copy, 4)
    chunk.unlink()
    with pytest.raises(ShardError, match=f"{chunk.name} is missing"):
        read_shards(copy)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("where", [6, 60])  # an item's offset (litdata's parser), the first image's bytes (PIL's)
def test_chunk_bytes_altered_in_place_are_one_error_naming_the_chunk_and_the_commands(image_shards, tmp_path, where,
                                                                                      workers):
    source, out, _ = image_shards
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[0]
    data = bytearray(chunk.read_bytes())
    data[where] ^= 0xFF  # the same size: the checks by size pass it
    chunk.write_bytes(bytes(data))
    loader = StreamingImageLoader(copy, 5, image_size=16, num_workers=workers)
    with pytest.raises(ShardError) as error:
        list(loader)
    message = str(error.value)
    assert f"{copy}/train/{chunk.name}: a sample cannot be read from it" in message, message
    assert f"`speedkit data info {copy} --verify`" in message
    assert f"prepare_images('{source}', '{copy}', part_size=10, verify=True)` again" in message  # not the CLI's size
    assert "to redo them" in message and "Traceback" not in message and "\n" not in message


def test_corrupt_and_truncated_images_are_named_or_skipped_and_counted(tmp_path):
    source = make_image_folder(tmp_path / "source", per_class=4)
    good = (source / "class1" / "im1.jpg").read_bytes()
    (source / "class1" / "im2.jpg").write_bytes(good[: len(good) // 2])  # truncated
    (source / "class2" / "im3.jpg").write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match=r"2 file\(s\) cannot be read.*im(2|3)\.jpg.*--skip-bad"):
        prepare_images(source, tmp_path / "out", short_side=32, part_size=100, progress=False)
    result = prepare_images(source, tmp_path / "out", short_side=32, part_size=100, progress=False, skip_bad=True)
    assert result.complete and len(result.skipped) == 2
    assert sum(result.samples.values()) == CLASSES * 4 - 2
    assert len(read_shards(tmp_path / "out").manifest["skipped"]) == 2


def test_a_killed_prepare_continues_and_redoes_only_the_unfinished_parts(tmp_path, monkeypatch):
    source = make_image_folder(tmp_path / "source", per_class=8)
    reference = prepare_images(source, tmp_path / "reference", short_side=32, part_size=5, progress=False)
    real, calls = prepare_module._encode_image, []

    def dies_on_the_13th(*args):
        calls.append(args[0])
        if len(calls) == 13:
            raise KeyboardInterrupt  # a kill in the middle of part 2
        return real(*args)

    monkeypatch.setattr(prepare_module, "_encode_image", dies_on_the_13th)
    with pytest.raises(KeyboardInterrupt):
        prepare_images(source, tmp_path / "out", short_side=32, part_size=5, progress=False)
    assert not (tmp_path / "out" / "speedkit-shards.json").exists()  # nothing is marked complete
    with pytest.raises(ShardError):
        read_shards(tmp_path / "out")
    calls.clear()
    monkeypatch.setattr(prepare_module, "_encode_image", lambda *a: (calls.append(a[0]), real(*a))[1])
    result = prepare_images(source, tmp_path / "out", short_side=32, part_size=5, progress=False)
    assert result.complete and result.samples == reference.samples
    # the parts done before the kill were kept: validation's 3 images (written first), then training's first 5
    assert len(calls) == sum(reference.samples.values()) - 8
    assert "continued the prepare that was there: 2 of 6 parts kept as written before, 4 written now" in (
        result.summary())
    for split in ("train", "val"):
        assert (json.loads((tmp_path / "out" / split / "index.json").read_text())["chunks"]
                == json.loads((tmp_path / "reference" / split / "index.json").read_text())["chunks"])


def test_a_kill_before_a_parts_statistics_are_kept_redoes_the_part(tmp_path, monkeypatch):
    """The done-marker is the part's last file: a kill before its statistics are written leaves the part undone,
    so the shards' mean and std count every image."""
    from speedkit.data.streaming import shards as S

    source = make_image_folder(tmp_path / "source", per_class=8)
    reference = read_shards(prepare_images(source, tmp_path / "reference", short_side=32, part_size=5,
                                           progress=False).out).manifest
    real_write = S.write_json

    def killed_writing_statistics(path, value):
        if path.suffix == ".done" and "stats" in value and path.name == "2.done":
            raise KeyboardInterrupt
        real_write(path, value)

    monkeypatch.setattr(S, "write_json", killed_writing_statistics)
    with pytest.raises(KeyboardInterrupt):
        prepare_images(source, tmp_path / "out", short_side=32, part_size=5, progress=False)
    monkeypatch.setattr(S, "write_json", real_write)
    manifest = read_shards(prepare_images(source, tmp_path / "out", short_side=32, part_size=5,
                                          progress=False).out).manifest
    assert manifest["mean"] == pytest.approx(reference["mean"]) and manifest["std"] == pytest.approx(reference["std"])


def test_a_changed_source_is_refused_on_rerun_with_the_fix(tmp_path, monkeypatch):
    source = make_image_folder(tmp_path / "source", per_class=4)
    prepare_images(source, tmp_path / "out", short_side=32, progress=False)
    (source / "class0" / "im0.png").unlink()
    with pytest.raises(ValueError, match="changed since.*--overwrite"):
        prepare_images(source, tmp_path / "out", short_side=32, progress=False)
    with pytest.raises(ValueError, match="options differ.*--overwrite"):
        prepare_images(source, tmp_path / "out", short_side=40, progress=False, overwrite=False)
    assert prepare_images(source, tmp_path / "out", short_side=32, progress=False, overwrite=True).complete


def _disk_fills_at(call: int, monkeypatch):
    real, calls = prepare_module._encode_image, []

    def encode(*args):
        calls.append(1)
        if len(calls) == call:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(prepare_module, "_encode_image", encode)
    return real


def test_running_out_of_disk_keeps_the_complete_parts_usable_and_says_so(tmp_path, monkeypatch):
    source = make_image_folder(tmp_path / "source", per_class=8)
    real = _disk_fills_at(12, monkeypatch)  # validation's 3 images, training's first part of 5, then a full disk
    with pytest.raises(PrepareStopped, match=r"out of disk space.*2 are done: its 5 training and 3 validation samples "
                                             r"stream as they are.*make about [0-9.]+ MB more free.*same command "
                                             r"again without --overwrite") as stopped:
        prepare_images(source, tmp_path / "out", short_side=32, part_size=5, progress=False)
    assert not stopped.value.result.complete and stopped.value.result.samples == {"train": 5, "val": 3}
    shards = read_shards(tmp_path / "out")
    assert not shards.complete
    with pytest.raises(ShardError, match="did not finish"):
        read_shards(tmp_path / "out", need_complete=True)
    assert len(_epoch_ids(StreamingImageLoader(tmp_path / "out", 4, image_size=16))) == 5  # what it says streams
    assert len(_epoch_ids(StreamingImageLoader(tmp_path / "out", 4, split="val", image_size=16))) == 3
    monkeypatch.setattr(prepare_module, "_encode_image", real)
    assert prepare_images(source, tmp_path / "out", short_side=32, part_size=5, progress=False).complete


def test_a_disk_full_before_any_training_part_says_no_run_can_use_the_folder(tmp_path, monkeypatch):
    source = make_image_folder(tmp_path / "source", per_class=8)
    _disk_fills_at(2, monkeypatch)
    with pytest.raises(PrepareStopped, match=r"it holds 0 training and 0 validation samples: no training samples "
                                             r"yet, so no run can use it.*make more free space") as stopped:
        prepare_images(source, tmp_path / "out", short_side=32, part_size=5, progress=False)
    assert "usable" not in str(stopped.value) and "stream as they are" not in str(stopped.value)
    with pytest.raises(ShardError, match="no train samples"):
        StreamingImageLoader(tmp_path / "out", 4, image_size=16)


# -- text -----------------------------------------------------------------------------------------------------
def test_text_becomes_bpe_token_blocks_with_the_tokenizer_saved_beside(text_shards):
    source, out, result = text_shards
    shards = read_shards(out, need_complete=True)
    assert shards.kind == "tokens" and shards.manifest["dtype"] == "uint16" and shards.manifest["vocab_size"] == 300
    assert (out / "tokenizer.json").is_file()
    loader = StreamingTokenLoader(out, 16, 8)
    inputs, targets = next(iter(loader))
    assert inputs.shape == targets.shape == (8, 16) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # next-token targets
    assert torch.equal(inputs[1, 0], targets[0, -1])  # two windows of one block follow each other
    text = loader.tokenizer().decode(inputs[0].tolist())
    assert any(word in text for word in ("stream", "shard", "token", "epoch"))
    with pytest.raises(ValueError, match="must divide the shards' block of 32"):
        StreamingTokenLoader(out, 12, 8)


def test_a_given_tokenizer_is_used_and_a_wide_vocabulary_takes_uint32(text_shards, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    source, out, _ = text_shards
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    wide = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    wide.pre_tokenizer = pre_tokenizers.Whitespace()
    wide.save(str(tmp_path / "tokenizer.json"))
    result = prepare_text(source, tmp_path / "out", tokenizer=tmp_path / "tokenizer.json", block=32, progress=False)
    shards = read_shards(result.out)
    assert shards.manifest["dtype"] == "uint32" and shards.manifest["vocab_size"] == 70_001
    with pytest.raises(FileNotFoundError, match="--tokenizer .* does not exist"):
        prepare_text(source, tmp_path / "out2", tokenizer=tmp_path / "missing.json", progress=False)


def test_token_blocks_are_stored_shuffled_so_a_short_run_samples_the_whole_corpus(tmp_path):
    """litdata shuffles within regions of a chunk: in the text's order, the first batches of an epoch came from a
    few documents (a rehearsal's short run trained on a seed-dependent corner of the corpus)."""
    source = tmp_path / "source"
    source.mkdir()
    for i in range(40):  # documents told apart by their words
        (source / f"doc{i:02d}.txt").write_text(" ".join([f"topic{i}"] * 200) + "\n")

    def first_documents(out: Path, **options) -> list:
        prepare_text(source, out, vocab_size=300, block=16, val_fraction=0.0, progress=False, **options)
        loader = StreamingTokenLoader(out, 16, 4, seed=0)
        tokenizer, seen = loader.tokenizer(), []
        for inputs, _ in itertools.islice(iter(loader), 10):
            seen += [tokenizer.decode(window.tolist()).split()[0] for window in inputs]
        return seen

    def spread(documents: list) -> int:
        numbers = [int(name.removeprefix("topic")) for name in documents]
        return max(numbers) - min(numbers)

    shuffled = first_documents(tmp_path / "shuffled")
    kept = first_documents(tmp_path / "kept", shuffle_blocks=False)
    assert len(set(shuffled)) >= 20 and spread(shuffled) >= 30, shuffled  # drawn from across the 40 documents
    assert spread(kept) <= 15, kept  # in the text's order: a run of neighbouring documents
    shards = read_shards(tmp_path / "shuffled")
    assert shards.manifest["options"]["shuffle_blocks"] is True
    assert shards.fingerprint != read_shards(tmp_path / "kept").fingerprint  # a resume across the two is refused


def test_token_epochs_resume_exactly_from_the_state(text_shards):
    _, out, _ = text_shards
    full = StreamingTokenLoader(out, 16, 4, seed=2)
    expected = list(full)
    first = StreamingTokenLoader(out, 16, 4, seed=2)
    iterator = iter(first)
    head = [next(iterator) for _ in range(2)]
    state = first.state_dict()
    second = StreamingTokenLoader(out, 16, 4, seed=2)
    second.load_state_dict(state)
    tail = list(second.iter_from(2))
    assert len(head + tail) == len(expected)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(head + tail, expected))


# -- through the Trainer --------------------------------------------------------------------------------------
def tiny_convnet(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, CLASSES))


class StopAt(Callback):
    """Stops the run at a batch (a checkpoint and a record are written, as after a kill's last save)."""

    def __init__(self, batch):
        self.batch, self.trainer = batch, None

    def run_event(self, event, state, logger):
        if event.value == "batch_end" and state.timestamp.batch == self.batch:
            self.trainer.stop()


def _fit(shards, folder, stop_at=None, resume=False, workers=0, subsample=1.0):
    from speedkit import Trainer

    loader = StreamingImageLoader(shards, 6, image_size=16, seed=5, num_workers=workers, subsample=subsample)
    loader.seen_ids = []
    callbacks = [StopAt(stop_at)] if stop_at else []
    trainer = Trainer(tiny_convnet(seed=9 if resume else 0), loader, max_duration="3ep", deterministic=True,
                      log_interval=1, device="cpu", run_dir=folder, run_name="r", autoresume=resume,
                      callbacks=callbacks)
    for cb in callbacks:
        cb.trainer = trainer
    return trainer.fit(), loader


def _losses(record):
    return [(s["batch"], s["loss"]) for s in record.steps]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_mid_epoch_resumes_exactly_through_the_trainer(image_shards, tmp_path, workers):
    _, out, _ = image_shards
    full, full_loader = _fit(out, tmp_path / "full", workers=workers)
    per_epoch = len(full_loader)
    stop_at = per_epoch + 2  # epoch 1, batch 2
    first, first_loader = _fit(out, tmp_path / "part", stop_at=stop_at, workers=workers)
    assert first.status == "stopped"
    resumed, second_loader = _fit(out, tmp_path / "part", resume=True, workers=workers)
    assert _losses(resumed) == _losses(full)
    assert resumed.notes["resumed_from"].endswith("latest.ckpt") and second_loader.resumed_at == (1, 2)
    # Epoch 1's samples: those the first run served after epoch 0, then those the resumed run served before epoch 2.
    size = full_loader.dataset_size
    before = first_loader.seen_ids[size:]
    after = second_loader.seen_ids[: size - len(before)]
    assert len(before) == 2 * 6 and sorted(before + after) == list(range(size))
    assert first_loader.seen_ids + second_loader.seen_ids == full_loader.seen_ids


def test_a_run_on_a_fraction_of_the_data_resumes_exactly_and_sees_each_sample_once_an_epoch(image_shards, tmp_path):
    """litdata's state of a subsampled epoch holds numpy integers; the checkpoint (loaded weights-only) takes it."""
    _, out, _ = image_shards
    full, full_loader = _fit(out, tmp_path / "full", subsample=0.5)
    per_epoch, size = len(full_loader), len(full_loader.seen_ids) // 3
    assert size < full_loader.dataset_size
    first, first_loader = _fit(out, tmp_path / "part", stop_at=per_epoch + 1, subsample=0.5)
    resumed, second_loader = _fit(out, tmp_path / "part", resume=True, subsample=0.5)
    assert first.status == "stopped" and second_loader.resumed_at == (1, 1)
    assert _losses(resumed) == _losses(full)
    seen = first_loader.seen_ids + second_loader.seen_ids
    assert seen == full_loader.seen_ids
    epochs = [seen[i * size:(i + 1) * size] for i in range(3)]
    assert all(sorted(epoch) == sorted(epochs[0]) == sorted(set(epoch)) for epoch in epochs)


def test_a_fraction_run_checkpointed_with_numpy_integers_in_litdatas_state_resumes(image_shards, tmp_path):
    """As the loaders wrote it before storing plain ints: the numpy number loads, an array still does not."""
    import numpy as np

    from speedkit.train.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint

    _, out, _ = image_shards
    full, full_loader = _fit(out, tmp_path / "full", subsample=0.5)
    _fit(out, tmp_path / "part", stop_at=len(full_loader) + 1, subsample=0.5)
    folder = tmp_path / "part" / "r" / "checkpoints"
    for path in folder.glob("*.ckpt"):
        payload = load_checkpoint(path)
        regions = payload["dataloader"]["litdata"]["dataset"]["region_of_interest"]
        payload["dataloader"]["litdata"]["dataset"]["region_of_interest"] = [(a, np.int64(b)) for a, b in regions]
        path.unlink()
        save_checkpoint(path, {k: v for k, v in payload.items() if k != "format_version"})
    resumed, loader = _fit(out, tmp_path / "part", resume=True, subsample=0.5)
    assert _losses(resumed) == _losses(full) and loader.resumed_at == (1, 1)
    assert not list(folder.glob("*.unusable"))
    save_checkpoint(tmp_path / "array.ckpt", {"dataloader": np.arange(3)})
    with pytest.raises(CheckpointError, match="will not unpickle"):
        load_checkpoint(tmp_path / "array.ckpt")


def test_a_streamed_run_makes_no_host_wait_between_logging_steps_across_epochs(image_shards, tmp_path):
    """Each epoch's new iterator draws its workers' seed with .item() on a CPU tensor: that waits on no device,
    so the sync counter must not call it a wait (it did, at every epoch start of every streamed run on a GPU)."""
    from speedkit import Trainer
    from speedkit.callbacks import SyncCounter

    _, out, _ = image_shards
    counter = SyncCounter()
    loader = StreamingImageLoader(out, 6, image_size=16, seed=5, num_workers=1)
    Trainer(tiny_convnet(), loader, max_duration="3ep", log_interval=100, device="cpu", run_dir=tmp_path,
            run_name="r", callbacks=[counter]).fit()
    report = counter.report()
    assert report["steps"] == 3 * len(loader) and report["waits_in_quiet_steps"] == 0, report


def test_resuming_a_run_on_shards_prepared_again_is_refused(image_shards, tmp_path):
    from speedkit import Trainer

    source, out, _ = image_shards
    _fit(out, tmp_path / "run", stop_at=3)
    other = tmp_path / "other"
    prepare_images(source, other, short_side=20, part_size=10, progress=False)
    # every setting as the first run had it, so the data is the one thing that differs
    trainer = Trainer(tiny_convnet(), StreamingImageLoader(other, 6, image_size=16, seed=5), max_duration="3ep",
                      deterministic=True, log_interval=1, device="cpu", run_dir=tmp_path / "run", run_name="r",
                      autoresume=True)
    with pytest.raises(ValueError, match="trained on other data"):
        trainer.fit()


class SizeSpy(Callback):
    """Records the image size of every training batch the model sees, and the loader's decode size."""

    def __init__(self):
        self.seen, self.decoded = [], []

    def run_event(self, event, state, logger):
        if event.value == "before_forward" and state.model.training:
            self.seen.append(state.batch[0].shape[-1])
            self.decoded.append(state.train_dataloader.image_size)


def test_progressive_resizing_makes_early_epochs_decode_small_and_resumes_exactly(image_shards, tmp_path):
    from speedkit import Trainer
    from speedkit.methods.progressive_resizing import ProgressiveResizing

    _, out, _ = image_shards

    def fit(folder, stop_at=None, resume=False):
        loader = StreamingImageLoader(out, 6, image_size=32, seed=5)
        spy, stop = SizeSpy(), [StopAt(stop_at)] if stop_at else []
        trainer = Trainer(tiny_convnet(), loader, max_duration="5ep", deterministic=True, log_interval=1,
                          device="cpu", run_dir=folder, run_name="r", autoresume=resume, callbacks=[spy, *stop],
                          methods=[ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.2)])
        for cb in stop:
            cb.trainer = trainer
        return trainer.fit(), spy, len(loader)

    full, spy, per_epoch = fit(tmp_path / "full")
    first_epoch, last_epoch = spy.decoded[per_epoch:2 * per_epoch], spy.decoded[-per_epoch:]
    assert spy.decoded[:per_epoch] == [32] * per_epoch  # epoch 0: before the method has asked
    assert max(first_epoch) < 32 and last_epoch == [32] * per_epoch  # early epochs decode small, the last at full
    assert all(seen <= decoded for seen, decoded in zip(spy.seen, spy.decoded))  # never upscaled in the step
    assert spy.seen == sorted(spy.seen) and spy.seen[0] < 32 == spy.seen[-1]
    fit(tmp_path / "part", stop_at=2 * per_epoch + 1)
    resumed, resumed_spy, _ = fit(tmp_path / "part", resume=True)
    assert _losses(resumed) == _losses(full)
    assert resumed_spy.decoded == spy.decoded[2 * per_epoch + 1:]


def test_token_windows_split_over_two_ranks_without_overlap(text_shards):
    _, out, _ = text_shards
    ranks = [StreamingTokenLoader(out, 16, 8, rank=r, world_size=2) for r in range(2)]
    seen = [_epoch_ids(loader) for loader in ranks]  # block ids
    assert ranks[0].local_batch_size == 4 and len(ranks[0]) == len(ranks[1])
    assert not set(seen[0]) & set(seen[1])
    blocks = read_shards(out).samples("train")
    assert blocks - 4 < len(set(seen[0]) | set(seen[1])) <= blocks  # at most a global batch's blocks dropped


def test_a_plain_loop_that_restores_the_state_and_iterates_continues_the_epoch(image_shards):
    """What a loop that owns its loader does (Lightning restores a stateful loader, then iterates it)."""
    _, out, _ = image_shards
    full = StreamingImageLoader(out, 5, image_size=16)
    full.seen_ids = []
    for _ in range(2):  # two epochs, by plain iteration
        for _ in full:
            pass
    first = StreamingImageLoader(out, 5, image_size=16)
    first.seen_ids = []
    for _ in first:  # epoch 0
        pass
    iterator = iter(first)  # epoch 1: three batches, then the process ends
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    second = StreamingImageLoader(out, 5, image_size=16)
    second.load_state_dict(state)
    second.seen_ids = []
    for _ in second:  # the rest of epoch 1
        pass
    assert second.epoch == 2 and first.seen_ids + second.seen_ids == full.seen_ids


@pytest.fixture(scope="module")
def textured_shards(tmp_path_factory):
    """Photographs' kind of content (smooth gradients and waves of varied sizes) rather than solid colours: a crop
    in the wrong place or a flip left out changes its pixels."""
    import numpy as np
    from PIL import Image

    base = tmp_path_factory.mktemp("textured")
    rng = np.random.default_rng(0)
    for c in range(2):
        (base / "source" / f"class{c}").mkdir(parents=True)
        for i in range(8):
            height, width = (int(v) for v in rng.integers(48, 120, size=2))
            y, x = np.mgrid[0:height, 0:width].astype(np.float32)
            period = rng.uniform(6, 14, size=3)
            channels = [127 + 100 * np.sin(x / period[0] + k) * np.cos(y / period[1] - k) + 20 * np.sin(y / period[2])
                        for k in range(3)]
            pixels = np.clip(np.stack(channels, -1), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(base / "source" / f"class{c}" / f"im{i}.jpg", quality=95)
    prepare_images(base / "source", base / "shards", short_side=64, progress=False)
    return base / "shards"


@pytest.mark.parametrize("split,workers", [("train", 0), ("val", 2)])
def test_decoding_on_the_device_gives_the_workers_pixels_to_jpeg_tolerance(textured_shards, split, workers):
    pytest.importorskip("torchvision")
    options = dict(split=split, image_size=24, seed=4, num_workers=workers)
    in_workers = StreamingImageLoader(textured_shards, 4, decode_on_device=False, **options)
    on_device = StreamingImageLoader(textured_shards, 4, decode_on_device=True, **options)  # decode_jpeg on CPU
    assert StreamingImageLoader(textured_shards, 4, **options).decode_on_device is False  # chosen on CUDA only
    from speedkit.data.streaming.loaders import _choose_device_decoding

    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # the choice itself, without a GPU to build a loader on
    assert _choose_device_decoding(None, cuda) and not _choose_device_decoding(False, cuda)
    assert not _choose_device_decoding(None, cpu) and _choose_device_decoding(True, cpu)
    data, lengths, *_ = next(iter(on_device.loader))  # the workers hand over the JPEG bytes, not pixels
    assert data.dtype == torch.uint8 and data.dim() == 1 and data.numel() == sum(lengths)
    assert bytes(data[:2].tolist()) == b"\xff\xd8"  # a JPEG's first marker
    in_workers.seen_ids, on_device.seen_ids = [], []
    pairs = list(zip(in_workers, on_device))
    assert in_workers.seen_ids == on_device.seen_ids and len(pairs) == len(in_workers)
    std = torch.tensor(in_workers.std).reshape(1, 3, 1, 1) * 255  # back to 0..255 pixel values
    for (expected, labels), (images, device_labels) in pairs:
        assert images.shape == expected.shape and torch.equal(labels, device_labels)
        difference = ((images - expected) * std).abs()
        assert difference.mean() < 4 and difference.max() < 64  # decoder and rounding differences only
