"""What a run's data is, cheaply: a folder's path and a fingerprint of its files (names and sizes), so a resume
can tell that ``--data`` now names other files without reading them.

``fingerprint`` (shown as ``data_fingerprint``) means one thing everywhere: a hash of the source files' paths inside
their folder and sizes. Shards that ``speedkit data prepare`` wrote carry their source's (recorded when prepared),
so a run on the shards, a run on the folder they came from and ``speedkit data info`` report one fingerprint for
one data set; ``shards_fingerprint`` tells apart shard sets of it (other options, prepared again)."""
from __future__ import annotations

import os
from pathlib import Path

from speedkit.data.fingerprint import source_identity
from speedkit.data.streaming.errors import MANIFEST


def data_identity(data) -> dict | str:
    """``{"path", "files", "bytes", "fingerprint"}`` for a folder or file (``speedkit.data.fingerprint``), a shard
    folder's as ``shards_identity`` gives it; the value itself (as text) for anything else a task function takes."""
    if not isinstance(data, (str, os.PathLike)):
        return repr(data)
    path = Path(data).expanduser()
    if not path.exists():
        return str(data)
    path = path.resolve()
    if path.is_dir() and (path / MANIFEST).is_file():
        return _shard_folder_identity(path)
    return {"path": str(path), **source_identity(path)}


def shards_identity(location: str, manifest: dict, shards_fingerprint: str | None) -> dict:
    """A shard set's identity: its location, the folder it was prepared from and that folder's files and
    ``fingerprint`` (none for shards prepared before it was recorded), and its own ``shards_fingerprint``."""
    source = manifest.get("source_data") or {}
    return {"path": str(location), "source": manifest.get("source"),
            **{k: source[k] for k in ("files", "bytes", "fingerprint") if k in source},
            **({"shards_fingerprint": shards_fingerprint} if shards_fingerprint else {})}


def _shard_folder_identity(path: Path) -> dict:
    from speedkit.data.streaming.shards import parse_manifest, read_shards

    manifest = parse_manifest((path / MANIFEST).read_bytes(), str(path))
    try:
        shards_fingerprint = read_shards(path).fingerprint
    except (OSError, ValueError):  # damaged shards: the task that reads them refuses them, naming the fix
        shards_fingerprint = None
    return shards_identity(str(path), manifest, shards_fingerprint)
