"""The checkpoint file format: the one module that knows what a checkpoint file holds and how it is laid out.

A file: a magic line, the SHA-256 of the payload, a newline, then the payload written by ``torch.save``
holding plain containers and tensors only. Loading verifies the checksum and uses
``torch.load(weights_only=True)``, so a file can never run code, and a truncated or edited file is refused
with a message that says so.

The payload is a dictionary whose keys are the fields of :class:`CheckpointContents` (plus
``format_version``, and ``sharded`` in a sharded checkpoint). Everything else in speedkit reads and writes
checkpoints through :func:`write`, :func:`write_sharded` and :func:`read`, and sees a
:class:`CheckpointContents`, never the payload's keys. ``save_checkpoint``/``load_checkpoint`` are the
low-level face (a payload dictionary in and out), for tools that inspect a file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from speedkit.core import distributed
from speedkit.record.runs import atomic_write_bytes

MAGIC = b"SPEEDKIT-CHECKPOINT\n"
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
        with torch.serialization.safe_globals(_numpy_numbers()):
            payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # weights_only refuses anything that is not plain data
        raise CheckpointError(f"{path} holds objects that speedkit will not unpickle ({_refused_object(e)}); only tensors and "
                              f"plain containers are loaded, and a speedkit checkpoint never holds code, so this "
                              f"file was not written by speedkit or was tampered with: do not use it") from e
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path} holds a {type(payload).__name__}, not a speedkit checkpoint's dictionary; "
                              f"it was not written by speedkit's save_checkpoint: use a checkpoint that was")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version}, this speedkit reads {FORMAT_VERSION}; "
                              f"load it with the speedkit version that wrote it")
    return _upgraded(payload)


def _numpy_numbers() -> list:
    """What a numpy number (``np.int64(10)``) unpickles through: numpy's scalar constructor and the numeric dtypes,
    never arrays nor the ``object`` dtype, so it builds a number and never runs code. A streamed run's checkpoint
    written before its loader stored litdata's state as plain ints holds such numbers."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray.scalar, np.dtype, *{type(np.dtype(code)) for code in "?bhilqBHILQefd"}]


def _refused_object(error: Exception) -> str:
    """What torch's weights-only unpickler refused, without its advice to load with weights_only=False: a speedkit
    checkpoint never needs that, and following it would run whatever code the file holds."""
    for line in str(error).splitlines():
        if "Unsupported global" in line or "WeightsUnpickler error" in line:
            text = line.split("WeightsUnpickler error:", 1)[-1].strip()
            return text.split(". ")[0].rstrip(".")
    return type(error).__name__


def _upgraded(payload: dict) -> dict:
    """A payload written by an earlier speedkit, in today's keys (same format version: only names moved)."""
    if "algorithms" in payload and "methods" not in payload:  # written before methods had one name
        payload["methods"] = payload.pop("algorithms")
    if "microbatching" not in payload and isinstance(payload.get("record"), str):
        # Written before Microbatching kept its own state: the size an "auto" run settled on was in its record.
        note = json.loads(payload["record"]).get("notes", {}).get("auto_microbatch") or {}
        if note.get("microbatch_size"):
            payload["microbatching"] = {"size": int(note["microbatch_size"]), "reductions": note.get("reductions", [])}
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


def split_sharded(obj, tensors: dict, prefix: str = ""):
    """``obj`` with every DTensor replaced by a reference ``{_DCP_REF: key, "shape", "dtype"}``; the DTensors
    go into ``tensors[key]``. Plain tensors and other values stay (they are the same on every rank)."""
    if distributed.is_dtensor(obj):
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


# -- what a checkpoint holds ----------------------------------------------------------------------------
@dataclasses.dataclass
class CheckpointContents:
    """Everything a resume needs, as plain data and tensors: one field per payload key.

    ``model`` and ``optimizers`` are the plain ``state_dict()``s, or, when ``sharded`` (FSDP), the state
    dicts of ``torch.distributed.checkpoint.state_dict.get_state_dict`` keyed by parameter name. Each
    component keeps its own state: ``methods`` and ``callbacks`` by name, ``microbatching`` the microbatch
    size a run settled on. ``record`` is the run's RunRecord as JSON (its history, carried on by a resume);
    ``rng_by_rank`` every rank's RNG state when the ranks gathered them (``rng`` is this process's).
    """

    model: dict
    optimizers: list
    schedulers: list
    grad_scaler: dict | None
    methods: dict
    callbacks: dict
    microbatching: dict
    timestamp: dict
    rng: dict
    record: str
    run_name: str | None = None
    rng_by_rank: list | None = None
    dataloader: dict | None = None  # the training loader's own state, for a loader that keeps one (streaming)
    sharded: bool = False  # read from (or to be written as) a sharded checkpoint

    @property
    def record_dict(self) -> dict:
        return json.loads(self.record)


# Under FSDP these fields hold DTensors, so they go into the shard folder; the rest into the file.
SHARDED_FIELDS = ("model", "optimizers", "methods", "callbacks")
_OPTIONAL = {"schedulers": [], "methods": {}, "callbacks": {}, "microbatching": {}}  # empty when absent


def _payload(contents: CheckpointContents) -> dict:
    payload = {f.name: getattr(contents, f.name) for f in dataclasses.fields(contents) if f.name != "sharded"}
    if not payload["rng_by_rank"]:
        del payload["rng_by_rank"]  # one process's checkpoint holds its one RNG state
    if payload["dataloader"] is None:
        del payload["dataloader"]
    return payload


def _contents(payload: dict) -> CheckpointContents:
    """The payload's fields; one a hand-made file lacks is None (or empty), so a tool reading only the weights
    (export) takes a file holding only them."""
    fields = {f.name: payload.get(f.name, _OPTIONAL.get(f.name)) for f in dataclasses.fields(CheckpointContents)
              if f.name != "sharded"}
    return CheckpointContents(**fields, sharded=payload.get("sharded") is not None)


def write(path: str | os.PathLike, contents: CheckpointContents) -> Path:
    """Write ``contents`` as one checkpoint file at ``path``, atomically."""
    return save_checkpoint(path, _payload(contents))


def write_sharded(path: str | os.PathLike, contents: CheckpointContents) -> Path:
    """Write ``contents`` as a sharded checkpoint (:data:`SHARDED_FIELDS` in the shard folder); every rank calls it."""
    payload = _payload(contents)
    sharded = {name: payload.pop(name) for name in SHARDED_FIELDS}
    return save_sharded_checkpoint(path, payload, sharded)


def read(path: str | os.PathLike, map_location="cpu", mesh=None) -> CheckpointContents:
    """The verified contents of the checkpoint at ``path`` (its shards too); CheckpointError otherwise.

    A sharded checkpoint's tensors come back as DTensors on ``mesh`` (every rank calling), or without one as
    plain full tensors in this process (see :func:`load_sharded_checkpoint`)."""
    payload = load_checkpoint(path, map_location=map_location)
    if payload.get("sharded") is not None:
        payload = load_sharded_checkpoint(path, payload, mesh=mesh, map_location=map_location)
    return _contents(payload)


def read_record(path: str | os.PathLike) -> dict:
    """The run's record as the checkpoint at ``path`` holds it (verified; a sharded checkpoint's shards are not
    read): the run description its weights were trained under. CheckpointError when it cannot be used."""
    try:
        return json.loads(load_checkpoint(path)["record"])
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path} holds no readable record of its run ({type(e).__name__}: {e})") from e
