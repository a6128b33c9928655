"""Finding the notebooks and parameter sets: a checkout given as root, else the installed copy, else the checkout
speedkit was imported from (the wheel's own copy is tested in test_wheel.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from speedkit.cli.shipped import checkout_root, is_shipped, notebook_root, shipped_root

ROOT = Path(__file__).resolve().parents[2]


def test_from_a_checkout_the_checkout_is_the_root():
    assert shipped_root() is None  # imported from the checkout, not a wheel
    assert checkout_root() == ROOT and notebook_root() == ROOT and notebook_root(ROOT) == ROOT
    assert not is_shipped(ROOT)


def test_a_root_without_notebooks_and_params_is_refused_naming_the_argument(tmp_path):
    (tmp_path / "notebooks").mkdir()
    with pytest.raises(FileNotFoundError, match=r"root=.* holds no params/ beside notebooks/ or tutorials/: pass a"):
        notebook_root(tmp_path)
    (tmp_path / "params").mkdir()
    assert notebook_root(tmp_path) == tmp_path
    (tmp_path / "notebooks").rmdir()
    (tmp_path / "tutorials").mkdir()  # tutorials alone with params/ is a root too
    assert notebook_root(tmp_path) == tmp_path


def test_notebooks_copy_gives_a_pip_user_editable_notebooks_and_never_replaces_a_file(tmp_path, capsys):
    from speedkit.cli.main import main

    destination = tmp_path / "mine"
    assert main(["notebooks", "copy", str(destination)]) == 0
    copied = {p.relative_to(destination).as_posix() for p in destination.rglob("*.ipynb")}
    assert "notebooks/00_quickstart.ipynb" in copied and any(name.startswith("tutorials/t1_") for name in copied)
    assert (destination / "params" / "cpu-smoke").is_dir()
    edited = destination / "notebooks" / "00_quickstart.ipynb"
    edited.write_text("my edits")
    capsys.readouterr()
    assert main(["notebooks", "copy", str(destination)]) == 2
    assert "already holds" in capsys.readouterr().err and edited.read_text() == "my edits"
    assert main(["notebooks", "where"]) == 0
    assert (Path(capsys.readouterr().out.strip()) / "params").is_dir()
