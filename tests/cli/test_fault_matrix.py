"""The fault matrix (issue 42): ``speedkit train``, ``export`` and ``tune`` as real processes, hit by each fault at
each moment it can land, and what must hold after: the same command continued ends with the record and weights
of a run never interrupted, or the command is refused with exit 2, one line naming the path or flag and the
fix, and nothing of the user's touched.

                        before training  mid-epoch  during evaluation  at the target  after the end
  kill -9                      x             x             x                 x              x
  SIGTERM / SIGINT / SIGHUP                  x             x
  kill during a save                         x
  kill after the final save                                                  x              x
  full disk (tmpfs)                          x                                              x (export)
  read-only folder (bind mount)  x                                                          x (resume, export)
  reused name, concurrent name   x                                                          x
  changed flag (every field)                                                                x (+ record.json unreadable)

Faults are injected by tests/support/fault_cli.py (marks, sleeps, a kill after a given checkpoint write). The
uninterrupted runs are shared per module. Most cases start processes: they are marked ``slow``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli_child import REPO

from speedkit.cli.main import main
from speedkit.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.prerequisite("fashion-mnist")

SUPPORT = REPO / "tests" / "support"
FAULT_CLI = SUPPORT / "fault_cli.py"
# 600 training images in batches of 32 (19 an epoch), 200 test images; 12 batches, evaluated every 4 and
# checkpointed every 3: every moment of the matrix happens within a few seconds of training.
SMALL = ["--data-fraction", "0.01", "--eval-fraction", "0.02", "--batch-size", "32", "--no-progress"]
RUN = ["--duration", "12ba", "--save-interval", "3ba", "--eval-interval", "4ba", *SMALL]
EXIT = {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGHUP: 129}


# -- helpers ------------------------------------------------------------------------------------------
def env(**faults) -> dict:
    path = [str(REPO), str(SUPPORT), str(REPO / "tests" / "tasks"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1",
            **{f"SPEEDKIT_TEST_{k.upper()}": str(v) for k, v in faults.items()}}


def speedkit(*args: str, cwd: Path, wait: bool = True, **faults):
    """``speedkit ARGS`` in ``cwd`` through fault_cli.py: a CompletedProcess, or with ``wait=False`` a Popen."""
    command = [sys.executable, str(FAULT_CLI), *args]
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=env(**faults), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(command, cwd=cwd, env=env(**faults), capture_output=True, text=True, timeout=600)


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {process.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, err


def record(folder: Path) -> dict:
    return json.loads((folder / "record.json").read_text())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` and its bytes' digest: "nothing touched" compares two of these."""
    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def weights(folder: Path) -> dict:
    return load_checkpoint(folder / "checkpoints" / "latest.ckpt")["model"]


def assert_same_run(folder: Path, reference: Path, status: str = "completed") -> None:
    """The run in ``folder`` ended as the uninterrupted ``reference`` did: status, every logged loss, every
    evaluation, the final metrics, and every weight bit for bit."""
    a, b = record(reference), record(folder)
    assert b["status"] == a["status"] == status, (a["status"], b["status"], b.get("error"))
    assert [(s["batch"], s["loss"]) for s in b["steps"]] == [(s["batch"], s["loss"]) for s in a["steps"]]
    strip = lambda evals: [{k: v for k, v in e.items() if k.startswith("eval/") or k == "batch"} for e in evals]
    assert strip(b["evals"]) == strip(a["evals"])
    assert b["final_metrics"] == a["final_metrics"] and b["final_metrics"]
    wa, wb = weights(reference), weights(folder)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not (folder / "run.lock").exists()


def one_line_refusal(result, *phrases: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr
    line = [ln for ln in result.stderr.strip().splitlines() if ln.startswith("speedkit: error")]
    assert line, result.stderr
    for phrase in phrases:
        assert phrase in line[-1], (phrase, line[-1])


@contextlib.contextmanager
def mounted(kind: str, folder: Path, size: str = "4m"):
    """``folder`` as a small tmpfs (a disk that fills) or bind-mounted read-only over itself; skipped where this
    process may not mount (not root, no CAP_SYS_ADMIN)."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    else:
        command = ["mount", "--bind", str(folder), str(folder)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({done.stderr.strip()}): run the fault matrix as root")
    try:
        if kind == "readonly":
            done = subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot remount read-only here ({done.stderr.strip()})")
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def copy_run(run: Path, tmp_path: Path, name: str | None = None) -> Path:
    target = tmp_path / "runs" / (name or run.name)
    shutil.copytree(run, target, ignore=shutil.ignore_patterns("run.lock"))
    return target


# -- the uninterrupted runs ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """``speedkit train RUN`` never interrupted: what every continued run must end equal to."""
    cwd = tmp_path_factory.mktemp("reference")
    result = speedkit("train", *RUN, "--run-name", "ref", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return cwd / "runs" / "ref"


@pytest.fixture(scope="module")
def target_run(tmp_path_factory, reference) -> tuple[list[str], Path]:
    """A ``--stop-at-target`` run whose target is first reached at the evaluation after batch 8 (the reference's
    accuracy there), never interrupted: its arguments and folder."""
    evals = {e["batch"]: e["eval/accuracy"] for e in record(reference)["evals"]}
    if not evals[4] < evals[8]:
        pytest.skip(f"this run's accuracy did not rise from batch 4 to 8 ({evals}); no target to place at 8")
    args = [*RUN, "--save-interval", "4ba", "--stop-at-target", "--target", repr(evals[8])]
    cwd = tmp_path_factory.mktemp("target")
    result = speedkit("train", *args, "--run-name", "t", cwd=cwd)
    assert result.returncode == 0, result.stderr
    folder = cwd / "runs" / "t"
    assert record(folder)["status"] == "target_reached" and record(folder)["evals"][-1]["batch"] == 8
    return args, folder


# -- train: signals at each moment ---------------------------------------------------------------------
MOMENTS = {  # moment: (faults slowing the run there, the mark to wait for)
    "mid-epoch": ({"batch_sleep": 0.3}, "batch-5"),
    "during evaluation": ({"eval_sleep": 4, "eval_sleep_at": 8}, "eval-8"),
}


@pytest.mark.slow
@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_signal_then_the_same_command_with_autoresume_ends_equal_to_an_uninterrupted_run(
        reference, tmp_path, sig, moment):
    faults, mark = MOMENTS[moment]
    marks = tmp_path / "marks"
    process = speedkit("train", *RUN, "--run-name", "r", cwd=tmp_path, wait=False, marks=marks, **faults)
    wait_for(lambda: (marks / mark).exists(), process, mark)
    process.send_signal(sig)
    code, err = finish(process)
    assert code == EXIT[sig], err[-3000:]
    run = tmp_path / "runs" / "r"
    if sig is not signal.SIGKILL:
        assert record(run)["status"] in ("interrupted", "terminated")
        assert "Traceback" not in err
    if sig is signal.SIGINT:
        assert "resume with: speedkit train" in err and "--autoresume" in err
    resumed = speedkit("train", *RUN, "--run-name", "r", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(run, reference)


@pytest.mark.slow
def test_a_kill_before_training_then_autoresume_starts_it_again_and_ends_equal(reference, tmp_path):
    process = speedkit("train", *RUN, "--run-name", "r", cwd=tmp_path, wait=False, batch_sleep=0.3)
    wait_for(lambda: (tmp_path / "runs" / "r" / "run.lock").exists(), process, "the run's lock")
    process.send_signal(signal.SIGKILL)
    finish(process)
    assert not list((tmp_path / "runs" / "r").glob("checkpoints/*.ckpt"))  # nothing to continue from
    resumed = speedkit("train", *RUN, "--run-name", "r", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp_path / "runs" / "r", reference)


@pytest.mark.slow
def test_a_kill_during_a_save_then_autoresume_ends_equal(reference, tmp_path):
    process = speedkit("train", *RUN, "--run-name", "r", cwd=tmp_path, wait=False, slow_save=2)
    checkpoints = tmp_path / "runs" / "r" / "checkpoints"
    partial = lambda: [p for p in checkpoints.glob(".ba000000006.ckpt.*.tmp") if p.stat().st_size > 0]
    wait_for(lambda: checkpoints.is_dir() and partial(), process, "the half-written batch-6 checkpoint")
    process.send_signal(signal.SIGKILL)
    finish(process)
    assert not (checkpoints / "ba000000006.ckpt").exists()
    resumed = speedkit("train", *RUN, "--run-name", "r", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp_path / "runs" / "r", reference)
    assert not list(checkpoints.glob(".*.tmp"))


# -- train: after the end and at the target ------------------------------------------------------------
@pytest.mark.slow
def test_a_kill_after_the_final_save_then_autoresume_leaves_the_run_as_it_ended(reference, tmp_path):
    killed = speedkit("train", *RUN, "--run-name", "r", cwd=tmp_path, kill_after="final")
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "runs" / "r"
    resumed = speedkit("train", *RUN, "--run-name", "r", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "had already ended" in resumed.stderr
    assert_same_run(run, reference)
    # Restarted again and again (a job controller), it stays exactly as it is.
    before = snapshot(run)
    again = speedkit("train", *RUN, "--run-name", "r", "--autoresume", cwd=tmp_path)
    assert again.returncode == 0 and "had already ended" in again.stderr
    assert snapshot(run) == before


def test_autoresume_of_a_finished_run_trains_nothing_and_changes_nothing(reference, tmp_path, capsys, monkeypatch):
    run = copy_run(reference, tmp_path)
    before = snapshot(run)
    monkeypatch.chdir(tmp_path)
    assert main(["train", *RUN, "--run-name", "ref", "--autoresume"]) == 0
    err = capsys.readouterr().err
    assert "had already ended" in err
    assert snapshot(run) == before  # final_metrics and all: the record is the one the run ended with


@pytest.mark.slow
@pytest.mark.parametrize("when", ["target", "final"])
def test_a_kill_at_the_target_then_autoresume_ends_at_the_target_and_keeps_its_checkpoint(target_run, tmp_path, when):
    args, uninterrupted = target_run
    killed = speedkit("train", *args, "--run-name", "t", cwd=tmp_path, kill_after=when)
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "runs" / "t"
    resumed = speedkit("train", *args, "--run-name", "t", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(run, uninterrupted, status="target_reached")
    assert record(run)["evals"][-1]["batch"] == 8  # not one batch past the target
    assert load_checkpoint(run / "checkpoints" / "latest.ckpt")["timestamp"]["batch"] == 8
    assert (run / "checkpoints" / "ba000000008.ckpt").exists()
    if when == "final":
        assert "had already ended" in resumed.stderr


# -- train: the disk ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_naming_the_path_and_autoresume_continues_once_there_is_room(
        reference, tmp_path):
    disk = tmp_path / "disk"
    # Room for one checkpoint and a half (each is about 2.4 MB): the second save fills the disk.
    with mounted("tmpfs", disk, size="4m"):
        full = speedkit("train", *RUN, "--run-dir", str(disk), "--run-name", "r", cwd=tmp_path)
        one_line_refusal(full, "No space left on device", str(disk / "r"), "--autoresume")
        assert "checkpoint" in full.stderr
        assert not list((disk / "r" / "checkpoints").glob(".*.tmp"))  # no half-written file left taking room
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        resumed = speedkit("train", *RUN, "--run-dir", str(disk), "--run-name", "r", "--autoresume", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        assert_same_run(disk / "r", reference)


@pytest.mark.slow
def test_a_read_only_run_dir_is_refused_in_one_line_and_nothing_is_written(reference, tmp_path):
    runs = tmp_path / "runs"
    copy_run(reference, tmp_path)
    before = snapshot(runs)
    with mounted("readonly", runs):
        fresh = speedkit("train", *RUN, "--run-name", "new", cwd=tmp_path)
        one_line_refusal(fresh, "Read-only file system", "runs/new", "--run-dir")
        resumed = speedkit("train", *RUN, "--run-name", "ref", "--autoresume", cwd=tmp_path)
        # the run's checkpoints are kept: the advice makes the folder writable or copies it, never --overwrite
        one_line_refusal(resumed, "Read-only file system", "runs/ref is as it was", "make runs/ref writable",
                         "cp -r runs/ref DIR/ref", "--run-name ref --autoresume --run-dir DIR")
        assert "--overwrite" not in resumed.stderr and "Traceback" not in resumed.stderr, resumed.stderr
        longer = speedkit("train", *RUN, "--duration", "14ba", "--extend-duration", "--run-name", "ref",
                          "--autoresume", cwd=tmp_path)
        one_line_refusal(longer, "Read-only file system", "checkpoint runs/ref/checkpoints/latest.ckpt is intact")
        assert "--overwrite" not in longer.stderr, longer.stderr
        exported = speedkit("export", str(runs / "ref"), cwd=tmp_path)
        one_line_refusal(exported, "Read-only file system", "model.safetensors", "--out")
    assert snapshot(runs) == before


# -- train: the name ----------------------------------------------------------------------------------
def test_a_reused_name_is_refused_and_the_earlier_run_is_untouched(reference, tmp_path, capsys, monkeypatch):
    run = copy_run(reference, tmp_path)
    before = snapshot(run)
    monkeypatch.chdir(tmp_path)
    assert main(["train", *RUN, "--run-name", "ref"]) == 2
    assert "already holds a run that ended completed" in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.slow
def test_one_name_at_once_one_trains_the_other_is_refused(reference, tmp_path):
    runs = [speedkit("train", *RUN, "--run-name", "twice", cwd=tmp_path, wait=False, batch_sleep=0.05)
            for _ in range(2)]
    outcomes = [finish(p) for p in runs]
    assert sorted(code for code, _ in outcomes) == [0, 2], outcomes
    assert_same_run(tmp_path / "runs" / "twice", reference)


def test_overwrite_deletes_only_its_own_run_and_nested_runs_are_refused(reference, tmp_path, capsys, monkeypatch):
    run = copy_run(reference, tmp_path, name="sweep")
    (run / "notes.ipynb").write_text("{}")
    (run / "model.safetensors").write_bytes(b"exported")
    (run / "plots").mkdir()
    (run / "plots" / "loss.png").write_bytes(b"png")
    monkeypatch.chdir(tmp_path)
    # A run inside another run's folder, or around one, is refused before anything is written.
    assert main(["train", *RUN, "--run-name", "sweep/a"]) == 2
    assert "is a run folder" in capsys.readouterr().err and not (run / "a").exists()
    copy_run(reference, tmp_path, name="outer/inner")
    assert main(["train", *RUN, "--run-name", "outer", "--overwrite"]) == 2
    assert "inside this one" in capsys.readouterr().err
    assert (tmp_path / "runs" / "outer" / "inner" / "record.json").exists()
    # --overwrite replaces the run's record, log and checkpoints, and leaves the user's files as they were.
    assert main(["train", "--duration", "2ba", *SMALL, "--run-name", "sweep", "--overwrite"]) == 0
    assert record(run)["steps"][-1]["batch"] == 2
    assert (run / "notes.ipynb").read_text() == "{}" and (run / "model.safetensors").read_bytes() == b"exported"
    assert (run / "plots" / "loss.png").read_bytes() == b"png"


# -- train: a changed flag, for every field of the run description --------------------------------------
def lr_recipe(folder: Path) -> str:
    """The baseline preset as a recipe file of the same name, with another learning rate."""
    from speedkit.tasks import get_recipe

    recipe = get_recipe("fashion-mnist", "baseline").to_dict()
    recipe["optimizer"] = {**recipe["optimizer"], "lr": 0.05}
    recipe = {k: v for k, v in recipe.items() if k not in ("reached", "task", "domain", "adopted_from", "target")}
    path = folder / "baseline.yaml"
    import yaml

    path.write_text(yaml.safe_dump(recipe))
    return str(path)


CHANGES = {  # a flag changed on resume: what the refusal names
    "seed": (["--seed", "1"], "seed"),
    "precision": (["--precision", "bf16"], "precision"),
    "batch size": (["--batch-size", "16"], "batch size"),
    "data fraction": (["--data-fraction", "0.02"], "data fraction"),
    "eval fraction": (["--eval-fraction", "0.03"], "eval_fraction"),
    "eval interval": (["--eval-interval", "6ba"], "eval_interval"),
    "target": (["--target", "0.5"], "target"),
    "stop at target": (["--stop-at-target"], "stop_at_target"),
    "methods": (["--methods", "label_smoothing"], "methods"),
    "model": (["--model", "resnet9"], "model"),
    "duration": (["--duration", "8ba"], "duration"),
    "recipe hyperparameters": (None, "optimizer.lr"),
}


@pytest.mark.parametrize("unreadable_record", [False, True], ids=["record", "record.json unreadable"])
@pytest.mark.parametrize("field", list(CHANGES))
def test_a_changed_flag_on_resume_is_refused_naming_it_and_nothing_is_touched(
        reference, tmp_path, capsys, monkeypatch, field, unreadable_record):
    run = copy_run(reference, tmp_path)
    if unreadable_record:  # the checkpoint's own copy of the run description decides
        (run / "record.json").write_text("{not json")
    flags, named = CHANGES[field]
    flags = flags or ["--recipe", lr_recipe(tmp_path)]
    before = snapshot(run)
    monkeypatch.chdir(tmp_path)
    assert main(["train", *RUN, "--run-name", "ref", "--autoresume", "--logger", "tensorboard", *flags]) == 2
    err = capsys.readouterr().err
    assert "different experiment" in err and named in err, err
    assert snapshot(run) == before  # not a byte, and no TensorBoard event file in the other run's folder
    assert not (run / "tensorboard").exists()


def image_folder(root: Path, classes=("cat", "dog"), count: int = 12) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_hidden_folders_are_no_classes_and_a_changed_data_folder_or_image_size_is_refused(tmp_path, capsys,
                                                                                          monkeypatch):
    from speedkit.tasks.builtin.image_folder import load_image_folder

    data = image_folder(tmp_path / "photos")
    image_folder(data, classes=(".ipynb_checkpoints",), count=2)  # Jupyter makes one
    image_folder(data / "cat", classes=(".ipynb_checkpoints",), count=1)
    arrays = load_image_folder(str(data), 8, 0.25, 0)
    assert arrays.classes == ("cat", "dog") and len(arrays.train_y) + len(arrays.val_y) == 24
    monkeypatch.chdir(tmp_path)
    args = ["train", "--task", "image-folder", "--data", str(data), "--image-size", "8", "--duration", "2ba",
            "--batch-size", "8", "--no-progress", "--run-name", "img"]
    assert main(args) == 0
    capsys.readouterr()
    other = tmp_path / "other"
    shutil.copytree(data, other)
    for change, named in ((["--image-size", "16"], "task_options"), (["--data", str(other)], "data")):
        assert main([*args, "--autoresume", *change]) == 2
        err = capsys.readouterr().err
        assert "different experiment" in err and named in err, err
    image_folder(data, classes=("cat",), count=13)  # one more image in the same folder
    assert main([*args, "--autoresume"]) == 2
    assert "data:" in capsys.readouterr().err


def test_autoresume_compares_the_image_size_that_trained_not_only_the_flag_typed(tmp_path, capsys, monkeypatch):
    """A run started without --image-size trained at the task's default (32 px): resuming it with --image-size 48 is
    refused naming the flag and the size to give, nothing touched; the same size typed out continues it."""
    data = image_folder(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    args = ["train", "--task", "image-folder", "--data", str(data), "--duration", "3ba", "--batch-size", "8",
            "--no-progress", "--run-name", "img"]
    assert main(args) == 0
    run = tmp_path / "runs" / "img"
    assert record(run)["config"]["inputs"] == {"train": 32, "eval": 32, "unit": "px"}
    capsys.readouterr()
    before = snapshot(run)
    longer = [*args, "--autoresume", "--extend-duration", "--duration", "6ba"]
    assert main([*longer, "--image-size", "48"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "input size: the run has 32 px, this one asks for 48 px (--image-size" in err, err
    assert "give the sizes it trained at (--image-size 32)" in err
    assert snapshot(run) == before
    assert main([*longer, "--image-size", "32"]) == 0
    continued = record(run)
    assert continued["steps"][-1]["batch"] == 6 and continued["config"]["inputs"]["train"] == 32


# -- export -------------------------------------------------------------------------------------------
def test_export_refuses_a_folder_or_the_runs_own_files_as_out_and_touches_nothing(reference, tmp_path, capsys):
    run = copy_run(reference, tmp_path)
    before = snapshot(run)
    for out, phrase in ((run, "is a folder"), (run / "checkpoints" / "latest.ckpt", "would replace a run's own"),
                        (run / "record.json", "would replace a run's own")):
        assert main(["export", str(run), "--out", str(out)]) == 2
        assert phrase in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.slow
def test_export_to_a_full_disk_is_one_line_and_leaves_no_partial_file(reference, tmp_path):
    disk = tmp_path / "disk"
    with mounted("tmpfs", disk, size="64k"):
        result = speedkit("export", str(reference), "--out", str(disk / "model.safetensors"), cwd=tmp_path)
        one_line_refusal(result, "No space left on device", str(disk / "model.safetensors"))
        assert list(disk.iterdir()) == []


def test_export_of_a_resumed_run_equals_the_uninterrupted_runs(reference, tmp_path):
    from speedkit.cli.export import export_weights

    a = export_weights(reference, out=tmp_path / "a.pt", format="pt")
    b = export_weights(copy_run(reference, tmp_path), out=tmp_path / "b.pt", format="pt")
    ta, tb = torch.load(a.path, weights_only=True), torch.load(b.path, weights_only=True)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


# -- tune ---------------------------------------------------------------------------------------------
TUNE = ["tune", "--methods", "ema,label_smoothing", "--budget", "60", "--trial-limit", "12", "--max-trials", "6",
        "--max-baseline-trials", "2", "--seeds", "1", "--data-fraction", "0.02", "--eval-fraction", "0.05",
        "--runner", "tune_fakes:fake_run"]


@pytest.mark.slow
def test_two_tune_processes_on_one_out_give_one_answer(tmp_path):
    pytest.importorskip("optuna")
    out = tmp_path / "out"
    faults = {"TUNE_FAKE_PACE": "0.05", "TUNE_FAKE_LOG": str(tmp_path / "runs.log")}
    command = [sys.executable, str(FAULT_CLI), *TUNE, "--out", str(out)]
    processes = [subprocess.Popen(command, cwd=tmp_path, env={**env(), **faults}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [p.communicate(timeout=600) + (p.returncode,) for p in processes]
    assert [code for _, _, code in outcomes] == [0, 0], [err[-2000:] for _, err, _ in outcomes]
    answers = [[ln for ln in stdout.splitlines() if ln.startswith(("winner:", "speed-up", "no candidate"))]
               for stdout, _, _ in outcomes]
    assert answers[0] == answers[1] and answers[0], answers
    import optuna

    from speedkit.experiments.tune.storage import BASELINE_RUNS, open_storage

    storage = open_storage(str((out / "study.journal").resolve()))
    listed = optuna.load_study(study_name="tune", storage=storage).user_attrs[BASELINE_RUNS]
    assert len(listed) == 2, f"{len(listed)} baseline runs under --max-baseline-trials 2"  # one process ran the plan
    starts = [line.split()[1] for line in (tmp_path / "runs.log").read_text().splitlines() if line.startswith("start")]
    assert sorted(name for name in starts if name.startswith("tune-baseline-")) == [e["name"] for e in listed]
    if answers[0][0].startswith("winner:"):  # one recipe.yaml, naming the recipe both processes printed
        assert answers[0][0].split("winner: ", 1)[1] in (out / "recipe.yaml").read_text() or (out / "recipe.yaml").exists()


def test_tune_into_a_read_only_out_is_refused_in_one_line(tmp_path):
    pytest.importorskip("optuna")
    out = tmp_path / "out"
    with mounted("readonly", out):
        result = speedkit(*TUNE, "--out", str(out / "search"), cwd=tmp_path)
        one_line_refusal(result, "Read-only file system", str(out / "search"))


# -- clear errors instead of tracebacks (exit 2, the path or flag, the fix) ----------------------------------
def refused(capsys, argv: list[str], *phrases: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("speedkit: error"), err
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    return err


def test_bad_flags_and_paths_are_one_line_refusals(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, ["train", "--duration", "-5ba", *SMALL], "duration", "-5ba")
    assert "expected one argument" not in err
    (tmp_path / "afile").write_text("")
    refused(capsys, ["train", "--duration", "2ba", "--run-dir", "afile", *SMALL], "--run-dir", "is a file")
    refused(capsys, ["train", "--duration", "2ba", "--run-name", "x" * 300, *SMALL], "--run-name", "shorter")
    refused(capsys, ["notebooks", "run", "-p", "x", "!!python/object/apply:os.system ['true']", "--only", "none"],
            "-p x", "quote it")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_image_size_the_memory_cannot_hold_is_refused_naming_the_flag(tmp_path, capsys, monkeypatch):
    """Where a folder is decoded into memory and it would not fit, the refusal (a MemoryError naming the fix) is
    one line and exit 2, not a traceback."""
    from unittest import mock

    from speedkit.data.images import check_memory

    with pytest.raises(MemoryError) as refusal:
        check_memory(100_000, 3, 1024, "image-folder photos", available=2**30)
    monkeypatch.chdir(tmp_path)  # raised where the data is built (not from a frame of this test: not "your code")
    monkeypatch.setattr("speedkit.tasks.make_trainer", mock.Mock(side_effect=MemoryError(str(refusal.value))))
    refused(capsys, ["train", "--duration", "2ba", *SMALL], "--image-size", "lower", "image-folder photos")


def test_a_diverged_loss_says_which_checkpoint_is_intact(tmp_path, capsys, monkeypatch):
    import yaml

    path = Path(lr_recipe(tmp_path))
    recipe = yaml.safe_load(path.read_text())
    recipe["optimizer"]["lr"] = 1e12  # diverges within a few batches
    path.write_text(yaml.safe_dump(recipe))
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, ["train", "--recipe", str(path), "--duration", "12ba", "--save-interval", "none", *SMALL],
                  "the loss is", "Lower the learning rate")
    assert "before any checkpoint was written" in err and "is intact" not in err


def test_a_text_folder_of_empty_files_names_the_folder_and_the_fix(tmp_path, capsys, monkeypatch):
    data = tmp_path / "texts"
    data.mkdir()
    for i in range(4):
        (data / f"{i}.txt").write_text("" if i else "ab")
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["train", "--task", "text-folder", "--data", str(data), "--duration", "2ba", "--no-progress"],
            "text-folder", str(data.name), "add text")


def test_a_pickled_checkpoint_is_refused_without_torchs_advice_to_unpickle_it(tmp_path):
    import io

    from speedkit.train.checkpoint import MAGIC, CheckpointError

    buffer = io.BytesIO()
    torch.save({"format_version": 1, "model": Path("x")}, buffer)  # an object: weights_only refuses it
    data = buffer.getvalue()
    path = tmp_path / "evil.ckpt"
    path.write_bytes(MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    with pytest.raises(CheckpointError) as refusal:
        load_checkpoint(path)
    assert "weights_only=False" not in str(refusal.value) and "do not use it" in str(refusal.value)


def test_files_are_created_with_the_umask_not_0600(reference):
    mask = os.umask(0o022)
    os.umask(mask)
    for name in ("record.json", "checkpoints/latest.ckpt"):
        assert (reference / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
