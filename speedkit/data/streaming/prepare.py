"""``speedkit data prepare``: an image folder or a text folder turned into litdata shards, once.

Images: every image resized so its short side is ``short_side`` (larger ones only: nothing is upscaled) and
stored as JPEG bytes with its label and a stable sample id (its position in the split's sorted file list), so
a loader decodes small files fast (FFCV's idea) and a run can count which samples it saw. The samples are
written in a seeded shuffled order, so a chunk holds many classes and a streamed batch does too.

Text: the files split train/validation by file (as the in-memory text tasks do), tokenized with a
``tokenizer.json`` the user gives (Hugging Face ``tokenizers``) or a byte-level BPE trained on the training
files and saved beside the shards; tokens stored in blocks of ``block + 1`` (uint16 where the vocabulary fits,
else uint32), consecutive blocks sharing one token, so a block gives ``block / seq_len`` training windows. The
blocks are written in a seeded shuffled order (and files go to parts at random), as images are: litdata shuffles
within regions of a chunk, so a run shorter than an epoch trains on a few regions, which in document order are a
few documents; shuffled, they sample the whole corpus. A block's id is its place in the text.

Work is split into parts (see :mod:`speedkit.data.streaming.shards`): a kill loses only the parts in flight,
and a rerun of the same command continues, writing again the parts whose chunks were deleted or cut short since
(``verify``: or altered). Nothing is downloaded.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import random
import shutil
from pathlib import Path
from typing import Callable, Sequence

from speedkit.data.fingerprint import source_identity
from speedkit.data.folder_split import (GIVEN_SPLIT, IMAGE_EXTENSIONS, SPLIT_RULE, VAL_NAMES, has_given_split,
                                        split_by_class)
from speedkit.data.streaming import shards as S

TEXT_EXTENSIONS = (".txt", ".rst", ".md")
EOS = "<|endoftext|>"
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclasses.dataclass
class PrepareResult:
    out: Path
    kind: str
    samples: dict  # split -> samples written
    skipped: list  # (path, why) left out with skip_bad
    complete: bool
    message: str = ""
    also: list = dataclasses.field(default_factory=list)  # what else a user should know, a line each

    def summary(self) -> str:
        counts = ", ".join(f"{split} {n}" for split, n in self.samples.items())
        skipped = f"; {len(self.skipped)} unreadable file(s) left out" if self.skipped else ""
        state = "complete" if self.complete else "PARTIAL"
        lines = [f"{self.out}: {self.kind} shards {state} ({counts}){skipped}", *self.also]
        return "\n".join(lines + ([self.message] if self.message else []))


class OutOfSpace(OSError):
    pass


# -- listing the source ---------------------------------------------------------------------------------------
def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _class_files(folder: Path, not_images: list) -> tuple[list[str], list[tuple[Path, int]]]:
    """(classes, [(path, label), ...]) of the class folders in ``folder``; the visible files that are not images by
    their extension go to ``not_images``."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    samples = []
    for label, name in enumerate(classes):
        class_dir = folder / name
        files = sorted(p for p in class_dir.rglob("*") if p.is_file() and _visible(p, class_dir))
        not_images += [p for p in files if p.suffix.lower() not in IMAGE_EXTENSIONS]
        samples += [(p, label) for p in files if p.suffix.lower() in IMAGE_EXTENSIONS]
    return classes, samples


def list_image_folder(root: Path, val_fraction: float, seed: int, not_images: "list | None" = None
                      ) -> tuple[list[str], dict]:
    """(classes, {split: [(path, label), ...]}): ``root/train`` and ``root/val`` (or valid/validation/test)
    class folders, or class folders split ``val_fraction`` per class with ``seed`` (``split_by_class``, the
    in-memory image-folder task's rule). Hidden folders and files
    are left out; the other files of the class folders that are not images go to ``not_images``."""
    not_images = [] if not_images is None else not_images
    if has_given_split(root):
        val_dir = next(root / n for n in VAL_NAMES if (root / n).is_dir())
        classes, train = _class_files(root / "train", not_images)
        val_classes, val = _class_files(val_dir, not_images)
        if val_classes != classes:
            raise ValueError(f"{root}: train/ has classes {classes} but {val_dir.name}/ has {val_classes}; both need "
                             f"the same class folders")
        splits = {"train": train, "val": val}
    else:
        classes, everything = _class_files(root, not_images)
        train, val = split_by_class(everything, val_fraction, seed)  # the in-memory image-folder task's rule too
        splits = {"train": sorted(train), "val": sorted(val)}  # sorted by path: a sample's id is its place here
    if len(classes) < 2:
        raise ValueError(f"{root} holds {len(classes)} class folder(s); an image folder needs at least two "
                         f"(<root>/<class>/*.jpg, or <root>/train/<class>/ and <root>/val/<class>/)")
    if not splits["train"]:
        raise FileNotFoundError(f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return classes, splits


def _fingerprint(files: Sequence[Path], root: Path, options: dict) -> str:
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# -- the plan: what a rerun continues ----------------------------------------------------------------------------
def _start_or_continue(out: Path, plan: dict, overwrite: bool) -> dict:
    """The plan on disk when it matches ``plan`` (same source, same options), else refuse; a fresh folder gets it."""
    plan_path = out / S.PLAN_DIR / "plan.json"
    if overwrite and out.exists():
        for name in (S.MANIFEST, S.PLAN_DIR, *S.SPLITS, "tokenizer.json"):
            target = out / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    if plan_path.is_file():
        old = json.loads(plan_path.read_text())
        if old.get("fingerprint") != plan["fingerprint"]:
            changed = [k for k in ("kind", "source", "options") if old.get(k) != plan.get(k)]
            why = (f"its {' and '.join(changed)} differ" if changed else
                   "it split the images into training and validation by an older rule (the in-memory task's and "
                   "this one are now the same)" if old.get("split_rule") != plan.get("split_rule") else
                   "the source's files changed since (added, removed or modified)")
            raise ValueError(f"--out {out} holds a prepare of other data: {why}. Rerun with --overwrite to start "
                             f"again from the source as it is now, or choose another --out")
        return old
    if out.exists() and any(out.iterdir()) and not (out / S.MANIFEST).exists():
        raise ValueError(f"--out {out} is a folder that holds other files; give an empty or new folder")
    if (out / S.MANIFEST).exists():  # a complete folder from before plans were kept: treat as other data
        raise ValueError(f"--out {out} already holds shards; rerun with --overwrite to replace them")
    S.write_json(plan_path, plan)
    return plan


def _parts(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _run_parts(tasks: list, work: Callable, workers: int, progress, on_result: Callable) -> None:
    """``work(task)`` for each task, in ``workers`` processes (0: here), results in task order to ``on_result``;
    ``on_result`` returning False stops the rest (the processes are ended)."""
    if workers <= 0 or len(tasks) <= 1:
        for task in tasks:
            result = work(task)
            progress.update(result.get("count", 0))
            if on_result(result) is False:
                return
        return
    import multiprocessing

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    with context.Pool(min(workers, len(tasks))) as pool:
        for result in pool.imap(work, tasks):
            progress.update(result.get("count", 0))
            if on_result(result) is False:
                pool.terminate()
                return


def _progress(total: int, unit: str, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, disable=not enabled, unit_scale=unit == "B", dynamic_ncols=True)


def _writer(split_dir: Path, part: int, chunk_bytes: int):
    S.disable_litdata_network()
    from litdata.streaming.writer import BinaryWriter

    class PartWriter(BinaryWriter):
        @property
        def filled(self) -> bool:  # litdata's asks whether the folder has an index.json: a rerun's folder has one
            return self._is_done

    writer = PartWriter(str(split_dir), chunk_bytes=chunk_bytes)
    writer._rank = part  # one writer per part: its chunks are chunk-{part}-K.bin and its index {part}.index.json
    return writer


def _out_of_space(error: OSError) -> bool:
    return isinstance(error, OSError) and error.errno in OUT_OF_SPACE


# -- images ---------------------------------------------------------------------------------------------------
def _encode_image(path: Path, short_side: int, quality: int):
    """(JPEG bytes, [sum, sum of squares] per channel, pixels) of the image resized to ``short_side``."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        image.draft("RGB", (short_side, short_side))  # JPEG: decode at a reduced scale when much larger
        image = image.convert("RGB")
        width, height = image.size
        if min(width, height) > short_side:
            scale = short_side / min(width, height)
            image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.BILINEAR)
        pixels = np.asarray(image, dtype=np.float64).reshape(-1, 3) / 255.0
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), np.stack([pixels.sum(0), (pixels ** 2).sum(0)]), pixels.shape[0]


def _image_part(task: dict) -> dict:
    import numpy as np

    split_dir, part = Path(task["split_dir"]), task["part"]
    S.discard_part(split_dir, part)
    stats, pixels, bad, written = np.zeros((2, 3)), 0, [], 0
    try:
        writer = _writer(split_dir, part, task["chunk_bytes"])
        for sample_id, rel, label in task["items"]:
            path = Path(task["root"]) / rel
            try:
                data, sums, count = _encode_image(path, task["short_side"], task["quality"])
            except OSError as error:
                if _out_of_space(error):
                    raise
                bad.append((str(path), f"{type(error).__name__}: {error}"))
                continue
            except Exception as error:  # PIL raises SyntaxError, ValueError, DecompressionBombError ...
                bad.append((str(path), f"{type(error).__name__}: {error}"))
                continue
            writer.add_item(written, {"image": data, "label": int(label), "id": int(sample_id)})
            written += 1
            stats, pixels = stats + sums, pixels + count
        if bad and not task["skip_bad"]:
            S.discard_part(split_dir, part)
            return {"part": part, "count": len(task["items"]), "bad": bad, "done": False}
        writer.done()
        S.finish_part(split_dir, part, {"samples": written, "skipped": bad, "stats": stats.tolist(), "pixels": pixels})
    except OSError as error:
        if not _out_of_space(error):
            raise
        S.discard_part(split_dir, part)
        return {"part": part, "count": 0, "bad": bad, "done": False, "out_of_space": str(error)}
    return {"part": part, "count": len(task["items"]), "bad": bad, "done": True}


def prepare_images(source, out, *, short_side: int = 160, quality: int = 90, val_fraction: float = 0.1,
                   seed: int = 0, part_size: int = S.PART_SIZE, chunk_bytes: int = 64 << 20, workers: int = 0,
                   skip_bad: bool = False, overwrite: bool = False, verify: bool = False,
                   progress: bool = True) -> PrepareResult:
    """Shards of the image folder ``source`` in ``out`` (see the module's docstring); ``verify``: the chunks of
    the parts already done are checked by their SHA-256 too (reads every byte), and those that differ written again."""
    source, out = _local_paths(source, out)
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a folder; give an image folder (<class>/*.jpg, or train/ and val/)")
    if not 16 <= short_side <= 2048:
        raise ValueError(f"--short-side must be from 16 to 2048 pixels, got {short_side}")
    if not 1 <= quality <= 100:
        raise ValueError(f"--quality must be from 1 to 100, got {quality}")
    not_images: list = []
    classes, splits = list_image_folder(source, val_fraction, seed, not_images)
    options = {"short_side": short_side, "quality": quality, "val_fraction": val_fraction, "seed": seed,
               "part_size": part_size}
    files = [p for items in splits.values() for p, _ in items]
    split_rule = GIVEN_SPLIT if has_given_split(source) else SPLIT_RULE
    drawn = {} if split_rule == GIVEN_SPLIT else {"split_rule": split_rule}  # a prepare of the folder's own train/ and val/ holds
    plan = {"kind": "images", "source": str(source), "options": options, **drawn,  # no rule: the same as before
            "fingerprint": _fingerprint(files, source, {"kind": "images", **options, **drawn})}
    plan = _start_or_continue(out, plan, overwrite)
    tasks = []
    for split in ("val", "train"):  # validation first: a prepare stopped by a full disk leaves a folder a run can use
        items = splits[split]
        numbered = [(i, str(p.relative_to(source)), label) for i, (p, label) in enumerate(items)]
        random.Random(f"{seed}-{split}").shuffle(numbered)  # chunks of many classes
        split_dir = out / split
        split_dir.mkdir(parents=True, exist_ok=True)
        for part, chunk in enumerate(_parts(numbered, part_size)):
            tasks.append({"split": split, "split_dir": str(split_dir), "part": part, "items": chunk,
                          "root": str(source), "short_side": short_side, "quality": quality,
                          "chunk_bytes": chunk_bytes, "skip_bad": skip_bad})
    manifest = {"format": S.FORMAT, "version": S.VERSION, "kind": "images", "source": str(source),
                "source_data": source_identity(source),
                "options": options, "classes": classes, "channels": 3,
                "split_rule": split_rule}
    result = _execute(out, tasks, manifest, _image_part, workers=workers, progress=progress, skip_bad=skip_bad,
                      verify=verify, needs=("stats", "pixels"), unit="img")
    if not_images:
        shown = ", ".join(str(p.relative_to(source)) for p in not_images[:3])
        result.also.append(f"{len(not_images)} file(s) in the class folders are not images "
                            f"({', '.join(IMAGE_EXTENSIONS)}) and were left out: {shown}"
                            + (", ..." if len(not_images) > 3 else ""))
    return result


def _execute(out: Path, tasks: list, manifest: dict, work: Callable, *, workers: int, progress: bool,
             skip_bad: bool, verify: bool, needs: tuple, unit: str) -> PrepareResult:
    """Run the parts not done yet (or done but damaged since: ``needs``, the keys their marker must hold; ``verify``:
    their chunks' SHA-256 checked too), then write each split's index and the manifest (complete or partial)."""
    import numpy as np

    marked = {_key(t) for t in tasks if S.done_marker(Path(t["split_dir"]), t["part"]).is_file()}
    done = {_key(t) for t in tasks
            if _key(t) in marked and S.intact_part(Path(t["split_dir"]), t["part"], needs, contents=verify)}
    damaged, kept = sorted(marked - done), len(done)
    todo = [t for t in tasks if _key(t) not in done]
    total = sum(_weight(t) for t in tasks)
    bar = _progress(total, unit, f"prepare {out.name}", progress)
    bar.update(sum(_weight(t) for t in tasks if _key(t) in done))
    bad, stopped = [], None

    def on_result(result: dict):
        nonlocal stopped
        bad.extend(result.get("bad", ()))
        if result.get("out_of_space"):
            stopped = f"out of disk space ({result['out_of_space']})"
            return False
        if result.get("bad") and not skip_bad:
            return False
        if result["done"]:
            done.add((result["split"], result["part"]))
        return True

    wrapped = _Tagged(work)
    try:
        _run_parts(todo, wrapped, workers, bar, on_result)
    finally:
        bar.close()
    if bad and not skip_bad:
        shown = "; ".join(f"{p} ({why})" for p, why in bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(f"{len(bad)} file(s) cannot be read: {shown}. Remove or replace them and rerun (the parts "
                         f"already written are kept), or leave them out and count them with --skip-bad")
    # Index and manifest over the parts done, in part order.
    splits, skipped, stats = {}, [], np.zeros((2, 3))
    pixels, complete = 0, stopped is None and len(done) == len(tasks)
    extra = {}
    for split in S.SPLITS:
        split_dir = out / split
        parts = sorted(t["part"] for t in tasks if t["split"] == split and (split, t["part"]) in done)
        if not any(t["split"] == split for t in tasks):
            continue
        with_chunks = [p for p in parts if (split_dir / f"{p}.{S.INDEX}").is_file()]
        index = S.merge_index(split_dir, with_chunks) if with_chunks else {"chunks": []}
        if not with_chunks:
            S.write_json(split_dir / S.INDEX, {"chunks": [], "config": None})
        samples = sum(int(c["chunk_size"]) for c in index["chunks"])
        splits[split] = {"samples": samples, "chunks": len(index["chunks"]), "parts": len(parts)}
        for part in parts:
            info = json.loads(S.done_marker(split_dir, part).read_text())
            skipped += info.get("skipped", [])
            if split == "train" and "stats" in info:
                stats += np.asarray(info["stats"])
                pixels += info["pixels"]
            for key in ("tokens",):
                if key in info:
                    extra.setdefault(split, 0)
                    extra[split] += info[key]
    manifest = {**manifest, "splits": splits, "skipped": skipped, "complete": complete}
    if manifest["kind"] == "images" and pixels:
        mean = stats[0] / pixels
        manifest["mean"] = mean.tolist()
        manifest["std"] = np.sqrt(np.maximum(stats[1] / pixels - mean ** 2, 1e-6)).tolist()
    if extra:
        manifest["tokens"] = extra
    message = ""
    if not complete:
        manifest["stopped"] = stopped or "stopped before every part was written"
        message = _stopped_message(out, manifest, tasks, done)
    S.write_json(out / S.MANIFEST, manifest)
    notes = []
    if kept:
        notes.append(f"continued the prepare that was there: {kept} of {len(tasks)} parts kept as written before, "
                     f"{len(done) - kept} written now")
    if damaged:
        what = "missing, cut short or altered" if verify else "missing or cut short"
        names = ", ".join(f"{split} part {part}" for split, part in damaged)
        notes.append(f"{len(damaged)} part(s) done before had chunks {what} since, and were written again: {names}")
    result = PrepareResult(out, manifest["kind"], {k: v["samples"] for k, v in splits.items()}, skipped, complete,
                           message, notes)
    if stopped:
        raise PrepareStopped(result)
    return result


def _key(task: dict) -> tuple:
    return task["split"], task["part"]


def _weight(task: dict) -> int:
    """A part's share of the work: its images, or its text files' bytes."""
    return task.get("weight", len(task.get("items", ())))


def _stopped_message(out: Path, manifest: dict, tasks: list, done: set) -> str:
    """What a prepare that ran out of disk leaves (what a run can use of it) and what completes it."""
    splits = manifest["splits"]
    counts = " and ".join(f"{splits[split]['samples']} {name}" for split, name in (("train", "training"),
                                                                                  ("val", "validation"))
                          if split in splits)
    needs_val = any(t["split"] == "val" for t in tasks)
    if splits.get("train", {}).get("samples") and (splits.get("val", {}).get("samples") or not needs_val):
        usable = (f"its {counts} samples stream as they are (the folder is marked partial: a run on it trains on "
                  f"those only)")
    else:
        missing = "training" if not splits.get("train", {}).get("samples") else "validation"
        usable = f"it holds {counts} samples: no {missing} samples yet, so no run can use it"
    written = sum((Path(t["split_dir"]) / c).stat().st_size for t in tasks if _key(t) in done
                  for c in json.loads(S.done_marker(Path(t["split_dir"]), t["part"]).read_text())["chunks"])
    done_weight = sum(_weight(t) for t in tasks if _key(t) in done)
    left_weight = sum(_weight(t) for t in tasks if _key(t) not in done)
    room = (f"about {_megabytes(written / done_weight * left_weight * 1.1)} more free" if written and done_weight
            else "more free space")
    are = "is" if len(done) == 1 else "are"
    return (f"prepare stopped: {manifest['stopped']}. Of the {len(tasks)} parts, {len(done)} {are} done: {usable}. To "
            f"finish, make {room} on the disk of {out} (or prepare into a folder on a larger disk), then run the same "
            f"command again without --overwrite: it keeps the parts done and writes the other {len(tasks) - len(done)}")


def _megabytes(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{max(size / 1e6, 0.1):.1f} MB"


class PrepareStopped(OSError):
    """A prepare that ran out of disk: ``result`` says what was kept."""

    def __init__(self, result: PrepareResult):
        super().__init__(result.message)
        self.result = result


class _Tagged:
    """The part's work, its result tagged with the split (picklable for worker processes)."""

    def __init__(self, work: Callable):
        self.work = work

    def __call__(self, task: dict) -> dict:
        result = self.work(task)
        result["split"] = task["split"]
        return result


# -- text -----------------------------------------------------------------------------------------------------
def _train_tokenizer(files: list[Path], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        for path in files:
            yield path.read_text(encoding="utf-8", errors="replace")

    tokenizer.train_from_iterator(texts(), trainer)
    return tokenizer


def _token_part(task: dict) -> dict:
    import numpy as np
    from tokenizers import Tokenizer

    split_dir, part = Path(task["split_dir"]), task["part"]
    S.discard_part(split_dir, part)
    tokenizer = Tokenizer.from_str(task["tokenizer"])
    eos = tokenizer.token_to_id(EOS)
    dtype = np.dtype(task["dtype"])
    stream: list[int] = []
    for rel in task["files"]:
        text = (Path(task["root"]) / rel).read_text(encoding="utf-8", errors="replace")
        stream += tokenizer.encode(text).ids
        if eos is not None:
            stream.append(eos)
    tokens = np.asarray(stream, dtype=dtype)
    block, written = task["block"], 0
    places = list(range(0, max(0, len(tokens) - block), block))  # blocks of block + 1 tokens, sharing one
    if task["shuffle_seed"] is not None:
        random.Random(task["shuffle_seed"]).shuffle(places)
    try:
        writer = _writer(split_dir, part, task["chunk_bytes"])
        for start in places:
            writer.add_item(written, {"tokens": tokens[start:start + block + 1],
                                      "id": int(task["id_base"] + start // block)})
            written += 1
        writer.done()
        S.finish_part(split_dir, part, {"samples": written, "skipped": [], "tokens": int(len(tokens))})
    except OSError as error:
        if not _out_of_space(error):
            raise
        S.discard_part(split_dir, part)
        return {"part": part, "count": 0, "done": False, "out_of_space": str(error)}
    return {"part": part, "count": task["weight"], "done": True}


def prepare_text(source, out, *, tokenizer=None, vocab_size: int = 8192, block: int = 1024,
                 val_fraction: float = 0.1, seed: int = 0, part_bytes: int = S.PART_BYTES, chunk_bytes: int = 64 << 20,
                 workers: int = 0, skip_bad: bool = False, overwrite: bool = False, shuffle_blocks: bool = True,
                 verify: bool = False, progress: bool = True) -> PrepareResult:
    """BPE token shards of the text files under ``source`` in ``out`` (see the module's docstring);
    ``shuffle_blocks=False`` keeps the text's order (to read the shards back as documents); ``verify`` as for
    :func:`prepare_images`."""
    from speedkit.data.text import _list_text_files, looks_binary, split_files

    S.require("tokenizers")
    source, out = _local_paths(source, out)
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a folder; give a folder of text files ({', '.join(TEXT_EXTENSIONS)})")
    if block < 8:
        raise ValueError(f"--block must be at least 8 tokens, got {block}")
    files = [f for f in _list_text_files(source, TEXT_EXTENSIONS) if _visible(source / f, source)]
    if not files:
        raise FileNotFoundError(f"no files ending in {', '.join(TEXT_EXTENSIONS)} under {source}")
    binary = [f for f in files if looks_binary((source / f).read_bytes()[:8192])]
    if binary and not skip_bad:
        shown = ", ".join(str(source / f) for f in binary[:5])
        raise ValueError(f"{len(binary)} file(s) under {source} are not text: {shown}; remove them, or leave them out "
                         f"and count them with --skip-bad")
    files = [f for f in files if f not in set(binary)]
    train_files, val_files = split_files(files, val_fraction, seed) if len(files) > 1 else (files, [])
    given = Path(tokenizer).expanduser().resolve() if tokenizer else None
    if given is not None and not given.is_file():
        raise FileNotFoundError(f"--tokenizer {given} does not exist; give a tokenizer.json (Hugging Face tokenizers), "
                                f"or leave it out to train a byte-level BPE on the corpus")
    options = {"block": block, "val_fraction": val_fraction, "seed": seed, "part_bytes": part_bytes,
               "tokenizer": hashlib.sha256(given.read_bytes()).hexdigest() if given else f"bpe-{vocab_size}",
               "shuffle_blocks": shuffle_blocks}
    plan = {"kind": "tokens", "source": str(source), "options": options,
            "fingerprint": _fingerprint([source / f for f in files], source, {"kind": "tokens", **options})}
    _start_or_continue(out, plan, overwrite)
    saved = out / "tokenizer.json"
    if not saved.is_file():  # trained (or copied) once; a rerun uses the same one
        if given is not None:
            from tokenizers import Tokenizer

            Tokenizer.from_file(str(given))  # refuse a file that is not a tokenizer before any work
            text = given.read_text()
        else:
            text = _train_tokenizer([source / f for f in train_files], vocab_size).to_str()
        S.write_json(saved, json.loads(text))
    from tokenizers import Tokenizer

    tok_text = saved.read_text()
    vocab = Tokenizer.from_str(tok_text).get_vocab_size()
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    tasks = []
    for split, split_files_ in (("val", val_files), ("train", train_files)):  # validation first, as for images
        if not split_files_:
            continue
        split_dir = out / split
        split_dir.mkdir(parents=True, exist_ok=True)
        groups, current, size = [], [], 0
        ordered = list(split_files_)
        if shuffle_blocks:
            random.Random(f"{seed}-{split}").shuffle(ordered)
        for f in ordered:
            current.append(str(f))
            size += (source / f).stat().st_size
            if size >= part_bytes:
                groups.append((current, size))
                current, size = [], 0
        if current:
            groups.append((current, size))
        for part, (group, weight) in enumerate(groups):
            tasks.append({"split": split, "split_dir": str(split_dir), "part": part, "files": group, "weight": weight,
                          "root": str(source), "tokenizer": tok_text, "dtype": dtype, "block": block,
                          "chunk_bytes": chunk_bytes, "id_base": part << 32,
                          "shuffle_seed": f"{seed}-{split}-{part}" if shuffle_blocks else None})
    manifest = {"format": S.FORMAT, "version": S.VERSION, "kind": "tokens", "source": str(source),
                "source_data": source_identity(source),
                "options": options, "classes": None, "vocab_size": vocab, "dtype": dtype, "block": block,
                "tokenizer": "tokenizer.json", "eos": EOS,
                "not_text": [str(source / f) for f in binary]}
    result = _execute(out, tasks, manifest, _token_part, workers=workers, progress=progress, skip_bad=skip_bad,
                      verify=verify, needs=("tokens",), unit="B")
    result.skipped = [(str(source / f), "not text") for f in binary]
    return result


def prepare(source, out, **options) -> PrepareResult:
    """Images or text, from what ``source`` holds: class folders of images, else text files."""
    _local_only(source, out)
    source = Path(source).expanduser()
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a folder")
    kind = options.pop("kind", None) or detect_kind(source)
    text_only = ("tokenizer", "vocab_size", "block", "part_bytes", "shuffle_blocks")
    image_only = ("short_side", "quality", "part_size")
    if kind == "images":
        return prepare_images(source, out, **{k: v for k, v in options.items() if k not in text_only})
    return prepare_text(source, out, **{k: v for k, v in options.items() if k not in image_only})


def _local_paths(source, out) -> tuple[Path, Path]:
    """``source`` and ``out`` resolved, checked to be local folders and ``out`` outside ``source`` (whose files
    the shards would then join)."""
    _local_only(source, out)
    source, out = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    if out == source or source in out.parents:
        raise ValueError(f"--out {out} is inside the source folder {source}: the shards would be read as source "
                         f"files; give an --out outside {source}")
    return source, out


def _local_only(source, out) -> None:
    """A prepare reads and writes local folders (it resumes by its files, renames them atomically): an object-store
    URL as ``out`` or ``source`` is refused with the fix."""
    from speedkit.data.streaming.remote import is_url

    if is_url(str(out)):
        raise ValueError(f"--out {out}: speedkit data prepare writes a local folder, not an object store; prepare "
                         f"locally, then upload the folder as it is (aws s3 sync DIR {out}) and train with --data "
                         f"{out}")
    if is_url(str(source)):
        raise ValueError(f"{source}: speedkit data prepare reads a local folder; copy the source to a local disk "
                         f"first (aws s3 sync {source} DIR)")


def detect_kind(source: Path) -> str:
    """``"images"`` when ``source`` holds image files, else ``"text"``."""
    for path in source.rglob("*"):
        if path.is_file() and _visible(path, source):
            if path.suffix.lower() in IMAGE_EXTENSIONS:
                return "images"
    return "text"
