"""Fashion-MNIST read straight from its IDX files.

The Debian package ``dataset-fashion-mnist`` ships the original ``*.gz`` files, but their
checksums differ from the ones torchvision pins, so torchvision refuses them. Parsing IDX is a
few lines of numpy (about half a second for the whole set), so we read the files ourselves and
only ask torchvision to download when the user explicitly allows it.
"""

from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np
import torch
from torch.utils.data import Dataset

PathLike = Union[str, os.PathLike]

CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
IMAGE_SIZE = 28

# Base names of the four IDX files; each may be present gzipped (".gz") or not.
FILE_NAMES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

ENV_VAR = "SPEEDKIT_DATA"
# Module-level (not constants inside functions) so that tests can point them elsewhere.
SYSTEM_DIRS = [Path("/usr/share/datasets/fashion-mnist")]
CACHE_ROOT = Path("~/.cache/speedkit")

HOW_TO_GET = (
    "To get the data: on Debian/Ubuntu run `apt-get install dataset-fashion-mnist` "
    "(installs /usr/share/datasets/fashion-mnist); or set SPEEDKIT_DATA / pass root= to a folder "
    "holding the four IDX files (.gz or gunzipped); or pass download=True "
    "(`--download` on the command line) to let torchvision download it into ~/.cache/speedkit."
)

# IDX header: two zero bytes, a type code (0x08 = unsigned byte) and the number of dimensions.
_IDX_UBYTE = 0x08


@dataclass
class ImageArrays:
    """A whole small image dataset as tensors.

    The tensors are shared with an in-process cache: treat them as read-only (index or copy
    them; do not modify them in place).
    """

    train_x: torch.Tensor  # uint8 [N, H, W]
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list = field(default_factory=list)
    mean: float = 0.0  # of the training pixels, scaled to [0, 1]
    std: float = 1.0
    source: Optional[Path] = None  # the folder the files were read from

    @property
    def num_classes(self) -> int:
        return len(self.classes)


# ---------------------------------------------------------------------------- IDX parsing


def read_idx(path: PathLike) -> np.ndarray:
    """Parse one IDX file (gzipped or not) of unsigned bytes; ValueError names a bad file."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UBYTE:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (bad magic number {raw[:4].hex()!r})")
    ndim = raw[3]
    header_size = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header_size:
        raise ValueError(f"{path}: truncated IDX header (ndim={ndim}, {len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape))
    if len(raw) - header_size != expected:
        raise ValueError(
            f"{path}: header says shape {shape} ({expected} bytes) but the file holds "
            f"{len(raw) - header_size} bytes of data (truncated or corrupt?)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(shape)


def _read_bytes(path: Path) -> bytes:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"{path}: cannot be read ({error})") from error


# ---------------------------------------------------------------------------- locating files


def _find_files(folder: Path) -> tuple[Optional[dict], list]:
    """The four IDX paths in `folder` (or its torchvision layout), or None and what was missing."""
    missing = []
    for candidate in (folder, folder / "FashionMNIST" / "raw"):
        found, missing_here = {}, []
        for key, name in FILE_NAMES.items():
            path = next((p for p in (candidate / name, candidate / f"{name}.gz") if p.is_file()), None)
            if path is None:
                missing_here.append(name)
            else:
                found[key] = path
        if not missing_here:
            return found, []
        if found:  # a partly filled folder is worth reporting
            missing.append(f"{candidate} lacks {', '.join(missing_here)}")
    return None, missing


def _search_dirs(root: Optional[PathLike]) -> list:
    """Folders to look in, in order: root, $SPEEDKIT_DATA, system package, user cache."""
    dirs = []
    if root is not None:
        dirs.append(Path(root).expanduser())
    if os.environ.get(ENV_VAR):
        env_dir = Path(os.environ[ENV_VAR]).expanduser()
        dirs += [env_dir, env_dir / "fashion-mnist"]
    dirs += list(SYSTEM_DIRS)
    cache = Path(CACHE_ROOT).expanduser()
    dirs += [cache / "fashion-mnist", cache]  # `cache` covers torchvision's FashionMNIST/raw
    return dirs


def locate_fashion_mnist(root: Optional[PathLike] = None) -> dict:
    """Paths of the four IDX files, from the first search folder that has all of them."""
    notes = []
    searched = _search_dirs(root)
    for folder in searched:
        files, missing = _find_files(folder)
        if files is not None:
            return files
        notes += missing
    places = "\n".join(f"  - {d} (or {d / 'FashionMNIST' / 'raw'})" for d in searched)
    partial = ("\nIncomplete folders:\n" + "\n".join(f"  - {n}" for n in notes)) if notes else ""
    raise FileNotFoundError(
        f"Fashion-MNIST not found. Looked for {', '.join(FILE_NAMES.values())} (.gz or not) in:\n"
        f"{places}{partial}\n{HOW_TO_GET}"
    )


def _download_with_torchvision() -> None:
    import torchvision  # imported here: only this explicit opt-in path needs it

    root = str(Path(CACHE_ROOT).expanduser())
    try:
        for train in (True, False):
            torchvision.datasets.FashionMNIST(root=root, train=train, download=True)
    except Exception as error:  # offline machines fail deep inside urllib; say what to do instead
        raise RuntimeError(f"downloading Fashion-MNIST into {root} with torchvision failed ({error}). {HOW_TO_GET}") from error


# ---------------------------------------------------------------------------- loading


def load_fashion_mnist(root: Optional[PathLike] = None, download: bool = False) -> ImageArrays:
    """Fashion-MNIST as uint8 image tensors, int64 labels and the training mean/std.

    Looks in `root`, then $SPEEDKIT_DATA, /usr/share/datasets/fashion-mnist and
    ~/.cache/speedkit; downloads with torchvision only when `download=True`.
    """
    try:
        files = locate_fashion_mnist(root)
    except FileNotFoundError:
        if not download:
            raise
        _download_with_torchvision()
        files = locate_fashion_mnist(root)
    # The cache key includes sizes and mtimes so a replaced file is re-read, not served stale.
    key = tuple((k, str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for k, p in sorted(files.items()))
    return _load_cached(key)


@functools.lru_cache(maxsize=4)
def _load_cached(key: tuple) -> ImageArrays:
    paths = {name: Path(path) for name, path, _size, _mtime in key}
    arrays = {name: read_idx(path) for name, path in paths.items()}
    for split in ("train", "test"):
        _check_split(arrays[f"{split}_x"], arrays[f"{split}_y"], paths[f"{split}_x"], paths[f"{split}_y"])
    mean, std = _pixel_mean_std(arrays["train_x"])
    return ImageArrays(
        # Copies make the tensors writable-backed (frombuffer views over bytes are read-only).
        train_x=torch.from_numpy(arrays["train_x"].copy()),
        train_y=torch.from_numpy(arrays["train_y"].astype(np.int64)),
        test_x=torch.from_numpy(arrays["test_x"].copy()),
        test_y=torch.from_numpy(arrays["test_y"].astype(np.int64)),
        classes=list(CLASSES),
        mean=mean,
        std=std,
        source=paths["train_x"].parent,
    )


def _check_split(images: np.ndarray, labels: np.ndarray, image_path: Path, label_path: Path) -> None:
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"{image_path}: expected images of shape [N, 28, 28], got {list(images.shape)}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{label_path}: expected {images.shape[0]} labels to match {image_path.name}, "
            f"got shape {list(labels.shape)}"
        )
    if labels.size and labels.max() >= len(CLASSES):
        raise ValueError(f"{label_path}: label {int(labels.max())} is out of range 0..{len(CLASSES) - 1}")


def _pixel_mean_std(images: np.ndarray) -> tuple[float, float]:
    """Mean and std of pixels/255, from a 256-bin histogram (exact, and far faster than float math)."""
    counts = np.bincount(images.ravel(), minlength=256).astype(np.float64)
    values = np.arange(256, dtype=np.float64) / 255.0
    total = counts.sum()
    mean = float((counts * values).sum() / total)
    var = float((counts * (values - mean) ** 2).sum() / total)
    return mean, var**0.5


# ---------------------------------------------------------------------------- Dataset


class FashionMNIST(Dataset):
    """A map-style Dataset of (PIL image or transformed image, int label).

    For baselines that use the standard torchvision transform + DataLoader pipeline; the fast
    path is :class:`speedkit.data.BatchLoader` over :func:`load_fashion_mnist`.
    """

    classes = CLASSES

    def __init__(
        self,
        train: bool = True,
        transform: Optional[Callable] = None,
        root: Optional[PathLike] = None,
        download: bool = False,
        target_transform: Optional[Callable] = None,
    ):
        arrays = load_fashion_mnist(root=root, download=download)
        self.train = train
        self.data = arrays.train_x if train else arrays.test_x
        self.targets = arrays.train_y if train else arrays.test_y
        self.transform = transform
        self.target_transform = target_transform
        self.mean, self.std = arrays.mean, arrays.std

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        from PIL import Image  # only the PIL-based pipeline needs it

        image = Image.fromarray(self.data[index].numpy())  # 2-D uint8 -> mode "L"
        label = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"FashionMNIST(split={split}, size={len(self)}, transform={self.transform!r})"
