"""Decoding a folder's images into one uint8 tensor, for folders of any size and any mess.

* One file is open at a time (a folder of 100,000 images decodes under ``ulimit -n 256``), and each image
  is written into a tensor allocated once, never gathered in a list first.
* The memory the decoded images need is estimated before any is decoded, and a request larger than the
  machine can hold is refused with the fix (a smaller ``image_size``, fewer images).
* An image that cannot be decoded (truncated, corrupt, not an image) is refused naming its path, or, where
  asked (``skip_unreadable=True``), left out and counted.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

import torch

MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 4, 1024
GRAYSCALE_MODES = ("L", "1", "I;16", "I")
# Beyond the decoded uint8 images, what their first use needs at once: the float copy that the training
# part's mean and std are computed from (4 bytes a value).
BYTES_PER_VALUE = 1 + 4


@dataclasses.dataclass(frozen=True)
class DecodedImages:
    x: torch.Tensor  # uint8 [N, C, size, size]
    y: torch.Tensor  # int64 [N]
    skipped: tuple[tuple[str, str], ...]  # (path, why) of each image left out (skip_unreadable=True)


def check_image_size(image_size, flag: str = "--image-size (image_size)") -> int:
    """``image_size`` as a whole number of pixels from 4 to 1024, else a ValueError naming ``flag``."""
    if isinstance(image_size, bool) or not isinstance(image_size, int):
        raise TypeError(f"{flag} must be a whole number of pixels, got {image_size!r}")
    if not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise ValueError(f"{flag} must be from {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} pixels (images are resized to "
                         f"that square), got {image_size}; 32 or 64 suit small images, 224 photographs")
    return image_size


def available_memory() -> int | None:
    """Bytes of memory this process could still take (MemAvailable on Linux), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(count: int, channels: int, image_size: int, where: str, available: int | None = None) -> None:
    """Refuse decoding ``count`` images that would need more than half of the memory available."""
    needed = count * channels * image_size * image_size * BYTES_PER_VALUE
    available = available_memory() if available is None else available
    if available is not None and needed > available / 2:
        fits = int((available / 2 / (count * channels * BYTES_PER_VALUE)) ** 0.5)
        raise MemoryError(f"{where}: {count} images at {image_size}x{image_size} ({channels} channels) need about "
                          f"{_gib(needed)} in memory, and this machine has {_gib(available)} available; lower "
                          f"--image-size (image_size) to {max(fits, MIN_IMAGE_SIZE)} or less, or train on a folder "
                          f"with fewer images")


def _unreadable(path: str, error: Exception) -> str:
    """Why ``path`` cannot be used, in PIL's words."""
    return f"{type(error).__name__}: {error}"


def _mode_of(path: str):
    """The image's mode from its header (the file is closed again at once), or the error opening it."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.mode, None
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError ...
        return None, _unreadable(path, error)


def _refuse(where: str, bad: list[tuple[str, str]]) -> ValueError:
    shown = "; ".join(f"{path} ({why})" for path, why in bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
    return ValueError(f"{where}: {len(bad)} image(s) cannot be decoded: {shown}. Remove or replace them, or skip "
                      f"such files and count them with --skip-unreadable (skip_unreadable=True)")


def decode_images(samples: Sequence[tuple[str, int]], image_size: int, *, where: str,
                  skip_unreadable: bool = False) -> DecodedImages:
    """The images of ``samples`` (``(path, label)`` pairs) as uint8 [N, C, size, size], resized square with
    bilinear filtering; C is 1 when every image is grayscale, else 3. ``where`` names the folder in errors."""
    import numpy as np
    from PIL import Image

    image_size = check_image_size(image_size)
    modes, bad = [], []
    for path, _ in samples:  # headers only: cheap, and one file open at a time
        mode, why = _mode_of(path)
        modes.append(mode)
        if why is not None:
            bad.append((path, why))
    if bad and not skip_unreadable:
        raise _refuse(where, bad)
    grayscale = all(m in GRAYSCALE_MODES for m in modes if m is not None)
    mode, channels = ("L", 1) if grayscale else ("RGB", 3)
    check_memory(len(samples) - len(bad), channels, image_size, where)

    x = torch.empty((len(samples), channels, image_size, image_size), dtype=torch.uint8)
    keep = torch.zeros(len(samples), dtype=torch.bool)
    unreadable = {path for path, _ in bad}
    for index, (path, _) in enumerate(samples):
        if path in unreadable:
            continue
        try:
            with Image.open(path) as image:
                pixels = np.array(image.convert(mode).resize((image_size, image_size), Image.BILINEAR))  # writable
        except Exception as error:  # truncated or corrupt past the header: found only when decoding
            if not skip_unreadable:
                raise _refuse(where, [(path, _unreadable(path, error))]) from error
            bad.append((path, _unreadable(path, error)))
            continue
        x[index] = torch.from_numpy(pixels.reshape(image_size, image_size, channels)).permute(2, 0, 1)
        keep[index] = True
    labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
    if bad:  # a copy without the images left out
        x, labels = x[keep], labels[keep]
    return DecodedImages(x, labels, tuple(bad))
