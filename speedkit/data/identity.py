"""What a run's data is, cheaply: a folder's path and a fingerprint of its files (names and sizes), so a resume
can tell that ``--data`` now names other files without reading them."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def data_identity(data) -> dict | str:
    """``{"path", "files", "bytes", "fingerprint"}`` for a folder or file; the value itself (as text) for
    anything else a task function takes. Hidden files and folders (``.ipynb_checkpoints``) are left out, as
    the folder tasks leave them out; the fingerprint hashes each file's path inside the folder and its size."""
    if not isinstance(data, (str, os.PathLike)):
        return repr(data)
    path = Path(data).expanduser()
    if not path.exists():
        return str(data)
    path = path.resolve()
    digest, count, total = hashlib.sha256(), 0, 0
    entries = [(path.name, path.stat().st_size)] if path.is_file() else _files(path)
    for name, size in entries:
        digest.update(f"{name}\0{size}\n".encode())
        count, total = count + 1, total + size
    return {"path": str(path), "files": count, "bytes": total, "fingerprint": digest.hexdigest()[:16]}


def _files(folder: Path):
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith("."):
                file = Path(root) / name
                try:
                    found.append((file.relative_to(folder).as_posix(), file.stat().st_size))
                except OSError:
                    continue
    return sorted(found)
