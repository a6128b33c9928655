"""Shard folders in an object store: ``--data s3://bucket/prefix``, the folder ``speedkit data prepare`` wrote,
uploaded as it is.

A real S3 protocol server runs in this process (moto's ThreadedMotoServer on 127.0.0.1, plain http); boto3 and
litdata reach it through AWS_ENDPOINT_URL, as they would a MinIO. Nothing leaves 127.0.0.1."""
from __future__ import annotations

import json
import shutil
import socket

import pytest
import torch

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from streaming_data import make_text_folder  # noqa: E402

from speedkit.data.streaming import ShardError, StreamingTokenLoader, prepare_text, read_shards  # noqa: E402
from speedkit.data.streaming import remote  # noqa: E402
from speedkit.data.streaming.remote import cache_folder  # noqa: E402

BUCKET = "speedkit-shards"
# reading a URL says once where its chunks are cached (test_speedkit_train_runs_on_the_url checks the line)
pytestmark = pytest.mark.filterwarnings("ignore:.*streaming the shards from the object store:UserWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The S3 server, the AWS environment that points at it (and at nothing else), and a tiny shard folder
    uploaded to s3://BUCKET/corpus: ``(url, local folder, client, MonkeyPatch)``."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    env = pytest.MonkeyPatch()
    base = tmp_path_factory.mktemp("remote")
    host, port = server.get_host_and_port()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.delenv(name, raising=False)
    env.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    env.setenv("AWS_ACCESS_KEY_ID", "testing")
    env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env.setenv("AWS_CONFIG_FILE", str(base / "no-aws-config"))
    env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(base / "no-aws-credentials"))
    env.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance-metadata address for credentials
    env.setenv("SPEEDKIT_SHARDS", str(base / "cache"))
    local = base / "shards"
    prepare_text(make_text_folder(base / "source"), local, vocab_size=300, block=32, progress=False)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    upload(client, local, "corpus")
    yield f"s3://{BUCKET}/corpus", local, client, env
    env.undo()
    server.stop()


def upload(client, folder, prefix: str) -> None:
    """``aws s3 sync FOLDER s3://BUCKET/PREFIX``: every file, as it is."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def _windows(loader) -> list:
    return [inputs for inputs, _ in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_from_the_url_yields_exactly_the_local_folders_samples(store, workers):
    url, local, _, _ = store
    shutil.rmtree(cache_folder(url), ignore_errors=True)  # each case downloads (in its worker processes)
    expected = _windows(StreamingTokenLoader(local, 16, 4, seed=2, num_workers=workers))
    remote = StreamingTokenLoader(url + "/", 16, 4, seed=2, num_workers=workers)  # a trailing slash: the same
    got = _windows(remote)
    assert len(got) == len(expected) > 10
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    cache = cache_folder(url)
    assert remote.shards.url == url and remote.shards.root == cache
    names = [sorted(p.name for p in (folder / "train").glob("*.bin")) for folder in (cache, local)]
    assert names[0] == names[1]
    assert not (cache / "val").exists() or not list((cache / "val").glob("*.bin"))  # only what was read is fetched
    # the same data: a run resumes across the two, and the fingerprint keeps other data out
    assert remote.fingerprint == read_shards(local).fingerprint
    assert remote.tokenizer().get_vocab_size() == 300  # the tokenizer, read from the store


def test_speedkit_train_runs_on_the_url(store, tmp_path, capsys):
    from speedkit.cli.main import main

    url, _, _, _ = store
    remote._ANNOUNCED.clear()  # said once a process: an earlier test read this URL
    with pytest.warns(UserWarning) as said:
        code = main(["train", "--task", "text-folder", "--data", url, "--model", "gpt-nano", "--duration", "2ba",
                     "--batch-size", "4", "--no-progress", "--run-dir", str(tmp_path / "runs")])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "completed" in out.out
    # where the chunks are cached, and how to move them (a `speedkit: warning:` line at the command line)
    assert any(f"{url}: streaming the shards from the object store at http://127.0.0.1" in str(w.message)
               and f"cached in {cache_folder(url)} (set SPEEDKIT_SHARDS" in str(w.message) for w in said)


def test_the_seed_and_folder_tasks_take_the_url(store):
    from speedkit.tasks import find_task
    from speedkit.tasks.task import DataRequest

    url, _, _, _ = store
    task = find_task("gpt2", url, sizes="cpu")
    assert url in task.summary and str(cache_folder(url)) in task.summary
    model = task.model("gpt-nano")
    inputs, _ = next(iter(task.train_data(DataRequest(batch_size=8, device=torch.device("cpu"), model=model))))
    # the shards' vocabulary (300) is the model's, its head padded to a multiple of 64 rows
    assert inputs.shape == (8, 32) and model.config.vocab_size == 300 and model(inputs).shape[-1] == 320
    with pytest.raises(ValueError, match=r"holds tokens shards; --task text-folder trains on them"):
        find_task("image-folder", url, stream=True)  # read from the store, then told what it holds


def test_a_partial_prepare_in_the_store_is_refused_unless_allowed(store):
    url, local, client, _ = store
    manifest = json.loads((local / "speedkit-shards.json").read_text())
    manifest.update(complete=False, stopped="out of disk")
    upload(client, local, "partial")
    client.put_object(Bucket=BUCKET, Key="partial/speedkit-shards.json", Body=json.dumps(manifest).encode())
    with pytest.raises(ShardError, match=r"s3://speedkit-shards/partial holds a prepare that did not finish"):
        StreamingTokenLoader(f"s3://{BUCKET}/partial", 16, 4, allow_partial=False)
    assert not read_shards(f"s3://{BUCKET}/partial").complete  # allowed: used, and said to be partial


def test_an_altered_index_or_a_short_chunk_in_the_store_is_refused_naming_it(store):
    url, local, client, _ = store
    upload(client, local, "altered")
    index = json.loads((local / "train" / "index.json").read_text())
    index["chunks"][0]["chunk_bytes"] += 8
    client.put_object(Bucket=BUCKET, Key="altered/train/index.json", Body=json.dumps(index).encode())
    with pytest.raises(ShardError, match=r"altered: train/chunk-0-0.bin holds \d+ bytes but its index says"):
        StreamingTokenLoader(f"s3://{BUCKET}/altered", 16, 4)
    index["chunks"] = index["chunks"][1:]
    client.put_object(Bucket=BUCKET, Key="altered/train/index.json", Body=json.dumps(index).encode())
    with pytest.raises(ShardError, match=r"lists \d+ chunks but speedkit-shards.json says"):
        read_shards(f"s3://{BUCKET}/altered")


def test_a_resume_on_other_data_in_the_store_is_refused(store, tmp_path):
    url, _, client, _ = store
    other = tmp_path / "other"
    prepare_text(make_text_folder(tmp_path / "source", files=4), other, vocab_size=280, block=32, progress=False)
    upload(client, other, "other")
    first = StreamingTokenLoader(url, 16, 4, seed=2)
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    with pytest.raises(ValueError, match=r"trained on other data.*s3://speedkit-shards/corpus"):
        StreamingTokenLoader(f"s3://{BUCKET}/other", 16, 4, seed=2).load_state_dict(state)


def test_shards_uploaded_again_replace_the_cached_chunks(store, tmp_path):
    _, local, client, _ = store
    upload(client, local, "again")
    url = f"s3://{BUCKET}/again"
    _windows(StreamingTokenLoader(url, 16, 4))
    stale = cache_folder(url) / "train" / "chunk-0-0.bin"
    assert stale.is_file()
    other = tmp_path / "other"
    prepare_text(make_text_folder(tmp_path / "source", files=4), other, vocab_size=280, block=32, progress=False)
    for key in [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="again/")["Contents"]]:
        client.delete_object(Bucket=BUCKET, Key=key)
    upload(client, other, "again")
    with pytest.warns(UserWarning, match="changed since they were cached"):
        loader = StreamingTokenLoader(url, 16, 4)
    assert all(torch.equal(a, b) for a, b in zip(_windows(loader), _windows(StreamingTokenLoader(other, 16, 4))))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_urls_and_environments_are_one_clear_error_naming_the_url_and_the_fix(store, monkeypatch):
    url, _, _, _ = store
    with pytest.raises(ShardError, match=r"s3://speedkit-shards/nothing-here: nothing is stored under this prefix"
                                         r".*aws s3 sync DIR s3://speedkit-shards/nothing-here"):
        read_shards(f"s3://{BUCKET}/nothing-here")
    with pytest.raises(ShardError, match=r"s3://no-such-bucket/corpus: the bucket no-such-bucket does not exist"):
        read_shards("s3://no-such-bucket/corpus")
    with pytest.raises(ShardError, match=r"ftp://host/shards.*from a local folder or from s3:// URLs.*not ftp://"):
        read_shards("ftp://host/shards")
    with monkeypatch.context() as m:
        m.delenv("AWS_ACCESS_KEY_ID")
        m.delenv("AWS_SECRET_ACCESS_KEY")
        with pytest.raises(ShardError, match=rf"{url}: no credentials.*set AWS_ACCESS_KEY_ID"):
            read_shards(url)
    with monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
        with pytest.raises(ShardError, match=rf"{url}: cannot reach the object store at http://127.0.0.1.*"
                                             r"check AWS_ENDPOINT_URL"):
            read_shards(url)


def test_the_cli_says_what_is_wrong_with_a_url_and_exit_status_2(store, tmp_path, capsys):
    from speedkit.cli.main import main

    url, local, _, _ = store
    assert main(["train", "--task", "gpt2", "--data", f"s3://{BUCKET}/missing", "--run-dir", str(tmp_path)]) == 2
    assert "s3://speedkit-shards/missing: nothing is stored under this prefix" in capsys.readouterr().err
    assert main(["data", "prepare", str(local), "--out", f"s3://{BUCKET}/new"]) == 2
    err = capsys.readouterr().err
    assert "writes a local folder" in err and f"aws s3 sync DIR s3://{BUCKET}/new" in err
    assert main(["data", "prepare", url, "--out", str(tmp_path / "shards")]) == 2
    assert "reads a local folder; copy the source to a local disk first" in capsys.readouterr().err
    assert main(["train", "--task", "gpt2", "--data", "ftp://host/shards", "--run-dir", str(tmp_path)]) == 2
    assert "from s3:// URLs" in capsys.readouterr().err
    assert main(["data", "info", url, "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{url}: tokens shards, complete") and "verified: every chunk as written" in out


def test_data_info_verify_finds_a_chunk_altered_in_the_store(store, capsys):
    from speedkit.cli.main import main

    _, local, client, _ = store
    upload(client, local, "flipped")
    chunk = (local / "train" / "chunk-0-0.bin").read_bytes()
    client.put_object(Bucket=BUCKET, Key="flipped/train/chunk-0-0.bin", Body=bytes([chunk[0] ^ 1]) + chunk[1:])
    assert main(["data", "info", f"s3://{BUCKET}/flipped", "--verify"]) == 1
    assert "flipped/train/chunk-0-0.bin was altered since it was written" in capsys.readouterr().err
    shutil.rmtree(cache_folder(f"s3://{BUCKET}/flipped"), ignore_errors=True)
