"""A byte-level text corpus and a loader of next-byte prediction batches.

The default corpus is the reStructuredText source of the Python docs (Debian package
``python3.11-doc``, about 11 MB of real English in ~500 files). Train and validation are split
by file, not by position, so that validation text is never a continuation of a training
document and the validation loss measures generalisation.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import torch

from speedkit.core.distributed import resolve_shard, shard_span
from speedkit.core.seeding import make_generator

from ._sharding import GlobalBatch

PathLike = Union[str, os.PathLike]

DEFAULT_TEXT_ROOT = Path("/usr/share/doc/python3.11/html/_sources")
SEPARATOR = b"\n\n"  # joins files, so no byte pair straddles two documents unmarked
VOCAB_SIZE = 256


@dataclass
class ByteCorpus:
    """Train/validation bytes as uint8 tensors, and which files went where."""

    train: torch.Tensor  # uint8 [n_train_bytes]
    val: torch.Tensor  # uint8 [n_val_bytes]
    train_files: list = field(default_factory=list)  # paths relative to root, sorted
    val_files: list = field(default_factory=list)
    root: Optional[Path] = None
    vocab_size: int = VOCAB_SIZE
    skipped: list = field(default_factory=list)  # files left out as not text (skip_unreadable=True)

    @staticmethod
    def encode(text: str) -> torch.Tensor:
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)

    @staticmethod
    def decode(tokens) -> str:
        """Bytes back to text; invalid UTF-8 (a sample cut mid-character) is replaced, not raised."""
        values = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        return bytes(values).decode("utf-8", errors="replace")


def load_text_corpus(
    root: Optional[PathLike] = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    extensions: Sequence[str] = (".txt", ".rst", ".md"),
    skip_unreadable: bool = False,
) -> ByteCorpus:
    """Read every text file under `root` and split train/validation by file.

    The split is a seeded shuffle of the sorted relative paths, so it depends only on the file
    names, `val_fraction` and `seed`: not on the file system's listing order. A file that is not
    text (NUL bytes, or mostly control bytes: a binary file named ``.txt``) is refused naming it,
    or left out with ``skip_unreadable=True`` (the corpus's ``skipped`` lists it).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    root = _resolve_root(root)
    files = _list_text_files(root, extensions)
    if not files:
        raise FileNotFoundError(
            f"no files ending in {', '.join(extensions)} under {root}. Pass root= a folder of text files."
        )
    contents = {f: (root / f).read_bytes() for f in files}
    binary = [f for f, data in contents.items() if looks_binary(data)]  # not trained on, never silently
    if binary and not skip_unreadable:
        shown = ", ".join(str(root / f) for f in binary[:5]) + (f" and {len(binary) - 5} more" if len(binary) > 5 else "")
        raise ValueError(f"{len(binary)} file(s) under {root} are not text: {shown}; remove them, or leave them out "
                         f"with --skip-unreadable (skip_unreadable=True)")
    files = [f for f in files if f not in set(binary)]
    if not files:
        raise FileNotFoundError(f"no text files under {root}: every file ending in {', '.join(extensions)} is binary")
    train_files, val_files = split_files(files, val_fraction, seed)
    return ByteCorpus(
        train=_join_files(contents, train_files),
        val=_join_files(contents, val_files),
        train_files=train_files,
        val_files=val_files,
        root=root,
        skipped=binary,
    )


def looks_binary(data: bytes, sample: int = 8192) -> bool:
    """True for bytes that are not text in any encoding: a NUL byte, or over 30% control bytes other than
    whitespace and escape, in the first ``sample`` bytes."""
    head = data[:sample]
    if b"\x00" in head:
        return True
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27, 8))
    return bool(head) and control / len(head) > 0.3


def _resolve_root(root: Optional[PathLike]) -> Path:
    if root is None:
        if not DEFAULT_TEXT_ROOT.is_dir():
            raise FileNotFoundError(
                f"default text corpus {DEFAULT_TEXT_ROOT} not found. On Debian/Ubuntu run "
                f"`apt-get install python3.11-doc`, or pass root= a folder of text files "
                f"(.txt, .rst, .md)."
            )
        return DEFAULT_TEXT_ROOT
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"text corpus folder {root} does not exist; pass root= a folder of text files.")
    return root


def _list_text_files(root: Path, extensions: Sequence[str]) -> list:
    suffixes = tuple(e.lower() for e in extensions)
    # endswith, not Path.suffix, so that "library/os.rst.txt" matches ".txt" and ".rst.txt".
    # hidden folders and files (.git, .ipynb_checkpoints) are tool state, never the user's text: `speedkit data
    # prepare` leaves them out too, so both split the same files
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name.lower().endswith(suffixes)
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def split_files(files: Sequence[Path], val_fraction: float, seed: int) -> tuple[list, list]:
    """(train, val) lists of files (relative to the folder), both sorted: the folder's own ``train/`` and ``val/``
    where it has both, as an ImageNet-layout image folder may; else ``val_fraction`` of the files, drawn whole
    with ``seed``, at least one file each when val_fraction > 0."""
    files = sorted(files)
    given = {split: [f for f in files if Path(f).parts[0] == split] for split in ("train", "val")}
    if given["train"] and given["val"]:
        others = [f for f in files if Path(f).parts[0] not in given]
        if others:
            raise ValueError(f"the folder has train/ and val/ splits, and {len(others)} text file(s) outside both "
                             f"(such as {others[0]}); move them into train/ or val/")
        return given["train"], given["val"]
    if val_fraction == 0:
        return list(files), []
    if len(files) < 2:
        raise ValueError(f"need at least 2 files to split train/validation by file, found {len(files)}")
    n_val = min(max(1, round(val_fraction * len(files))), len(files) - 1)
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    val_index = set(order[:n_val])
    train = [f for i, f in enumerate(files) if i not in val_index]
    val = [f for i, f in enumerate(files) if i in val_index]
    return train, val


def _join_files(contents: dict, files: Sequence[Path]) -> torch.Tensor:
    joined = bytearray(SEPARATOR.join(contents[f] for f in files))
    if not joined:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(joined, dtype=torch.uint8)  # a bytearray is writable: no copy, no warning


class TokenBatchLoader(GlobalBatch):
    """Batches of (inputs, next-byte targets), both int64 [batch_size, seq_len].

    Training mode (shuffle=True) draws random windows; the start positions of a whole epoch
    come from a generator seeded with (seed, epoch), so an epoch is reproducible and
    `iter_from` can resume mid-epoch. Eval mode (shuffle=False) walks a fixed set of
    non-overlapping windows in order (the tail shorter than one window is left out).

    Like `BatchLoader`, a fully consumed iteration advances the epoch by one, so a plain
    `for epoch ...: for x, y in loader` loop sees fresh windows; `set_epoch` overrides it.

    Several processes (torchrun): like `BatchLoader`, `batch_size` is the global batch size and each
    rank yields its slice of the same global batch (`rank` and `world_size` default to this
    process's). In training mode the batch size must be divisible by the world size; in eval mode
    each batch of windows is split as evenly as possible, without padding.
    """

    def __init__(
        self,
        data: torch.Tensor,
        seq_len: int,
        batch_size: int,
        steps_per_epoch: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        device="cpu",
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ):
        self.rank, self.world_size = resolve_shard(rank, world_size)
        if shuffle and batch_size % self.world_size:
            raise ValueError(f"batch_size={batch_size} is the global batch size and must split evenly over "
                             f"world_size={self.world_size} ranks; use a multiple of {self.world_size}")
        if data.ndim != 1:
            raise ValueError(f"data must be a 1-D tensor of tokens, got shape {list(data.shape)}")
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}")
        if len(data) < seq_len + 1:
            raise ValueError(f"data has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
        self.data = data.to(device)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch
        self.shuffle = shuffle
        self.seed = seed
        self.device = torch.device(device)
        self.epoch = 0
        self._offsets = torch.arange(seq_len + 1, device=self.device)

    @property
    def tokens_per_batch(self) -> int:
        """Input tokens per global batch (all ranks together)."""
        return self.batch_size * self.seq_len

    @property
    def num_windows(self) -> int:
        """Non-overlapping windows of seq_len inputs (each needs one more token as its last target)."""
        return (len(self.data) - 1) // self.seq_len

    def __len__(self) -> int:
        if self.shuffle:
            # One epoch of random windows is about one pass over the data, unless told otherwise.
            return self.steps_per_epoch or max(1, self.num_windows // self.batch_size)
        full = math.ceil(self.num_windows / self.batch_size)
        return min(full, self.steps_per_epoch) if self.steps_per_epoch else full

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple]:
        return self.iter_from(0)

    def iter_from(self, batch_index: int) -> Iterator[tuple]:
        """The current epoch's batches from `batch_index` on, without producing the earlier ones."""
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        # Fix the epoch now, at iter() time, not lazily at the first next().
        return self._batches(self.epoch, batch_index)

    def _batches(self, epoch: int, batch_index: int) -> Iterator[tuple]:
        starts = self._epoch_starts(epoch)
        for b in range(batch_index, len(self)):
            start, stop = b * self.batch_size, min((b + 1) * self.batch_size, len(starts))
            if self.world_size > 1:  # this rank's slice of the global batch
                start, stop = shard_span(start, stop, self.rank, self.world_size)
                if start == stop:
                    continue
            yield self._batch(starts[start:stop])
        if self.epoch == epoch:  # nobody called set_epoch meanwhile
            self.epoch = epoch + 1

    def _epoch_starts(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_windows, device=self.device) * self.seq_len
        high = len(self.data) - self.seq_len  # exclusive: the last window's target is data[-1]
        generator = make_generator(self.seed, epoch)
        starts = torch.randint(0, high, (len(self) * self.batch_size,), generator=generator)
        return starts.to(self.device)

    def _batch(self, starts: torch.Tensor) -> tuple:
        windows = self.data[starts[:, None] + self._offsets].long()  # [B, seq_len + 1]
        # Contiguous copies: a caller's `y.view(-1)` must not fail on a strided view.
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def __repr__(self) -> str:
        mode = "train" if self.shuffle else "eval"
        return (
            f"TokenBatchLoader({mode}, tokens={len(self.data)}, seq_len={self.seq_len}, "
            f"batch_size={self.batch_size}, batches={len(self)}, epoch={self.epoch}"
            + (f", rank={self.rank}/{self.world_size})" if self.world_size > 1 else ")")
        )
