"""Checkpoint files: safe to load, checked before use, written atomically.

Layout of a file: a magic line, the SHA-256 of the payload, a newline, then the payload written
by ``torch.save`` holding plain containers and tensors only. Loading verifies the checksum and
uses ``torch.load(weights_only=True)``, so a file can never run code, and a truncated or edited
file is refused with a message that says so.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from speedkit.core import Timestamp, distributed
from speedkit.record.runs import RunRecord, atomic_write_bytes
from speedkit.train.storage import RemoteFolder, download, is_remote, local_path

MAGIC = b"SPEEDKIT-CHECKPOINT\n"
LATEST = "latest.ckpt"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated, tampered with, or from another version."""


def save_checkpoint(path: str | os.PathLike, payload: dict) -> Path:
    buffer = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, **payload}, buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest().encode()
    atomic_write_bytes(path, MAGIC + digest + b"\n" + data)
    return Path(path)


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; check the path or drop load_path to start fresh")
    raw = path.read_bytes()
    if not raw:
        raise CheckpointError(f"{path} is empty (0 bytes): it was cut off before anything was written; "
                              f"use an earlier checkpoint from the same folder")
    if not raw.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a speedkit checkpoint (its header is missing); "
                              f"load plain state dicts with model.load_state_dict instead")
    header_end = len(MAGIC) + 64
    digest, data = raw[len(MAGIC):header_end], raw[header_end + 1:]
    if raw[header_end:header_end + 1] != b"\n" or hashlib.sha256(data).hexdigest().encode() != digest:
        raise CheckpointError(f"{path} is corrupt: its checksum does not match (truncated by a crash, or "
                              f"edited); use an earlier checkpoint from the same folder")
    try:
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # weights_only refuses anything that is not plain data
        raise CheckpointError(f"{path} holds objects that speedkit will not unpickle ({e}); only tensors and "
                              f"plain containers are loaded, and a speedkit checkpoint never holds code, so this "
                              f"file was not written by speedkit or was tampered with: do not use it") from e
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path} holds a {type(payload).__name__}, not a speedkit checkpoint's dictionary; "
                              f"it was not written by speedkit's save_checkpoint: use a checkpoint that was")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version}, this speedkit reads {FORMAT_VERSION}; "
                              f"load it with the speedkit version that wrote it")
    if "algorithms" in payload and "methods" not in payload:  # written before methods had one name
        payload["methods"] = payload.pop("algorithms")
    return payload


# -- random number generators ------------------------------------------------------------------
def rng_state() -> dict:
    """Every RNG a run draws from, as plain data that weights_only loading accepts."""
    np_state = np.random.get_state()
    state = {
        "python": list(random.getstate()[1]) + [random.getstate()[0], random.getstate()[2]],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    *internal, version, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- sharded checkpoints (FSDP) -----------------------------------------------------------------------
# Under FSDP no rank holds the whole model, so the sharded tensors (DTensors: parameters, optimizer
# moments, averages kept by methods) are written by every rank with torch.distributed.checkpoint into a
# folder ``ba000000123.dcp/`` beside the usual file ``ba000000123.ckpt``. That file, written by rank 0,
# holds everything else plus the folder's manifest: its name, each file's SHA-256 and, for every
# sharded tensor, where it sits in the payload with its shape and dtype. Loading checks the manifest
# before torch.distributed.checkpoint reads anything, reads DCP's metadata with an unpickler that only
# builds DCP's own record types, and accepts tensors only, so a sharded checkpoint never runs code
# either. Shards are loaded into tensors made from the manifest: DTensors on the run's device mesh
# when one is given (any number of ranks), plain full tensors when not (one process).
SHARDED_SUFFIX = ".dcp"
_DCP_REF = "__dcp_tensor__"


def _is_dtensor(value) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, DTensor)


def split_sharded(obj, tensors: dict, prefix: str = ""):
    """``obj`` with every DTensor replaced by a reference ``{_DCP_REF: key, "shape", "dtype"}``; the DTensors
    go into ``tensors[key]``. Plain tensors and other values stay (they are the same on every rank)."""
    if _is_dtensor(obj):
        tensors[prefix] = obj
        return {_DCP_REF: prefix, "shape": list(obj.shape), "dtype": str(obj.dtype).removeprefix("torch.")}
    if isinstance(obj, dict):
        return {k: split_sharded(v, tensors, f"{prefix}/{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(split_sharded(v, tensors, f"{prefix}/{i}") for i, v in enumerate(obj))
    return obj


def join_sharded(obj, tensors: dict):
    """The inverse of :func:`split_sharded`: references replaced by ``tensors[key]``."""
    if isinstance(obj, dict):
        if _DCP_REF in obj:
            return tensors[obj[_DCP_REF]]
        return {k: join_sharded(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(join_sharded(v, tensors) for v in obj)
    return obj


def _sharded_refs(obj, out: list) -> list:
    if isinstance(obj, dict):
        if _DCP_REF in obj:
            out.append(obj)
        else:
            for v in obj.values():
                _sharded_refs(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _sharded_refs(v, out)
    return out


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_sharded_checkpoint(path: str | os.PathLike, payload: dict, sharded: dict) -> Path:
    """Write a sharded checkpoint; every rank calls it (it is a collective).

    ``sharded`` holds the parts with DTensors (model, optimizers, method state); ``payload`` the plain
    rest, written by rank 0 with :func:`save_checkpoint` together with the manifest of the shard folder
    ``<path without .ckpt>.dcp``. The folder is written under a temporary name and renamed when complete.
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    folder = path.with_suffix(SHARDED_SUFFIX)
    partial = folder.with_name(f".{folder.name}.partial")
    if distributed.is_main():
        for leftover in path.parent.glob(f".*{SHARDED_SUFFIX}.partial"):  # from a save that was killed
            shutil.rmtree(leftover, ignore_errors=True)
        partial.mkdir(parents=True)
    distributed.barrier()
    tensors: dict = {}
    skeleton = split_sharded(sharded, tensors)
    dcp.save(tensors, storage_writer=dcp.FileSystemWriter(partial))
    if distributed.is_main():
        files = {p.name: _sha256_file(p) for p in sorted(partial.iterdir()) if p.is_file()}
        shutil.rmtree(folder, ignore_errors=True)  # a save at the same batch as an earlier one
        os.replace(partial, folder)
        manifest = {"folder": folder.name, "files": files, "world_size": distributed.world_size(),
                    "skeleton": skeleton}
        save_checkpoint(path, {**payload, "sharded": manifest})
    distributed.barrier()
    return path


class _DCPMetadataUnpickler:
    """Reads torch.distributed.checkpoint's ``.metadata`` (a pickle) building only DCP's record types."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                                   "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                                   "StorageMeta", "_MEM_FORMAT_ENCODING"},
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
        "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
        "collections": {"OrderedDict"},
    }

    @classmethod
    def load(cls, file):
        import pickle

        allowed = cls.ALLOWED

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                found = super().find_class(module, name) if module in allowed or module == "torch" else None
                if module in allowed and name in allowed[module]:
                    return found
                if module == "torch" and isinstance(found, torch.dtype):
                    return found
                raise CheckpointError(f"the shard metadata names {module}.{name}, which a sharded speedkit "
                                      f"checkpoint never holds; the folder was tampered with: do not use it")

        return Unpickler(file).load()


def _safe_dcp_reader(folder: Path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(dcp.FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            with open(Path(self.path) / ".metadata", "rb") as f:
                metadata = _DCPMetadataUnpickler.load(f)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def _tensor_only_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):  # DCP would torch.load(weights_only=False) these
            raise CheckpointError(f"the shard folder holds a pickled object ({read_item.dest_index.fqn}); a "
                                  f"sharded speedkit checkpoint holds tensors only: do not use it")

    return TensorOnlyPlanner()


def _verify_shard_folder(folder: Path, files: dict) -> None:
    """Every file of the manifest present with its SHA-256; each rank checks its share of the files."""
    problems = []
    if not folder.is_dir():
        problems.append(f"its shard folder {folder} is missing")
    else:
        names = sorted(files)
        for name in names[distributed.rank()::distributed.world_size()]:
            file = folder / name
            if not file.is_file():
                problems.append(f"{file} is missing")
            elif _sha256_file(file) != files[name]:
                problems.append(f"{file} is corrupt (its checksum does not match: truncated or edited)")
    problems = [p for rank_problems in distributed.all_gather_object(problems) for p in rank_problems]
    if problems:
        raise CheckpointError(f"sharded checkpoint {folder.with_suffix('.ckpt')} cannot be used: "
                              f"{'; '.join(dict.fromkeys(problems))}; use an earlier checkpoint from the same folder")


def load_sharded_checkpoint(path: str | os.PathLike, payload: dict, mesh=None, map_location="cpu") -> dict:
    """The payload of a sharded checkpoint with its sharded tensors read back in place of the references.

    ``payload`` is what :func:`load_checkpoint` returned for ``path``. With ``mesh`` (a 1-D device mesh,
    every rank calling) the tensors come back as DTensors sharded on dim 0 over it; without, as plain
    full tensors in this process.
    """
    import torch.distributed.checkpoint as dcp

    manifest = payload["sharded"]
    if not isinstance(manifest, dict) or not {"folder", "files", "skeleton"} <= set(manifest):
        raise CheckpointError(f"{path} names a shard folder but not its manifest; it was not written by speedkit")
    folder = Path(path).parent / str(manifest["folder"])
    if Path(manifest["folder"]).name != manifest["folder"] or not manifest["folder"].endswith(SHARDED_SUFFIX):
        raise CheckpointError(f"{path} names shard folder {manifest['folder']!r} outside its own folder; refused")
    _verify_shard_folder(folder, manifest["files"])
    targets = {}
    for ref in _sharded_refs(manifest["skeleton"], []):
        dtype = getattr(torch, str(ref["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"{path} gives shard dtype {ref['dtype']!r}, which is not a torch dtype")
        shape = [int(s) for s in ref["shape"]]
        if mesh is not None:
            from torch.distributed.tensor import Shard, empty

            targets[ref[_DCP_REF]] = empty(shape, dtype=dtype, device_mesh=mesh, placements=[Shard(0)])
        else:
            targets[ref[_DCP_REF]] = torch.empty(shape, dtype=dtype, device=map_location)
    try:
        # Without a mesh each process reads whole tensors on its own: no collectives (nor DCP's warning about it).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(targets, storage_reader=_safe_dcp_reader(folder), planner=_tensor_only_planner(),
                     no_dist=mesh is None)
    except (CheckpointError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException holding each rank's failure
        inner = [getattr(w, "exception", w) for w in getattr(e, "failures", {}).values()] or [e]
        raise CheckpointError(f"sharded checkpoint {path} could not be read from {folder} "
                              f"({type(inner[0]).__name__}: {inner[0]}); use an earlier checkpoint from the same "
                              f"folder") from e
    return {**payload, **join_sharded(manifest["skeleton"], targets)}


# -- a run's checkpoints ------------------------------------------------------------------------------
class Checkpointer:
    """A run's checkpoints: what goes into one, writing ``ba{batch}.ckpt`` and ``latest.ckpt``, keeping the
    newest few, and resuming from one. The run's parallel plan (``speedkit.train.parallel``) does its part:
    under DDP rank 0 writes with every rank's RNG; under FSDP every rank writes its shards.

    ``state`` is the run's State, ``logger`` its Logger, ``plan`` its parallel plan. ``folder`` is the run's
    ``save_folder``: None for ``local`` (the run folder's ``checkpoints/``), a path, or an fsspec URL
    (``s3://...``, ``memory://...``), whose checkpoints are written in ``local`` and mirrored there (see
    ``speedkit.train.storage``).
    """

    def __init__(self, folder: str | os.PathLike | None, state, logger, plan, *, run_name: str, keep: int = 3,
                 local: str | os.PathLike):
        self.remote = RemoteFolder(str(folder)) if is_remote(folder) else None
        self.folder = Path(local) if not folder or self.remote else local_path(folder)
        self.keep = keep
        self.state, self.logger, self.plan, self.run_name = state, logger, plan, run_name

    @property
    def latest(self) -> Path:
        return self.folder / LATEST

    # -- writing -----------------------------------------------------------------------------
    def payload(self, rng_by_rank: list | None = None) -> dict:
        """Everything a resume needs, as plain data and tensors."""
        state = self.state
        return {
            "model": state.model.state_dict(),
            "optimizers": [opt.state_dict() for opt in state.optimizers],
            "schedulers": [s.state_dict() for s in _torch_schedulers(state)],
            "grad_scaler": state.grad_scaler.state_dict() if state.grad_scaler is not None else None,
            "methods": {a.name: a.state_dict() for a in state.methods},
            "callbacks": {type(cb).__name__: cb.state_dict() for cb in state.callbacks},
            "timestamp": state.timestamp.to_dict(),
            "rng": rng_state(),
            "record": state.record.to_json(),
            "run_name": self.run_name,
            **({"rng_by_rank": rng_by_rank} if rng_by_rank else {}),
        }

    @staticmethod
    def rng_state() -> dict:
        return rng_state()

    def write(self, path: Path, payload: dict) -> Path:
        return save_checkpoint(path, payload)

    def write_sharded(self, path: Path, payload: dict, sharded: dict) -> Path:
        return save_sharded_checkpoint(path, payload, sharded)

    def save(self) -> Path:
        """Write ``ba{batch}.ckpt`` and point ``latest.ckpt`` at it, both atomically; keep the newest few.

        Under torchrun only rank 0 writes (DDP: the plain module's weights, so one process can resume
        it); under FSDP every rank writes its shards beside it (``ba{batch}.dcp/``).
        """
        state = self.state
        start = time.perf_counter()
        state.record.timings["train_s"] = round(state.timestamp.wall_s, 4)
        path = self.folder / f"ba{state.timestamp.batch:09d}.ckpt"
        if not self.plan.save_checkpoint(self, path, state, self.logger):
            return path
        state.record.notes["last_checkpoint"] = str(path)  # on a file system all ranks share
        if distributed.is_main():
            self._point_latest_at(path)
            if self.remote is not None:
                self.remote.upload(path, self.latest, self.keep, SHARDED_SUFFIX)
                state.record.notes["remote_checkpoints"] = self.remote.url
            state.record.save()
            state.record.add_timing("checkpoint_s", time.perf_counter() - start)
        return path

    def _point_latest_at(self, path: Path) -> None:
        """Make ``latest.ckpt`` name ``path`` atomically, then drop all but the newest few checkpoints."""
        tmp = self.folder / f".{LATEST}.link"
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp)  # a second name for the same bytes: instant, and atomic with the rename
        except OSError:  # file systems without hard links
            shutil.copyfile(path, tmp)
        os.replace(tmp, self.latest)
        for old in sorted(self.folder.glob("ba*.ckpt"))[:-self.keep]:
            old.unlink()
            shutil.rmtree(old.with_suffix(SHARDED_SUFFIX), ignore_errors=True)  # an FSDP checkpoint's shards

    def remove_partial_writes(self) -> None:
        """Delete temp files that a killed save left behind (they never replaced a checkpoint)."""
        if not self.folder.is_dir():
            return
        for pattern in (".ba*.ckpt.*.tmp", f".{LATEST}.link"):
            for leftover in self.folder.glob(pattern):
                leftover.unlink(missing_ok=True)

    # -- resuming ----------------------------------------------------------------------------
    def resume(self, load_path: str | os.PathLike | None = None, autoresume: bool = False) -> dict | None:
        """Load ``load_path`` (or, with ``autoresume``, the newest checkpoint of the run that verifies) into
        the run's state.

        An explicit ``load_path`` that cannot be used is an error. With ``autoresume`` a checkpoint that does
        not verify (``latest.ckpt`` cut off or corrupted on disk) is passed over for the next newest one; it
        is kept, renamed ``<name>.unusable`` (so that the resumed run's saves neither overwrite nor prune
        it), and the log, a warning and ``record.notes["resume_passed_over"]`` say which file and why.
        Returns the RNG state the run continues from (set when its next epoch starts), None when nothing
        was loaded.
        """
        load_path = self._fetch_remote(load_path, autoresume)
        candidates = [Path(load_path)] if load_path is not None else self._autoresume_candidates() if autoresume else []
        seen = self.plan.ranks_that_see(bool(candidates))
        if len(set(seen)) > 1:
            raise CheckpointError(f"ranks disagree on resuming from {self.latest}: ranks "
                                  f"{[r for r, s in enumerate(seen) if not s]} do not see it; checkpoints must "
                                  f"be on a file system every rank shares")
        if not candidates:
            return None
        if load_path is not None:
            path, payload, passed_over = candidates[0], self._verified(candidates[0]), []
        else:
            path, payload, passed_over = self._newest_verified(candidates)
        self._load_payload(payload, path)
        if passed_over:
            self._keep_aside(passed_over, path)
        if self.plan.world > 1 and len(payload.get("rng_by_rank") or ()) != self.plan.world:
            note = (f"resumed from {path}, which holds one RNG state (written by one process, or by rank 0 alone "
                    f"after a failed or interrupted run): all {self.plan.world} ranks continue from it until the "
                    f"next epoch re-seeds each, so their random draws differ from an uninterrupted run")
            self.state.record.notes["rng_not_restored_per_rank"] = note
            self.logger.log_text(note)
        return self.plan.resume_rng(payload)

    def _fetch_remote(self, load_path, autoresume: bool) -> Path | None:
        """Remote checkpoints copied into the local folder before a resume (rank 0 copies, the others wait);
        ``load_path`` as a local path."""
        if is_remote(load_path):
            if distributed.is_main():
                download(str(load_path), self.folder)
            distributed.barrier()
            return self.folder / str(load_path).rstrip("/").rsplit("/", 1)[-1]
        if self.remote is not None and autoresume and load_path is None:
            if distributed.is_main():
                self.remote.download_missing(self.folder, SHARDED_SUFFIX)
            distributed.barrier()
        return None if load_path is None else local_path(load_path)

    def _verified(self, path: Path) -> dict:
        """The checkpoint's payload, every check passed (shards included); CheckpointError otherwise."""
        payload = load_checkpoint(path, map_location=self.state.device)
        if payload.get("sharded") is not None:
            payload = load_sharded_checkpoint(path, payload, mesh=self.plan.device_mesh(self.state.model),
                                              map_location=self.state.device)
        return payload

    def _autoresume_candidates(self) -> list[Path]:
        """The run's checkpoints newest first: ``ba{batch}.ckpt`` by batch, ``latest.ckpt`` before the file it
        names (it is a second name for it), or first when it names none of them (copied, not linked)."""
        files = sorted(self.folder.glob("ba*.ckpt"), reverse=True)
        if not self.latest.exists():
            return files
        same = [i for i, f in enumerate(files) if _same_file(f, self.latest)]
        at = same[0] if same else 0
        return files[:at] + [self.latest] + files[at:]

    def _newest_verified(self, candidates: list[Path]) -> tuple[Path, dict, list[tuple[Path, str]]]:
        """The first candidate that verifies on every rank, its payload, and (path, why) for those passed over."""
        passed_over: list[tuple[Path, str]] = []
        for path in candidates:
            earlier = [why for bad, why in passed_over if _same_file(bad, path)]
            if earlier:  # ba{batch}.ckpt after a bad latest.ckpt that names it: the same bytes
                passed_over.append((path, f"{earlier[0]} (the same file as {self.latest.name})"))
                continue
            try:
                payload, why = self._verified(path), None
            except CheckpointError as error:
                payload, why = None, str(error)
            # Every rank must load the same checkpoint (a sharded load is collective): any rank's failure counts.
            reasons = [r for r in distributed.all_gather_object(why) if r is not None]
            if not reasons:
                return path, payload, passed_over
            passed_over.append((path, reasons[0]))
        raise CheckpointError(f"autoresume: no checkpoint in {self.folder} can be used (all are kept as they "
                              f"are): " + "; ".join(why for _, why in passed_over) +
                              f". Resume from a copy of the run, or start afresh under another run name")

    def _keep_aside(self, passed_over: list[tuple[Path, str]], resumed_from: Path) -> None:
        """Rename the checkpoints passed over to ``<name>.unusable`` (never delete them) and say so."""
        notes = []
        for path, why in passed_over:
            kept = _free_name(path.with_name(path.name + ".unusable"))
            if distributed.is_main():
                os.replace(path, kept)
                shards = path.with_suffix(SHARDED_SUFFIX)
                if shards.is_dir():  # an FSDP checkpoint's shards go with it, out of later saves' way
                    os.replace(shards, _free_name(shards.with_name(shards.name + ".unusable")))
            message = f"autoresume: passed over {path} and kept it as {kept.name}: {why}"
            self.logger.log_text(message + f"; resumed from {resumed_from} instead")
            warnings.warn(message, stacklevel=3)
            notes.append({"file": str(path), "kept_as": str(kept), "reason": why})
        self.state.record.notes["resume_passed_over"] = notes

    def _load_payload(self, payload: dict, path) -> None:
        state = self.state
        try:
            self._load_weights(payload)
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path} does not fit this model/optimizer ({e}); it was written by a "
                                  f"different configuration") from e
        for method in state.methods:
            method.load_state_dict(payload["methods"].get(method.name, {}))
        saved_callbacks = payload.get("callbacks", {})
        for callback in state.callbacks:
            if type(callback).__name__ in saved_callbacks:
                callback.load_state_dict(saved_callbacks[type(callback).__name__])
        state.timestamp = Timestamp.from_dict(payload["timestamp"])
        previous = RunRecord.from_dict(json.loads(payload["record"]))
        record = state.record
        record.run_id, record.created = previous.run_id, previous.created
        record.steps, record.evals, record.timings = previous.steps, previous.evals, previous.timings
        record.notes = {**previous.notes, "resumed_from": str(path)}
        state.eval_metrics = {}
        self.logger.log_text(f"resumed from {path} at epoch {state.timestamp.epoch}, batch {state.timestamp.batch}")

    def _load_weights(self, payload: dict) -> None:
        """Model, optimizers, schedulers and loss scaler; a sharded payload's are keyed by parameter name."""
        state = self.state
        if payload.get("sharded") is not None:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            set_state_dict(state.model, [getattr(o, "base_optimizer", o) for o in state.optimizers],
                           model_state_dict=payload["model"], optim_state_dict=payload["optimizers"])
        else:
            state.model.load_state_dict(payload["model"])
            for opt, sd in zip(state.optimizers, payload["optimizers"]):
                opt.load_state_dict(sd)
        for sched, sd in zip(_torch_schedulers(state), payload["schedulers"]):
            sched.load_state_dict(sd)
        if state.grad_scaler is not None and payload.get("grad_scaler"):
            state.grad_scaler.load_state_dict(payload["grad_scaler"])


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _free_name(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... : the first that does not exist."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.name}-{n}")
    return free


def _torch_schedulers(state) -> list:
    return [s for s in state.schedulers if isinstance(s, torch.optim.lr_scheduler.LRScheduler)]
