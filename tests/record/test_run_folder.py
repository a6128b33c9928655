"""A run folder has one owner, through the Python API (``speedkit.record.run_folder``, applied by the
Trainer): an earlier run is refused unless continued or overwritten, the lock stops a second owner and a
dead owner's lock file is taken over, a resume is the same experiment unless extended on purpose."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import toy_loaders, toy_model

from speedkit import Trainer
from speedkit.record.run_folder import RunFolderError, RunLock, experiment_changes, remove_earlier_runs


def toy_trainer(run_dir, duration="2ba", **kwargs) -> Trainer:
    train, test = toy_loaders()
    return Trainer(toy_model(), train, eval_dataloader=test, max_duration=duration, device="cpu", run_dir=run_dir,
                   run_name="r", **kwargs)


def test_an_earlier_run_is_refused_unless_continued_or_overwritten(tmp_path):
    first = toy_trainer(tmp_path).fit()
    with pytest.raises(RunFolderError, match=r"already holds a run that ended completed after 2 batches.*"
                                             r"--autoresume.*--run-name.*--overwrite"):
        toy_trainer(tmp_path)
    replaced = toy_trainer(tmp_path, overwrite=True).fit()
    assert replaced.run_id != first.run_id and replaced.notes["overwrote"].startswith("deleted a run that ended")
    assert json.loads((tmp_path / "r" / "record.json").read_text())["run_id"] == replaced.run_id
    with pytest.raises(ValueError, match="choose one"):
        toy_trainer(tmp_path, autoresume=True, overwrite=True)
    with pytest.raises(ValueError, match="use it with autoresume=True"):
        toy_trainer(tmp_path, extend_duration=True)


def test_a_changed_resume_is_refused_naming_what_changed_and_extending_is_noted(tmp_path):
    toy_trainer(tmp_path, duration="2ba").fit()
    with pytest.raises(RunFolderError, match=r"different experiment: duration: the run has '2ba', this one asks "
                                             r"for '4ba'.*--extend-duration"):
        toy_trainer(tmp_path, duration="4ba", autoresume=True)
    with pytest.raises(RunFolderError, match="makes a run longer"):
        toy_trainer(tmp_path, duration="1ba", autoresume=True, extend_duration=True)
    record = toy_trainer(tmp_path, duration="4ba", autoresume=True, extend_duration=True).fit()
    assert record.status == "completed" and record.steps[-1]["batch"] == 4
    assert record.notes["extended_duration"] == [{"from": "2ba", "to": "4ba", "at_batch": 2}]


def test_experiment_changes_name_each_difference():
    before = {"config": {"task": "t", "recipe": "mild", "max_duration": "2ep", "batch_size": 64, "seed": 0,
                         "recipe_spec": {"model": "resnet8"}, "model": "ResNet", "parameters": 10},
              "methods": [{"name": "ema", "params": {"half_life": "10ba"}}]}
    now = {**before["config"], "batch_size": 32, "recipe_spec": {"model": "resnet9"}, "parameters": 20}
    changes = experiment_changes(before, now, [{"name": "ema", "params": {"half_life": "20ba"}}])
    assert sorted(changes) == ["batch size", "methods", "model"]
    assert changes["model"] == "model: the run has resnet8, this one asks for resnet9 (--model)"
    assert experiment_changes(before, before["config"], before["methods"]) == {}


def test_a_live_lock_refuses_a_second_owner_and_a_dead_ones_is_taken_over(tmp_path):
    held = RunLock(tmp_path)
    assert held.acquire() is None
    with pytest.raises(RunFolderError, match=rf"is in use: PID {os.getpid()} on host"):
        RunLock(tmp_path).acquire()
    with pytest.raises(RunFolderError, match="is in use"):
        remove_earlier_runs(tmp_path.parent)  # a tool clearing its runs leaves a live one alone
    held.release()
    assert not (tmp_path / "run.lock").exists()

    # A process that took the lock and was killed: its lock file stays, naming it, but nobody holds it.
    script = f"from speedkit.record.run_folder import RunLock; RunLock({str(tmp_path)!r}).acquire(); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    left = json.loads((tmp_path / "run.lock").read_text())
    assert RunLock(tmp_path).holder() is None
    taken = RunLock(tmp_path)
    assert taken.acquire() == left and left["pid"] != os.getpid()
    taken.release()


def test_a_notebook_rerun_replaces_its_earlier_runs_and_nothing_else(tmp_path):
    toy_trainer(tmp_path).fit()  # tmp_path/r: an earlier session's run of the notebook
    (tmp_path / "notes").mkdir()
    (tmp_path / "summary.json").write_text("{}")
    assert remove_earlier_runs(tmp_path) == [tmp_path / "r"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "summary.json"]
    assert toy_trainer(tmp_path).fit().status == "completed"  # the same name starts again


def test_a_process_of_another_user_counts_as_alive(monkeypatch):
    """os.kill(pid, 0) on another user's live process raises PermissionError: its lock is not stale."""
    import os

    from speedkit.record.run_folder import pid_alive

    def kill(pid, signal):
        raise PermissionError(1, "Operation not permitted")

    assert pid_alive(os.getpid()) and not pid_alive("not a pid")
    monkeypatch.setattr(os, "kill", kill)
    assert pid_alive(1)
