"""The data fingerprint, defined once: a hash of a folder's files, each one's path inside the folder and its size
(hidden files and folders left out, as the folder tasks leave them out), so a resume can tell that ``--data`` now
names other files without reading them. ``speedkit.data.identity`` reports it for a run's data (a shard folder
gives the one its source had, which ``speedkit data prepare`` records here)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def source_identity(path: Path) -> dict:
    """``{"files", "bytes", "fingerprint"}`` of a folder's (or a file's) files; what ``prepare`` records as its
    shards' ``source_data``."""
    digest, count, total = hashlib.sha256(), 0, 0
    entries = [(path.name, path.stat().st_size)] if path.is_file() else _files(path)
    for name, size in entries:
        digest.update(f"{name}\0{size}\n".encode())
        count, total = count + 1, total + size
    return {"files": count, "bytes": total, "fingerprint": digest.hexdigest()[:16]}


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
