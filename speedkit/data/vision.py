"""Thin wrappers over torchvision's CIFAR and ImageFolder datasets.

torchvision answers a missing dataset with "Dataset not found or corrupted"; these wrappers
check first and say what was expected where and how to get it, and never download unless asked.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Callable, Optional, Union

from .folder_split import IMAGE_EXTENSIONS  # the streamed path (speedkit data prepare) reads the same files

PathLike = Union[str, os.PathLike]

# What torchvision expects for each CIFAR variant (folder, archive, files inside the folder).
_CIFAR_LAYOUT = {
    "cifar10": {
        "folder": "cifar-10-batches-py",
        "archive": "cifar-10-python.tar.gz",
        "files": [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"],
        "url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    },
    "cifar100": {
        "folder": "cifar-100-python",
        "archive": "cifar-100-python.tar.gz",
        "files": ["train", "test", "meta"],
        "url": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    },
}


def cifar10(root: PathLike, train: bool = True, transform: Optional[Callable] = None, download: bool = False):
    """torchvision's CIFAR10, with a clear FileNotFoundError when the files are missing."""
    from torchvision.datasets import CIFAR10

    return _cifar(CIFAR10, "cifar10", root, train, transform, download)


def cifar100(root: PathLike, train: bool = True, transform: Optional[Callable] = None, download: bool = False):
    """torchvision's CIFAR100, with a clear FileNotFoundError when the files are missing."""
    from torchvision.datasets import CIFAR100

    return _cifar(CIFAR100, "cifar100", root, train, transform, download)


def _cifar(dataset_class, name: str, root: PathLike, train: bool, transform, download: bool):
    layout = _CIFAR_LAYOUT[name]
    root = Path(root).expanduser()
    if root.name == layout["folder"]:  # accept the extracted folder itself as root
        root = root.parent
    folder = root / layout["folder"]
    missing = [f for f in layout["files"] if not (folder / f).is_file()]
    if missing and not download:
        archive = root / layout["archive"]
        if archive.is_file():
            _extract_verified(dataset_class, archive, root)
        else:
            raise FileNotFoundError(_cifar_message(name, root, folder, missing))
    try:
        return dataset_class(root=str(root), train=train, transform=transform, download=download)
    except RuntimeError as error:  # torchvision's checksum check failed
        raise ValueError(
            f"{name}: files under {folder} failed torchvision's checksum check ({error}). "
            f"Delete the folder and fetch {layout['archive']} again."
        ) from error


def _extract_verified(dataset_class, archive: Path, root: Path) -> None:
    """Unpack a locally present archive after checking its md5 (no network involved)."""
    from torchvision.datasets.utils import check_integrity, extract_archive

    if not check_integrity(str(archive), dataset_class.tgz_md5):
        raise ValueError(f"{archive}: md5 differs from the official archive; it is corrupt or a different file")
    extract_archive(str(archive), str(root))


def _cifar_message(name: str, root: Path, folder: Path, missing: list) -> str:
    layout = _CIFAR_LAYOUT[name]
    state = "does not exist" if not folder.is_dir() else f"lacks {', '.join(missing)}"
    return (
        f"{name} not found: expected {folder}/ holding {', '.join(layout['files'])}, but {folder} {state}.\n"
        f"To get it: pass download=True (`--download` on the command line) to let torchvision download "
        f"it into {root}, or download {layout['url']} yourself and put {layout['archive']} in {root} "
        f"(it is verified and unpacked there), or unpack it so that {folder} exists."
    )


def image_folder(root: PathLike, transform: Optional[Callable] = None, target_transform: Optional[Callable] = None):
    """torchvision's ImageFolder (root/<class>/<image>), with a clear error for a wrong layout."""
    from torchvision.datasets import ImageFolder

    root = Path(root).expanduser()
    layout = "root/<class name>/<image file>, e.g. root/cat/001.jpg, root/dog/002.png"
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist; expected the layout {layout}.")
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not class_dirs:
        raise FileNotFoundError(f"{root} has no class subfolders; expected the layout {layout}.")
    empty = [d.name for d in class_dirs if not _has_image(d)]
    if empty:
        raise FileNotFoundError(
            f"{root}: class folder(s) {', '.join(empty)} hold no images "
            f"({', '.join(IMAGE_EXTENSIONS)}); expected the layout {layout}."
        )
    return _visible_image_folder(ImageFolder)(str(root), transform=transform, target_transform=target_transform,
                                              is_valid_file=functools.partial(_visible_image, root))


def _visible_image(root: Path, path: str) -> bool:
    """An image file with no hidden part in its path below ``root`` (Jupyter's ``.ipynb_checkpoints``, ``.git``,
    macOS's ``._`` files): those are copies and tool state, never the user's images."""
    relative = Path(path).relative_to(root)
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS and not any(part.startswith(".") for part in relative.parts)


def _visible_image_folder(image_folder_class):
    """torchvision's ImageFolder whose classes are the visible class folders only: a hidden folder such as
    ``.ipynb_checkpoints`` (Jupyter makes one) would otherwise be trained as one more class, without a word."""

    class VisibleImageFolder(image_folder_class):
        def find_classes(self, directory):
            classes = sorted(entry.name for entry in os.scandir(directory)
                             if entry.is_dir() and not entry.name.startswith("."))
            if not classes:
                raise FileNotFoundError(f"{directory} has no class subfolders")
            return classes, {name: index for index, name in enumerate(classes)}

    return VisibleImageFolder


def _has_image(folder: Path) -> bool:
    # ImageFolder searches class folders recursively, so we do too.
    return any(p.is_file() and _visible_image(folder, str(p)) for p in folder.rglob("*"))
