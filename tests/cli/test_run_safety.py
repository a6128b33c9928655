"""Nothing a user runs is lost (issue 25), tried as a user would: ``python -m speedkit train`` in a child
process. A SIGKILL mid-run then ``--autoresume`` ends where an uninterrupted run ends; a run folder has
one owner (a second run, a concurrent one, a failed resume and ``--run-name ../x`` leave the first
intact); a resume is the same experiment unless extended on purpose; Ctrl-C is one line and exit 130;
an error in the user's own model keeps its traceback."""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from cli_child import speedkit_train

from speedkit.cli.main import main
from speedkit.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.prerequisite("fashion-mnist")

# A small, quick run: 600 training images in batches of 32 (19 a epoch), 200 test images.
SMALL = ["--data-fraction", "0.01", "--eval-fraction", "0.02", "--batch-size", "32", "--no-progress"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(folder: Path) -> dict:
    return json.loads((folder / "record.json").read_text())


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the run ended before {path.name} appeared: {process.communicate()}"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.05)


RUN = ["--duration", "12ba", "--save-interval", "3ba", *SMALL]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed 12-batch run, ``runs/base``, checkpointed every 3 batches: the uninterrupted run a killed
    one must end equal to, and the earlier run that others try to overwrite (they copy it first)."""
    cwd = tmp_path_factory.mktemp("finished")
    result = speedkit_train(*RUN, "--run-name", "base", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return cwd / "runs" / "base"


def copy_of(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run.parent, tmp_path / "runs")
    return tmp_path / "runs" / run.name


# -- kill -9, then --autoresume --------------------------------------------------------------------
def test_a_sigkill_mid_run_then_autoresume_ends_equal_to_an_uninterrupted_run(finished, tmp_path):
    killed = speedkit_train(*RUN, "--run-name", "killed", cwd=tmp_path, wait=False)
    try:
        wait_for(tmp_path / "runs" / "killed" / "checkpoints" / "ba000000003.ckpt", killed)
        killed.send_signal(signal.SIGKILL)  # what the out-of-memory killer does: no handler runs
    finally:
        killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "runs" / "killed" / "run.lock").exists()  # left behind: nothing ran to remove it

    resumed = speedkit_train(*RUN, "--run-name", "killed", "--autoresume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "took over run.lock left by PID" in resumed.stderr  # the dead process's lock, recognised and named

    a, b = record(finished), record(tmp_path / "runs" / "killed")
    assert b["status"] == "completed" and b["notes"]["resumed_from"].endswith(".ckpt")
    assert [(s["batch"], s["loss"]) for s in a["steps"]] == [(s["batch"], s["loss"]) for s in b["steps"]]
    assert [{k: v for k, v in e.items() if k.startswith("eval/")} for e in a["evals"]] == \
           [{k: v for k, v in e.items() if k.startswith("eval/")} for e in b["evals"]]
    assert a["final_metrics"] == b["final_metrics"]
    weights = [load_checkpoint(run / "checkpoints" / "latest.ckpt")["model"]
               for run in (finished, tmp_path / "runs" / "killed")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not (tmp_path / "runs" / "killed" / "run.lock").exists()


# -- a run folder has one owner --------------------------------------------------------------------
def test_the_same_run_name_again_is_refused_with_the_choices_and_changes_nothing(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = {name: digest(run / name) for name in ("record.json", "log.jsonl")}
    again = speedkit_train(*RUN, "--run-name", "base", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "already holds a run that ended completed" in again.stderr
    for choice in ("--autoresume", "--run-name", "--overwrite"):
        assert choice in again.stderr
    assert before == {name: digest(run / name) for name in before}


def test_two_runs_with_one_name_at_once_one_trains_and_the_other_is_refused(tmp_path):
    args = ["--duration", "8ba", "--run-name", "twice", *SMALL]
    runs = [speedkit_train(*args, cwd=tmp_path, wait=False) for _ in range(2)]
    outcomes = [(p.wait(timeout=600), p.communicate()[1]) for p in runs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    refusal = next(err for code, err in outcomes if code == 2)
    assert "is in use: PID" in refusal or "already holds a run" in refusal, refusal
    log = [json.loads(line) for line in (tmp_path / "runs" / "twice" / "log.jsonl").read_text().splitlines()]
    assert [row["batch"] for row in log if "loss" in row] == [8]  # one run's log, not two interleaved
    assert record(tmp_path / "runs" / "twice")["status"] == "completed"


def test_a_failed_autoresume_never_replaces_the_record_it_failed_to_continue(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = digest(run / "record.json")
    wrong = speedkit_train(*RUN, "--run-name", "base", "--autoresume", "--model", "resnet9", cwd=tmp_path)
    assert wrong.returncode == 2
    assert "different experiment: model: the run has resnet8, this one asks for resnet9 (--model)" in wrong.stderr
    assert digest(run / "record.json") == before and record(run)["status"] == "completed"


def test_autoresume_without_a_checkpoint_says_so_instead_of_starting_over(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    shutil.rmtree(run / "checkpoints")
    before = digest(run / "record.json")
    result = speedkit_train(*RUN, "--run-name", "base", "--autoresume", cwd=tmp_path)
    assert result.returncode == 2 and "no checkpoint" in result.stderr and "--overwrite" in result.stderr
    assert digest(run / "record.json") == before


def test_overwrite_replaces_the_earlier_run(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    first_id = record(run)["run_id"]
    result = speedkit_train("--duration", "2ba", "--run-name", "base", "--overwrite", *SMALL, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert record(run)["run_id"] != first_id and record(run)["steps"][-1]["batch"] == 2
    assert sorted(p.name for p in (run / "checkpoints").glob("ba*.ckpt")) == ["ba000000002.ckpt"]


def test_run_name_cannot_leave_run_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--duration", "2ba", "--run-name", "../../x", *SMALL]) == 2  # in this process: quick
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run_name '../../x' (--run-name) would write outside run_dir 'runs'" in err
    assert not (tmp_path.parent / "x").exists() and not (tmp_path / "runs").exists()


# -- a resumed run is the same experiment -----------------------------------------------------------
def test_resuming_with_another_duration_is_refused_and_extending_is_named_and_noted(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    shorter = speedkit_train(*RUN, "--duration", "8ba", "--run-name", "base", "--autoresume", cwd=tmp_path)
    assert shorter.returncode == 2
    assert "duration: the run has '12ba', this one asks for '8ba'" in shorter.stderr
    assert "--extend-duration" in shorter.stderr
    longer = speedkit_train(*RUN, "--duration", "14ba", "--run-name", "base", "--autoresume", "--extend-duration",
                            cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr
    extended = record(run)
    assert extended["status"] == "completed" and extended["steps"][-1]["batch"] == 14
    assert extended["notes"]["extended_duration"] == [{"from": "12ba", "to": "14ba", "at_batch": 12}]


# -- the CLI speaks to people -------------------------------------------------------------------------
def test_ctrl_c_prints_one_line_with_the_checkpoint_and_the_resume_command_and_exits_130(tmp_path):
    run = speedkit_train("--duration", "60ba", "--save-interval", "2ba", *SMALL, cwd=tmp_path, wait=False)
    try:
        wait_for(next_checkpoint(tmp_path / "runs", run), run)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 130, err
    (line,) = err.strip().splitlines()
    assert line.startswith("speedkit: interrupted after batch ") and "checkpoint runs/run-" in line
    command = line.split("resume with: ", 1)[1]
    assert command.startswith("speedkit train --duration 60ba") and command.endswith("--autoresume")
    assert " --run-name run-" in command
    (folder,) = (tmp_path / "runs").iterdir()
    assert record(folder)["status"] == "interrupted"


def next_checkpoint(run_dir: Path, process: subprocess.Popen) -> Path:
    """The first checkpoint of the one (unnamed) run that ``process`` makes under ``run_dir``."""
    deadline = time.monotonic() + 300
    while not (run_dir.is_dir() and any(run_dir.iterdir())):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    (folder,) = run_dir.iterdir()
    return folder / "checkpoints" / "ba000000002.ckpt"


def test_an_error_in_the_users_own_model_keeps_its_traceback(tmp_path):
    (tmp_path / "broken_model_task.py").write_text(
        "import torch\n"
        "from test_tasks import user_task\n\n"
        "class Broken(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(784, 10)\n\n"
        "    def forward(self, x):\n"
        "        raise ValueError('my bug in forward')\n\n"
        "task = user_task('broken-model', model=lambda name: Broken())\n")
    result = speedkit_train("--task", "broken_model_task:task", "--duration", "2ba", *SMALL, cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "broken_model_task.py" in result.stderr
    assert "raise ValueError('my bug in forward')" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("speedkit: error in your code (traceback above)")
