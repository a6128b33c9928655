"""``speedkit data prepare`` and ``speedkit data info`` as a user runs them, and a streamed run killed right after
a checkpoint and continued with ``--autoresume`` through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")

from streaming_data import make_image_folder, make_text_folder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def speedkit(*args, cwd: Path, script=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "support"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, *([str(script)] if script else ["-m", "speedkit"]), *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def cli(capsys, *args):
    """``speedkit ARGS`` in this process (the parser and the exit code as the command has them): (code, out, err)."""
    from speedkit.cli.main import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_prepare_images_then_info_then_a_rerun_that_has_nothing_left_to_do(tmp_path, capsys):
    source = make_image_folder(tmp_path / "source", per_class=6)
    code, out, err = cli(capsys, "data", "prepare", source, "--out", tmp_path / "shards", "--short-side", 32,
                         "--workers", 2)
    assert code == 0, err
    assert "images shards complete (train 15, val 3)" in out
    assert f"speedkit train --task image-folder --data {tmp_path / 'shards'}" in out
    code, out, _ = cli(capsys, "data", "info", tmp_path / "shards", "--verify")
    assert code == 0 and "3 classes, short side 32" in out and "verified: every chunk as written" in out
    chunk = sorted((tmp_path / "shards" / "train").glob("chunk-*.bin"))[0]
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte flipped: only the checksum sees it
    chunk.write_bytes(bytes(data))
    code, _, err = cli(capsys, "data", "info", tmp_path / "shards", "--verify")
    assert code == 1 and f"{chunk.name} was altered" in err
    chunk.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))
    code, out, _ = cli(capsys, "data", "prepare", source, "--out", tmp_path / "shards", "--short-side", 32)
    assert code == 0 and "complete (train 15, val 3)" in out


def test_prepare_text_trains_a_tokenizer_and_saves_it_beside_the_shards(tmp_path):
    """As a user runs it: a new process, nothing imported before."""
    source = make_text_folder(tmp_path / "corpus")
    done = speedkit("data", "prepare", source, "--out", tmp_path / "tokens", "--vocab-size", 300, "--block", 32,
                    "--workers", 0, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tokens shards complete" in done.stdout and (tmp_path / "tokens" / "tokenizer.json").is_file()
    manifest = json.loads((tmp_path / "tokens" / "speedkit-shards.json").read_text())
    assert manifest["vocab_size"] == 300 and manifest["dtype"] == "uint16" and manifest["complete"]


def test_bad_input_exits_2_naming_the_file_and_the_fix(tmp_path, capsys):
    source = make_image_folder(tmp_path / "source", per_class=4)
    (source / "class1" / "im1.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    code, _, err = cli(capsys, "data", "prepare", source, "--out", tmp_path / "out", "--workers", 0)
    assert code == 2 and "im1.jpg" in err and "--skip-bad" in err and "Traceback" not in err
    code, out, _ = cli(capsys, "data", "prepare", source, "--out", tmp_path / "out", "--skip-bad", "--workers", 0)
    assert code == 0 and "1 unreadable file(s) left out" in out
    code, _, err = cli(capsys, "data", "prepare", tmp_path / "nowhere", "--out", tmp_path / "x")
    assert code == 2 and "is not a folder" in err
    code, _, err = cli(capsys, "data", "info", source)
    assert code == 2 and "speedkit data prepare" in err


KILL_AFTER_SAVE = """
import os, sys
import speedkit.train.checkpoint.checkpointer as checkpointer
real, saves = checkpointer.Checkpointer.save, []
def save(self):
    path = real(self)
    saves.append(path)
    if len(saves) == int(os.environ["KILL_AFTER_SAVES"]):
        os._exit(137)  # as SIGKILL: no handler runs, nothing more is written
    return path
checkpointer.Checkpointer.save = save
from speedkit.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_streamed_run_killed_after_a_checkpoint_resumes_exactly_with_autoresume(tmp_path):
    source = make_image_folder(tmp_path / "source", per_class=10)
    assert speedkit("data", "prepare", source, "--out", tmp_path / "shards", "--short-side", 24,
                    cwd=tmp_path).returncode == 0
    script = tmp_path / "killed_speedkit.py"
    script.write_text(KILL_AFTER_SAVE)
    run = ["train", "--task", "image-folder", "--data", tmp_path / "shards", "--image-size", 16, "--recipe",
           "baseline", "--batch-size", 8, "--duration", "2ep", "--device", "cpu", "--run-dir", tmp_path / "runs",
           "--save-interval", "1ba"]
    full = speedkit(*run, "--run-name", "full", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    os.environ["KILL_AFTER_SAVES"] = "5"  # 27 training images, 4 batches an epoch: killed after epoch 1, batch 1
    try:
        killed = speedkit(*run, "--run-name", "part", cwd=tmp_path, script=script)
    finally:
        del os.environ["KILL_AFTER_SAVES"]
    assert killed.returncode == 137
    resumed = speedkit(*run, "--run-name", "part", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    records = [json.loads((tmp_path / "runs" / name / "record.json").read_text()) for name in ("full", "part")]
    assert [(s["batch"], s["loss"]) for s in records[1]["steps"]] == [(s["batch"], s["loss"]) for s in records[0]["steps"]]
    assert records[1]["notes"]["resumed_from"]


def _advised(text: str, command: str = "speedkit data prepare") -> list:
    """The arguments of the command a message advises (between backquotes), for ``cli``."""
    import re
    import shlex

    found = re.search(rf"`({command} [^`]+)`", text)
    assert found, text
    return shlex.split(found.group(1))[1:]


@pytest.mark.parametrize("damage", ["cut short", "deleted"])
def test_a_damaged_chunk_is_written_again_by_the_command_its_refusal_names(tmp_path, capsys, damage):
    source = make_image_folder(tmp_path / "source", per_class=6)
    shards = tmp_path / "shards"
    assert cli(capsys, "data", "prepare", source, "--out", shards, "--short-side", 24, "--workers", 0)[0] == 0
    chunk = sorted((shards / "train").glob("chunk-*.bin"))[0]
    written = chunk.read_bytes()
    chunk.write_bytes(written[:50]) if damage == "cut short" else chunk.unlink()
    code, _, err = cli(capsys, "data", "info", shards)
    assert code == 2 and chunk.name in err
    code, out, err = cli(capsys, *_advised(err))
    assert code == 0, err
    assert "1 part(s) done before had chunks missing or cut short since, and were written again: train part 0" in out
    assert "continued the prepare that was there: 1 of 2 parts kept" in out
    assert chunk.read_bytes() == written
    code, out, _ = cli(capsys, "data", "info", shards, "--verify")
    assert code == 0 and "verified: every chunk as written" in out
    from speedkit.data.streaming import StreamingImageLoader

    loader = StreamingImageLoader(shards, 5, image_size=16)
    loader.seen_ids = []
    list(loader)
    assert sorted(loader.seen_ids) == list(range(15))


def test_chunk_bytes_altered_in_place_stop_a_run_in_one_line_and_the_advised_command_redoes_them(tmp_path, capsys):
    source = make_image_folder(tmp_path / "source", per_class=6)
    shards = tmp_path / "shards"
    assert cli(capsys, "data", "prepare", source, "--out", shards, "--short-side", 24, "--workers", 0)[0] == 0
    chunk = sorted((shards / "train").glob("chunk-*.bin"))[0]
    written = chunk.read_bytes()
    chunk.write_bytes(written[:6] + bytes([written[6] ^ 0xFF]) + written[7:])  # an item's offset, the same size
    run = ["train", "--task", "image-folder", "--data", shards, "--image-size", 16, "--recipe", "baseline",
           "--batch-size", 5, "--duration", "1ep", "--device", "cpu", "--run-dir", tmp_path / "runs",
           "--num-workers", 0]
    code, _, err = cli(capsys, *run, "--run-name", "first")
    assert code == 2 and f"{chunk.name}: a sample cannot be read from it" in err and "Traceback" not in err
    assert f"speedkit data info {shards} --verify" in err
    code, out, err = cli(capsys, "data", "info", shards, "--verify")
    assert code == 1 and f"{chunk.name} was altered" in err
    code, out, err = cli(capsys, *_advised(err))
    assert code == 0 and "were written again: train part 0" in out and chunk.read_bytes() == written
    assert cli(capsys, *run, "--run-name", "second")[0] == 0


def test_prepare_says_what_it_left_out_and_refuses_an_out_inside_its_source(tmp_path, capsys):
    source = make_image_folder(tmp_path / "source", per_class=4)
    (source / "class1" / "notes.txt").write_text("where these came from")
    code, out, err = cli(capsys, "data", "prepare", source, "--out", tmp_path / "shards", "--workers", 0)
    assert code == 0, err
    assert "1 file(s) in the class folders are not images" in out and "class1/notes.txt" in out
    code, _, err = cli(capsys, "data", "prepare", source, "--out", source / "shards", "--workers", 0)
    assert code == 2 and f"--out {source / 'shards'} is inside the source folder {source}" in err
    assert not (source / "shards").exists()
