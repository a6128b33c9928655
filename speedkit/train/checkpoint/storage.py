"""Checkpoints in remote storage: ``save_folder`` (and ``load_path``) as fsspec URLs.

A plain path or a ``file://`` URL is a local folder, with every local guarantee. Any other URL (``s3://``,
``gs://``, ``az://``, ``memory://``, ...) names a remote folder, which the run mirrors: checkpoints are
written, verified and pruned in a local staging folder exactly as without one (``<run folder>/checkpoints``),
then each save uploads its ``ba{batch}.ckpt`` (and an FSDP checkpoint's ``.dcp`` shard folder), then
``latest.ckpt``, and only then removes the remote checkpoints older than the newest few. A resume downloads
what the staging folder lacks, then resumes from the staging folder as usual.

What stays atomic, and where it stops:

- locally (the staging folder, a plain path, ``file://``): write then rename, as always;
- on object stores (S3, GCS, Azure) an uploaded file appears whole or not at all, so a remote checkpoint
  is complete or absent; ``latest.ckpt`` is replaced only after the checkpoint it copies is up;
- on file systems that fsspec writes in place (``memory://``, SFTP, some network mounts), an upload cut off
  by a crash leaves a partial file. Its SHA-256 no longer matches, so loading refuses it and autoresume
  passes over it to the next newest, which pruning left in place.

Uploads happen on the training thread after each save (time counted in ``timings["checkpoint_s"]``). The
storage's own packages and credentials are the user's: ``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``, ...
"""
from __future__ import annotations

import os
from pathlib import Path

LATEST = "latest.ckpt"


def is_remote(location) -> bool:
    """True for a URL with a protocol other than ``file``: ``s3://bucket/run``, ``memory://ckpts``."""
    return isinstance(location, str) and "://" in location and not location.startswith("file://")


def _protocol(url: str) -> str:
    return url.split("://", 1)[0]


def local_path(location: str | os.PathLike) -> Path:
    """A local location as a Path (``file:///tmp/x`` -> ``/tmp/x``)."""
    if isinstance(location, str) and location.startswith("file://"):
        return Path(location[len("file://"):])
    return Path(location)


def open_url(url: str, what: str):
    """fsspec's file system and path for ``url``; a ValueError naming ``what`` (the argument) and the fix when
    the protocol is unknown, its package is missing, or the storage cannot be reached."""
    import fsspec  # a dependency of torch

    protocol = _protocol(url)
    if protocol not in fsspec.available_protocols():
        raise ValueError(f"{what} {url!r}: {protocol!r} is not a storage protocol fsspec knows; use one such as "
                         f"s3://, gs://, az://, memory://, or a local path")
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:  # the protocol's package (s3fs, gcsfs, ...) is not installed
        raise ValueError(f"{what} {url!r}: fsspec cannot open it ({e}); install the package for its protocol "
                         f"(s3fs for s3://, gcsfs for gs://, adlfs for az://)") from None
    except Exception as e:  # a host that does not answer, credentials, a malformed URL
        raise ValueError(f"{what} {url!r}: fsspec cannot open it ({type(e).__name__}: {e}); check the URL and "
                         f"the storage's credentials") from e


class RemoteFolder:
    """A folder of checkpoints at an fsspec URL, mirrored from a local staging folder."""

    def __init__(self, url: str):
        self.fs, self.root = open_url(url, "save_folder")
        self.url = url.rstrip("/")
        self.root = self.root.rstrip("/")

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def upload(self, checkpoint: Path, latest: Path, keep: int, sharded_suffix: str) -> None:
        """``checkpoint`` (with its shard folder, if any), then ``latest``; then prune all but the newest ``keep``."""
        self.fs.makedirs(self.root, exist_ok=True)
        shards = checkpoint.with_suffix(sharded_suffix)
        if shards.is_dir():
            self.fs.put(str(shards), self._path(shards.name), recursive=True)
        self.fs.put_file(str(checkpoint), self._path(checkpoint.name))
        self.fs.put_file(str(latest), self._path(LATEST))
        for old in self.checkpoint_names()[:-keep]:
            self.fs.rm_file(self._path(old))
            if self.fs.exists(self._path(old[:-len(".ckpt")] + sharded_suffix)):
                self.fs.rm(self._path(old[:-len(".ckpt")] + sharded_suffix), recursive=True)

    def checkpoint_names(self) -> list[str]:
        """``ba{batch}.ckpt`` names in the folder, oldest first."""
        if not self.fs.exists(self.root):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        return sorted(n for n in names if n.startswith("ba") and n.endswith(".ckpt"))

    def download_missing(self, staging: Path, sharded_suffix: str) -> list[str]:
        """Copy into ``staging`` the checkpoints it lacks, and the remote ``latest.ckpt``; returns the names copied."""
        staging.mkdir(parents=True, exist_ok=True)
        copied = []
        for name in self.checkpoint_names():
            if not (staging / name).exists():
                shards = name[:-len(".ckpt")] + sharded_suffix
                if self.fs.exists(self._path(shards)):
                    self.fs.get(self._path(shards), str(staging / shards), recursive=True)
                _get_atomically(self.fs, self._path(name), staging / name)
                copied.append(name)
        if self.fs.exists(self._path(LATEST)):
            _get_atomically(self.fs, self._path(LATEST), staging / LATEST)  # names the remote's newest
            copied.append(LATEST)
        return copied


def download(url: str, staging: Path) -> Path:
    """A remote checkpoint file (``load_path``) copied into ``staging``; its local path."""
    fs, path = open_url(url, "load_path")
    if not fs.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {url}; check the URL or drop load_path to start fresh")
    target = Path(staging) / path.rstrip("/").rsplit("/", 1)[-1]
    _get_atomically(fs, path, target)
    return target


def _get_atomically(fs, remote_path: str, target: Path) -> None:
    """Download under a temporary name, then rename: a cut-off download never poses as a checkpoint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.download")
    fs.get_file(remote_path, str(partial))
    os.replace(partial, target)
