"""The image-folder task: classify the user's own images in class folders (``--task image-folder --data DIR``)."""
from __future__ import annotations

import dataclasses
import functools
import warnings
from pathlib import Path

import torch

from speedkit.data import BatchLoader, stratified_indices
from speedkit.data.folder_split import VAL_NAMES, split_by_class
from speedkit.data.images import check_image_size, decode_images
from speedkit.data.vision import image_folder
from speedkit.tasks.builtin._shared import LIBRARY_MODELS, classification_metrics, recipe_augment, vision_model_factory
from speedkit.tasks.recipes import load_presets
from speedkit.tasks.task import DataRequest, Task


@dataclasses.dataclass(frozen=True)
class ImageArrays:
    """A folder's images decoded once, resized, as uint8 tensors; per-channel mean/std of the training part."""
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) of images that could not be decoded, left out


@functools.lru_cache(maxsize=2)
def load_image_folder(data: str, image_size: int, val_fraction: float, seed: int,
                      skip_unreadable: bool = False) -> ImageArrays:
    """``data/train`` and ``data/val`` (or ``valid``/``test``) class folders, or one set of class folders
    split ``val_fraction`` per class with ``seed`` by the streamed path's rule (``speedkit.data.folder_split``)."""
    root = Path(data).expanduser()
    val_dir = next((root / name for name in VAL_NAMES if (root / name).is_dir()), None)
    if (root / "train").is_dir() and val_dir is not None:
        train, val = image_folder(root / "train"), image_folder(val_dir)
        if train.classes != val.classes:
            raise ValueError(f"{root}: train/ has classes {train.classes} but {val_dir.name}/ has {val.classes}; "
                             f"both need the same class folders")
        train_samples, val_samples = train.samples, val.samples
    else:
        if (root / "train").is_dir():
            raise FileNotFoundError(f"{root} has train/ but no val/ beside it; add val/<class>/ images, or put the "
                                    f"class folders directly in {root} to split them")
        train = image_folder(root)
        # split by path before decoding, by the rule `speedkit data prepare` uses: the same validation files streamed
        train_samples, val_samples = split_by_class(train.samples, val_fraction, seed)
    train_x, train_y, val_x, val_y, skipped = _decode_split(train_samples, val_samples, image_size=image_size,
                                                             where=f"image-folder {root}",
                                                             skip_unreadable=skip_unreadable)
    scaled = train_x.float() / 255
    return ImageArrays(train_x, train_y, val_x, val_y, tuple(train.classes),
                       tuple(scaled.mean(dim=(0, 2, 3)).tolist()), tuple(scaled.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()),
                       skipped=tuple(skipped))


def _decode_split(train: list, val: list, **options) -> tuple:
    """``(train_x, train_y, val_x, val_y, skipped)``: the images of both splits decoded in one pass, so both have
    the channels of the whole folder (see ``speedkit.data.images.decode_images``)."""
    decoded = decode_images([*train, *val], **options)
    left_out = {path for path, _ in decoded.skipped}
    is_val = torch.tensor([index >= len(train) for index, (path, _) in enumerate([*train, *val])
                           if path not in left_out], dtype=torch.bool)
    x, y = decoded.x, decoded.y
    return x[~is_val], y[~is_val], x[is_val], y[is_val], tuple(decoded.skipped)


def image_folder_task(data, image_size: int | None = None, val_fraction: float = 0.1, seed: int = 0,
                      target: float = 0.9, skip_unreadable: bool = False, flips_keep_labels: bool = True,
                      stream: bool | None = None) -> Task:
    """Classify the images in class folders under DIR (train/ and val/, or split per class), resized square.

    ``data/train/<class>/`` and ``data/val/<class>/``, or ``data/<class>/`` split ``val_fraction`` per class
    with ``seed``; images resized to ``image_size`` square (4 to 1024); ``target`` is the accuracy to reach.
    An image that cannot be decoded is refused naming its path, or left out and counted with
    ``skip_unreadable=True``. ``flips_keep_labels=False`` for images whose label a horizontal flip changes
    (digits, letters, text): runs then train without flips (``Task.flips_keep_labels``).

    Streaming (``speedkit.tasks.builtin._streamed``): when ``data`` is a shard folder (``speedkit data prepare``),
    when ``stream=True``, or (``stream=None``) when the decoded images would not fit in memory, the images are
    streamed from shards at ``image_size`` (default: the shards' short side) with random-resized crops; else
    they are decoded once into memory at ``image_size`` (default 32), the fast path for small sets."""
    from speedkit.tasks.builtin import _streamed

    if image_size is not None:
        check_image_size(image_size)
    if _streamed.streams("image-folder", data, stream):
        shards = _streamed.shards_for(data, "images", "streaming asked for", val_fraction=val_fraction, seed=seed,
                                      skip_bad=skip_unreadable)
        return _streamed.folder_image_task(shards, image_size, target, flips_keep_labels)
    image_size = image_size or 32
    try:
        arrays = load_image_folder(str(Path(data).expanduser().resolve()), image_size, val_fraction, seed,
                                   skip_unreadable)
    except MemoryError as too_big:
        if stream is False:
            raise
        shards = _streamed.shards_for(data, "images", f"does not fit in memory ({too_big})",
                                      val_fraction=val_fraction, seed=seed, skip_bad=skip_unreadable)
        return _streamed.folder_image_task(shards, image_size, target, flips_keep_labels)
    if arrays.skipped:
        warnings.warn(f"image-folder {data}: left out {len(arrays.skipped)} image(s) that cannot be decoded: "
                      + ", ".join(path for path, _ in arrays.skipped[:5]) + (" ..." if len(arrays.skipped) > 5 else ""),
                      stacklevel=2)
    if len(arrays.classes) < 2:
        raise ValueError(f"{data} holds one class folder ({arrays.classes[0]!r}); a classifier needs at least two")
    if len(arrays.val_y) == 0:
        raise ValueError(f"{data}: no images left for validation; add images or raise val_fraction")
    channels = arrays.train_x.shape[1]

    def loader(x, y, request: DataRequest, train: bool) -> BatchLoader:
        if train and request.data_fraction < 1.0:
            keep = stratified_indices(y, request.data_fraction, request.seed)
            x, y = x[keep], y[keep]
        if not train and request.eval_fraction:
            keep = stratified_indices(y, request.eval_fraction, request.seed)
            x, y = x[keep], y[keep]
        return BatchLoader(x, y, request.batch_size, shuffle=train, device=request.device, seed=request.seed,
                           augment=recipe_augment(request.recipe) if train else None, mean=arrays.mean, std=arrays.std)

    return Task(name="image-folder", domain="vision",
                summary=f"{len(arrays.classes)}-class images from {data}, {image_size}x{image_size}, {channels} channel(s)"
                        + (f", {len(arrays.skipped)} unreadable image(s) left out" if arrays.skipped else ""),
                model=vision_model_factory(channels, len(arrays.classes)),
                train_data=lambda request: loader(arrays.train_x, arrays.train_y, request, train=True),
                eval_data=lambda request: loader(arrays.val_x, arrays.val_y, request, train=False),
                metrics=classification_metrics, target_metric="eval/accuracy", target_value=target,
                recipes=load_presets("image-folder"), models=("resnet9", "resnet8", *LIBRARY_MODELS),
                flips_keep_labels=flips_keep_labels)
