"""Checkpoints at fsspec URLs: written through fsspec's in-memory file system (a stand-in for s3:// or gs://) and
a file:// URL, resumed on "another machine" (a fresh run folder) from the remote copies alone, and a remote file
cut off mid-upload passed over by autoresume, as speedkit.train.checkpoint.storage says."""
from __future__ import annotations

import uuid

import fsspec  # a dependency of torch itself
import pytest
import torch
from helpers import toy_loaders, toy_model

from speedkit import Trainer
from speedkit.train.checkpoint import LATEST, CheckpointError, load_checkpoint


@pytest.fixture
def bucket():
    """A fresh folder in fsspec's process-wide in-memory file system, removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/speedkit-test-{uuid.uuid4().hex[:8]}"
    yield fs, root, f"memory://{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)


def fit(run_dir, save_folder, duration="2ep", **kwargs):
    train, test = toy_loaders()  # 8 batches an epoch
    trainer = Trainer(toy_model(), train, eval_dataloader=test, max_duration=duration, save_interval="4ba",
                      keep_checkpoints=2, device="cpu", run_dir=run_dir, run_name="run", save_folder=save_folder,
                      **kwargs)
    return trainer, trainer.fit()


def names(fs, root) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))


def test_a_memory_url_gets_the_newest_checkpoints_and_latest_and_keeps_a_local_copy(tmp_path, bucket):
    fs, root, url = bucket
    trainer, record = fit(tmp_path, url)
    assert names(fs, root) == ["ba000000012.ckpt", "ba000000016.ckpt", LATEST]  # older ones pruned remotely too
    assert fs.cat_file(f"{root}/{LATEST}") == fs.cat_file(f"{root}/ba000000016.ckpt")
    assert record.notes["remote_checkpoints"] == url

    local = tmp_path / "run" / "checkpoints"  # the staging folder: what was uploaded, byte for byte
    assert fs.cat_file(f"{root}/ba000000016.ckpt") == (local / "ba000000016.ckpt").read_bytes()
    payload = load_checkpoint(local / LATEST)  # verifies the checksum
    for name, tensor in trainer.state.model.state_dict().items():
        torch.testing.assert_close(payload["model"][name], tensor, rtol=0, atol=0)


def test_autoresume_on_a_fresh_machine_continues_from_the_remote_checkpoints(tmp_path, bucket):
    fs, root, url = bucket
    _, first = fit(tmp_path / "first-machine", url, duration="1ep")
    trainer, record = fit(tmp_path / "second-machine", url, duration="2ep", autoresume=True)
    assert record.notes["resumed_from"] == f"checkpoints/{LATEST}"  # the staging folder, in the run folder
    assert record.run_id == first.run_id and record.steps[:len(first.steps)] == first.steps  # the same run, on
    assert len(record.steps) > len(first.steps) and trainer.state.timestamp.batch == 16
    assert "ba000000016.ckpt" in names(fs, root)


def test_a_remote_latest_cut_off_mid_upload_is_passed_over_for_the_newest_complete_one(tmp_path, bucket):
    fs, root, url = bucket
    fit(tmp_path / "first", url, duration="1ep")  # remote: ba4, ba8, latest (= ba8)
    complete = fs.cat_file(f"{root}/{LATEST}")
    fs.pipe_file(f"{root}/{LATEST}", complete[: len(complete) // 2])  # an upload a crash cut off
    with pytest.warns(UserWarning, match="passed over"):
        trainer, record = fit(tmp_path / "second", url, duration="2ep", autoresume=True)
    assert record.notes["resumed_from"].endswith("ba000000008.ckpt")
    assert "checksum" in record.notes["resume_passed_over"][0]["reason"]


def test_load_path_may_be_a_url_and_a_missing_one_says_so(tmp_path, bucket):
    fs, root, url = bucket
    fit(tmp_path / "first", url, duration="1ep")
    _, record = fit(tmp_path / "second", None, duration="2ep", load_path=f"{url}/ba000000004.ckpt")
    assert record.notes["resumed_from"] == "checkpoints/ba000000004.ckpt"
    with pytest.raises(FileNotFoundError, match="no checkpoint at memory://.*ba000000099.ckpt"):
        fit(tmp_path / "third", None, load_path=f"{url}/ba000000099.ckpt")


def test_a_file_url_is_a_local_folder_with_the_local_guarantees(tmp_path):
    folder = tmp_path / "ckpts"
    fit(tmp_path, f"file://{folder}")
    assert sorted(p.name for p in folder.iterdir()) == ["ba000000012.ckpt", "ba000000016.ckpt", LATEST]
    assert (folder / LATEST).samefile(folder / "ba000000016.ckpt")  # the hard link, as for a plain path
    assert not (tmp_path / "run" / "checkpoints").exists()  # no staging copy: it is local already


@pytest.mark.parametrize("url, message", [
    ("nosuchproto://x", "'nosuchproto' is not a storage protocol fsspec knows"),
    ("://x", "'' is not a storage protocol"),
    ("zip://x", "fsspec cannot open it .*check the URL"),  # known to fsspec, but no archive there
])
def test_a_url_fsspec_cannot_open_is_refused_when_the_trainer_is_made(tmp_path, url, message):
    train, _ = toy_loaders()
    with pytest.raises(ValueError, match=f"save_folder '{url}': {message}"):
        Trainer(toy_model(), train, max_duration="1ba", device="cpu", run_dir=tmp_path, save_folder=url)


def test_a_corrupt_remote_checkpoint_named_as_load_path_is_refused(tmp_path, bucket):
    fs, root, url = bucket
    fs.pipe_file(f"{root}/ba000000001.ckpt", b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a speedkit checkpoint"):
        fit(tmp_path, None, load_path=f"{url}/ba000000001.ckpt")
