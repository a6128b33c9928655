"""The shard folder ``speedkit data prepare`` writes, and the checks that make a half-written or altered one
impossible to take as complete.

Layout (``OUT`` is the folder given to ``--out``)::

    OUT/speedkit-shards.json        the manifest: what the shards hold; written last, "complete": true at the end
    OUT/train/index.json            litdata's index of the split's chunks (a StreamingDataset reads it)
    OUT/train/chunk-P-K.bin         chunks written by part P (litdata's BinaryWriter, one writer per part)
    OUT/train/P.index.json          part P's own index, written by its writer
    OUT/train/P.done                part P finished: its index verified against its chunks (atomic)
    OUT/val/...                     the same for the validation split
    OUT/.prepare/plan.json          the work list a rerun continues from (source fingerprint, options)
    OUT/tokenizer.json              text only: the tokenizer the tokens were made with

A part is the unit of work and of resuming: it is written by one writer and marked done only after its writer
finished and its chunks were checked against its index. A rerun keeps done parts whose chunks are still there
with their sizes (with ``--verify``, their SHA-256 too) and deletes and redoes the rest, so a kill at any moment
loses at most the parts in flight, and a chunk deleted or cut short since is written again. The split's
``index.json`` lists the chunks of done parts only (written atomically), so a folder left by a prepare that
stopped (out of disk) is usable up to its last complete part (the validation parts are written first), and its
manifest says it is partial.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from speedkit.data.streaming.errors import INDEX, MANIFEST, ShardError
from speedkit.record.runs import atomic_write_bytes

FORMAT = "speedkit-shards"
VERSION = 1
PLAN_DIR = ".prepare"
PART_SIZE, PART_BYTES = 1024, 64 << 20  # prepare's parts by default: images in one, bytes of text files in one
SPLITS = ("train", "val")


def disable_litdata_network() -> None:
    """litdata may ask PyPI for a newer version when imported; speedkit downloads nothing behind the user's back.
    Also says how to install litdata when it is missing."""
    os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    os.environ.setdefault("LITDATA_CHECK_UPDATES", "0")
    require("litdata")


def require(package: str) -> None:
    """ImportError with the fix when the ``stream`` extra's ``package`` is not installed."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ImportError(f"streaming data needs {package}: pip install 'torch-speedkit[stream]' (litdata and tokenizers)")


def write_json(path: Path, value) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def is_shard_folder(path) -> bool:
    """True for a folder ``speedkit data prepare`` wrote (complete or not), and for an object-store URL (it can
    only be one: reading it checks, see :func:`read_shards`)."""
    from speedkit.data.streaming.remote import is_url

    if is_url(path):
        return True
    return path is not None and (Path(path).expanduser() / MANIFEST).is_file()


# -- parts --------------------------------------------------------------------------------------------------
def part_files(split_dir: Path, part: int) -> list[Path]:
    return sorted(split_dir.glob(f"chunk-{part}-*.bin")) + [split_dir / f"{part}.{INDEX}"]


def done_marker(split_dir: Path, part: int) -> Path:
    return split_dir / f"{part}.done"


def intact_part(split_dir: Path, part: int, needs: tuple = (), contents: bool = False) -> bool:
    """Part ``part`` was marked done with the keys ``needs`` and its chunks are still as written: each one its
    index lists is there with the size the index gives (a stat per chunk), and with ``contents`` each one's SHA-256
    is the one recorded (reads every byte). A rerun of prepare redoes a part that is not."""
    try:
        info = json.loads(done_marker(split_dir, part).read_text())
        chunks = json.loads((split_dir / f"{part}.{INDEX}").read_text())["chunks"] if info["chunks"] else []
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if any(key not in info for key in needs) or [c["filename"] for c in chunks] != info["chunks"]:
        return False
    for chunk in chunks:
        path = split_dir / chunk["filename"]
        if not path.is_file() or path.stat().st_size != int(chunk["chunk_bytes"]):
            return False
        if contents and _sha256(path) != info.get("sha256", {}).get(chunk["filename"]):
            return False
    return True


def discard_part(split_dir: Path, part: int) -> None:
    """Remove whatever an unfinished part left (chunks, its index); its marker last, if any."""
    for path in part_files(split_dir, part):
        path.unlink(missing_ok=True)
    done_marker(split_dir, part).unlink(missing_ok=True)


def finish_part(split_dir: Path, part: int, info: dict) -> None:
    """Check part ``part``'s chunks against the index its writer wrote, then mark it done (atomically), with
    ``info`` (all the part's statistics: the marker is written last, so a kill before it redoes the part) and each
    chunk's SHA-256 (``speedkit data info --verify`` checks them). A part of no samples has no chunks."""
    if not info.get("samples"):
        write_json(done_marker(split_dir, part), {**info, "chunks": []})
        return
    index = json.loads((split_dir / f"{part}.{INDEX}").read_text())
    check_chunks(split_dir, index["chunks"], where=f"part {part} of {split_dir}",
                 fix="the disk changed them as they were written; run the same prepare again")
    write_json(done_marker(split_dir, part), {**info, "chunks": [c["filename"] for c in index["chunks"]],
                                              "sha256": {c["filename"]: _sha256(split_dir / c["filename"])
                                                         for c in index["chunks"]}})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_contents(shards: "ShardSet") -> list[str]:
    """Every chunk's SHA-256 against the one recorded when its part was written (reads every byte); the files
    that differ, as messages. Shards in an object store: their objects, read from the store."""
    if shards.url:
        from speedkit.data.streaming.remote import verify_remote

        return verify_remote(shards)
    problems = []
    for split in shards.manifest["splits"]:
        split_dir = shards.split_dir(split)
        for marker in sorted(split_dir.glob("*.done")):
            for name, expected in json.loads(marker.read_text()).get("sha256", {}).items():
                path = split_dir / name
                if not path.is_file():
                    problems.append(f"{path} is missing")
                elif _sha256(path) != expected:
                    problems.append(f"{path} was altered since it was written (its SHA-256 differs)")
    return problems


def merge_index(split_dir: Path, parts: Iterable[int]) -> dict:
    """``index.json`` over the done parts' chunks in part order (the order samples were planned in)."""
    chunks, config = [], None
    for part in parts:
        index = json.loads((split_dir / f"{part}.{INDEX}").read_text())
        chunks += index["chunks"]
        config = config or index["config"]
    merged = {"chunks": chunks, "config": config, "updated_at": "speedkit"}
    write_json(split_dir / INDEX, merged)
    return merged


def check_chunks(split_dir: Path, chunks: list, where: str, fix: str) -> None:
    """Every chunk the index lists is there with the size the index says; ShardError naming the first that is not,
    and ``fix``."""
    for chunk in chunks:
        path = split_dir / chunk["filename"]
        if not path.is_file():
            raise ShardError(f"{where}: {path} is missing but its index lists it; the shards were moved or deleted "
                             f"in part: {fix}")
        size, expected = path.stat().st_size, int(chunk["chunk_bytes"])
        if size != expected:
            what = "it was cut short (a copy that stopped, a full disk)" if size < expected else "it was replaced"
            raise ShardError(f"{where}: {path} holds {size} bytes but its index says {expected}: {what}; {fix}")


def prepare_command(manifest: dict, out, verify: bool = False) -> str:
    """The ``speedkit data prepare`` command that wrote the folder ``out`` (its source and options, from the
    manifest); run again, it redoes the parts whose chunks are missing or cut short (``verify``: also those whose
    bytes changed)."""
    options, kind = manifest.get("options", {}), manifest.get("kind")
    words = ["speedkit data prepare", str(manifest.get("source", "SOURCE")), "--out", str(out)]
    if kind == "images":
        words += ["--short-side", options.get("short_side"), "--quality", options.get("quality")]
    elif kind == "tokens":
        tokenizer = str(options.get("tokenizer", ""))
        words += (["--vocab-size", tokenizer.removeprefix("bpe-")] if tokenizer.startswith("bpe-")
                  else ["--tokenizer", "TOKENIZER.json (the one it was prepared with)"])
        words += ["--block", options.get("block")] + ([] if options.get("shuffle_blocks", True) else ["--keep-order"])
    words += ["--val-fraction", options.get("val_fraction"), "--seed", options.get("seed")]
    return " ".join(map(str, words + (["--verify"] if verify else [])))


def repair_advice(shards: "ShardSet", verify: bool = False) -> str:
    """What redoes a damaged chunk of ``shards``: the prepare command again, into the folder (or, for shards in an
    object store, into the local folder they were uploaded from, then the upload again); the Python call when the
    shards were prepared with part sizes the command does not set."""
    manifest, out = shards.manifest, ("DIR" if shards.url else shards.root)
    options, defaults = manifest.get("options", {}), {"part_size": PART_SIZE, "part_bytes": PART_BYTES}
    python_only = [f"{k}={options[k]}" for k in defaults if options.get(k, defaults[k]) != defaults[k]]
    if python_only:
        function = "prepare_images" if manifest.get("kind") == "images" else "prepare_text"
        redo = (f"call `speedkit.data.streaming.{function}({str(manifest.get('source'))!r}, {str(out)!r}, "
                f"{', '.join(python_only + (['verify=True'] if verify else []))})` again, with the other options it "
                f"was prepared with ({options}),")
    else:
        redo = f"run `{prepare_command(manifest, out, verify)}`"
    if shards.url:
        return (f"{redo} into the local folder they were uploaded from to redo them, then upload it again (aws s3 "
                f"sync DIR {shards.url})")
    return f"{redo} to redo them"


# -- the manifest -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ShardSet:
    """A shard folder's manifest, read and checked: ``kind`` is ``"images"`` or ``"tokens"``."""
    root: Path
    manifest: dict
    url: "str | None" = None  # where it is stored when that is an object store; ``root`` is then its cache

    @property
    def location(self) -> str:
        """The URL of shards in an object store, else the folder (what messages name)."""
        return self.url or str(self.root)

    def split_source(self, split: str):
        """What litdata's StreamingDataset reads the split from: the folder, or the URL with its cache folder."""
        if self.url is None:
            return str(self.split_dir(split))
        from litdata.streaming.resolver import Dir

        from speedkit.data.streaming.remote import allow_http_endpoints

        allow_http_endpoints()
        return Dir(path=str(self.split_dir(split)), url=f"{self.url}/{split}")

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def split_dir(self, split: str) -> Path:
        return self.root / split

    def samples(self, split: str) -> int:
        return int(self.manifest["splits"].get(split, {}).get("samples", 0))

    @property
    def fingerprint(self) -> str:
        """What identifies the data a run trained on: the hash of every split's index (chunk names and sizes)
        and the manifest's content options; a loader's state carries it, and a resume refuses another."""
        digest = hashlib.sha256(json.dumps({k: self.manifest.get(k) for k in ("kind", "options", "classes")},
                                           sort_keys=True).encode())
        for split in SPLITS:
            index = self.split_dir(split) / INDEX
            if index.is_file():
                digest.update(index.read_bytes())
        return digest.hexdigest()[:16]


def read_shards(root, *, need_complete: bool = False) -> ShardSet:
    """The shard folder at ``root``, its manifest and every split's chunks checked against the split's index.

    A partial folder (a prepare that stopped) is refused with ``need_complete``; otherwise it is returned and its
    ``complete`` is False. Chunks that do not match their index are refused, naming the file. ``root`` may be an
    ``s3://bucket/prefix`` URL (:mod:`speedkit.data.streaming.remote`): the same checks, on the store's files."""
    from speedkit.data.streaming import remote

    if isinstance(root, ShardSet):
        root = root.url or root.root
    if remote.is_url(root):
        return _read_remote(root, need_complete)
    root = Path(root).expanduser()
    path = root / MANIFEST
    if not path.is_file():
        raise ShardError(f"{root} is not a shard folder ({MANIFEST} is missing); make one with "
                         f"`speedkit data prepare SOURCE --out {root}`")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ShardError(f"{path} cannot be read ({e}); run `speedkit data prepare` again into {root}") from None
    shards = ShardSet(root, parse_manifest(raw, str(root)))
    if need_complete:
        check_complete(shards)
    for split in shards.manifest["splits"]:
        index_path = shards.split_dir(split) / INDEX
        if not index_path.is_file():
            raise ShardError(f"{root}: the {split} split's {INDEX} is missing; run `speedkit data prepare` again")
        index = parse_index(index_path.read_bytes(), str(index_path))
        check_index(shards, split, index, str(index_path))
        check_chunks(shards.split_dir(split), index["chunks"], where=str(root), fix=repair_advice(shards))
    return shards


def _read_remote(url: str, need_complete: bool) -> ShardSet:
    """The shard folder at an object-store URL, checked as a local one is (the chunks by the sizes the store
    lists), its manifest, indexes and tokenizer then cached (:mod:`speedkit.data.streaming.remote`)."""
    from speedkit.data.streaming import remote

    fetched = remote.fetch(url, parse_manifest)
    shards = ShardSet(fetched.cache, fetched.manifest, url=fetched.url)
    for split, raw in fetched.indexes.items():
        where = f"{fetched.url}/{split}/{INDEX}"
        index = parse_index(raw, where)
        check_index(shards, split, index, where)
        remote.check_sizes(fetched, split, index["chunks"])
    if need_complete:
        check_complete(shards)
    remote.store(fetched)  # checked: the cache now mirrors the store
    return shards


def parse_manifest(raw: bytes, where: str) -> dict:
    """A manifest's bytes read and checked for its format and version (``where``: the folder or URL)."""
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ShardError(f"{where}/{MANIFEST} cannot be read ({e}); run `speedkit data prepare` again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ShardError(f"{where}/{MANIFEST} is not a speedkit shard manifest of version {VERSION}; prepare the "
                         f"data again with this speedkit")
    return manifest


def parse_index(raw: bytes, where: str) -> dict:
    try:
        index = json.loads(raw)
        if not isinstance(index.get("chunks"), list):
            raise ValueError("it lists no chunks")
    except (ValueError, UnicodeDecodeError, AttributeError) as e:
        raise ShardError(f"{where} cannot be read ({e}): the index was replaced; run `speedkit data prepare` "
                         f"again") from None
    return index


def check_complete(shards: ShardSet) -> None:
    if not shards.complete:
        raise ShardError(f"{shards.location} holds a prepare that did not finish "
                         f"({shards.manifest.get('stopped', 'stopped')}); run the same `speedkit data prepare` again "
                         f"to complete it")


def check_index(shards: ShardSet, split: str, index: dict, where: str) -> None:
    """The split's index agrees with the manifest (chunk and sample counts)."""
    info = shards.manifest["splits"][split]
    if int(info.get("chunks", -1)) != len(index["chunks"]):
        raise ShardError(f"{where} lists {len(index['chunks'])} chunks but {MANIFEST} says "
                         f"{info.get('chunks')}: the index was replaced; run `speedkit data prepare` again")
    count = sum(int(c["chunk_size"]) for c in index["chunks"])
    if count != int(info["samples"]):
        raise ShardError(f"{where} holds {count} samples but {MANIFEST} says {info['samples']}: the "
                         f"shards do not match their manifest; run `speedkit data prepare` again")
