"""Progress is on by default when a person is watching (a terminal, a notebook) and off in pipes and CI."""
from __future__ import annotations

import io
import sys

import pytest
from helpers import toy_loaders, toy_model

from speedkit import Trainer
from speedkit.callbacks import ProgressBar, someone_is_watching
from speedkit.callbacks.monitors import _CI_ENV, PROGRESS_ENV


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def nobody_set_anything(monkeypatch):
    for name in (PROGRESS_ENV, *_CI_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    return monkeypatch


def test_a_terminal_is_watched_a_pipe_is_not(nobody_set_anything):
    nobody_set_anything.setattr(sys, "stderr", _Terminal())
    assert someone_is_watching()
    nobody_set_anything.setattr(sys, "stderr", io.StringIO())  # a pipe or a log file
    assert not someone_is_watching()


def test_a_notebook_kernel_is_watched(nobody_set_anything):
    nobody_set_anything.setattr(sys, "stderr", io.StringIO())  # a kernel's stderr is no terminal
    nobody_set_anything.setitem(sys.modules, "ipykernel", object())
    assert someone_is_watching()


@pytest.mark.parametrize("name, value", [("CI", "true"), ("GITHUB_ACTIONS", "true"), ("CI", "1")])
def test_ci_is_not_watched_even_in_a_terminal(nobody_set_anything, name, value):
    nobody_set_anything.setattr(sys, "stderr", _Terminal())
    nobody_set_anything.setenv(name, value)
    assert not someone_is_watching()
    nobody_set_anything.setenv(name, "false")
    assert someone_is_watching()


def test_the_environment_variable_decides_over_everything(nobody_set_anything):
    nobody_set_anything.setattr(sys, "stderr", _Terminal())
    nobody_set_anything.setenv(PROGRESS_ENV, "0")
    assert not someone_is_watching()
    nobody_set_anything.setattr(sys, "stderr", io.StringIO())
    nobody_set_anything.setenv("CI", "true")
    nobody_set_anything.setenv(PROGRESS_ENV, "1")
    assert someone_is_watching()


def _bars(trainer) -> int:
    return sum(isinstance(c, ProgressBar) for c in trainer.state.callbacks)


def test_the_trainer_defaults_to_auto_and_an_explicit_choice_wins(nobody_set_anything, tmp_path):
    train, _ = toy_loaders()
    kwargs = dict(max_duration="2ba", run_dir=tmp_path, save_checkpoints=False)
    nobody_set_anything.setenv(PROGRESS_ENV, "1")
    assert _bars(Trainer(toy_model(), train, **kwargs)) == 1
    assert _bars(Trainer(toy_model(), train, progress_bar=False, **kwargs)) == 0
    nobody_set_anything.setenv(PROGRESS_ENV, "0")
    assert _bars(Trainer(toy_model(), train, **kwargs)) == 0
    assert _bars(Trainer(toy_model(), train, progress_bar=True, **kwargs)) == 1
    with pytest.raises(TypeError, match="progress_bar must be True, False or 'auto'"):
        Trainer(toy_model(), train, progress_bar="yes", **kwargs)


def test_the_notebook_runner_turns_bars_off_in_the_kernels_it_starts(nobody_set_anything):
    import os

    from speedkit.cli.notebooks import _no_progress_bars

    with _no_progress_bars():
        assert os.environ[PROGRESS_ENV] == "0"
    assert PROGRESS_ENV not in os.environ
    nobody_set_anything.setenv(PROGRESS_ENV, "1")  # a user who asks for bars keeps them
    with _no_progress_bars():
        assert os.environ[PROGRESS_ENV] == "1"
