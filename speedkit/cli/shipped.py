"""Where the notebooks, tutorials and parameter sets the CLI runs are: a checkout, or the copy in the package.

A speedkit checkout keeps them at its top level (``notebooks/``, ``tutorials/``, ``params/``,
``bench/results/summary.json``); a wheel carries a copy of the same tree under ``speedkit/shipped/``
(setup.py puts it there). ``notebook_root()`` answers "the folder holding them": the one given (``--root``),
else the package's copy, else the checkout the package was imported from (an editable install, or a
checkout on ``sys.path``), so ``speedkit demo`` works from any folder after ``pip install torch-speedkit``.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

SHIPPED = "shipped"  # the folder inside the package; setup.py's SHIPPED names the same one
NOTEBOOK_FOLDERS = ("notebooks", "tutorials")  # a root holds params/ and at least one of these


def _is_root(folder: Path) -> bool:
    return (folder / "params").is_dir() and any((folder / name).is_dir() for name in NOTEBOOK_FOLDERS)


def shipped_root() -> Path | None:
    """The package's own copy (an installed wheel), or None (an editable install or a plain checkout)."""
    folder = Path(str(resources.files("speedkit") / SHIPPED))
    return folder if _is_root(folder) else None


def checkout_root() -> Path | None:
    """The checkout the package was imported from, or None when it was installed from a wheel."""
    folder = Path(str(resources.files("speedkit"))).parent
    return folder if _is_root(folder) else None


def notebook_root(root: str | Path | None = None) -> Path:
    """The folder holding ``notebooks/``, ``tutorials/`` and ``params/``: ``root`` if given, else the
    package's copy, else the checkout speedkit was imported from."""
    if root is not None:
        root = Path(root)
        if not _is_root(root):
            raise FileNotFoundError(f"root={str(root)!r} holds no params/ beside notebooks/ or tutorials/: pass "
                                    f"a speedkit checkout, or leave root out to use the copy installed with speedkit")
        return root
    found = shipped_root() or checkout_root()
    if found is None:
        raise FileNotFoundError("this speedkit installation carries no notebooks/ or params/ (an incomplete "
                                "build?); reinstall with pip install torch-speedkit, or pass root= (--root) to a "
                                "speedkit checkout")
    return found


def is_shipped(root: str | Path) -> bool:
    """Whether ``root`` is the package's copy (read-only to a notebook: it then runs in the current folder)."""
    shipped = shipped_root()
    return shipped is not None and Path(root).resolve() == shipped.resolve()


def copy_notebooks(destination: str | Path, root: str | Path | None = None) -> list[Path]:
    """Copy ``notebooks/``, ``tutorials/`` and ``params/`` out of ``root`` (default: the installed copy) into
    ``destination``, so a pip user can open and edit them. Refuses, before copying anything, when a file it would
    write is already there: nothing of the user's is replaced. Returns the files written."""
    source = notebook_root(root)
    destination = Path(destination).expanduser()
    files = [path for name in (*NOTEBOOK_FOLDERS, "params") if (source / name).is_dir()
             for path in sorted((source / name).rglob("*"))
             if path.is_file() and "__pycache__" not in path.parts and ".ipynb_checkpoints" not in path.parts]
    taken = [destination / path.relative_to(source) for path in files
             if (destination / path.relative_to(source)).exists()]
    if taken:
        raise ValueError(f"{destination} already holds {len(taken)} of the files to copy (e.g. {taken[0]}); "
                              f"copy into another folder (speedkit notebooks copy OTHER_DIR), or move them away first")
    written = []
    for path in files:
        target = destination / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        written.append(target)
    return written


__all__ = ["checkout_root", "copy_notebooks", "is_shipped", "notebook_root", "shipped_root"]
