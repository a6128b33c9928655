"""RandAugment: each image gets ``num_ops`` operations drawn at random from a fixed list, at one magnitude.

The list (Cubuk et al. 2020, as torchvision implements it): identity, autocontrast, equalize, rotate,
solarize, color, contrast, brightness, sharpness, shear x/y, translate x/y, posterize. Magnitude ``M``
runs from 0 to 30; each operation's strength is ``M / 30`` of its maximum (rotate 30 degrees, shear 0.3,
translate 45% of the side, colour factors 1 +/- 0.9, posterize down to 4 bits, solarize threshold down
to 0), with a random sign for the signed operations.

Speedkit's BatchLoader yields normalised float batches, so the Trainer method un-normalises them with the
loader's mean/std, applies the operations on [0, 1] images with ``torchvision.transforms.v2.functional``
and normalises again (its mean and std made once per loader). The operations are drawn on the batch's device
and each is computed for the whole batch with per-sample parameters, kept where it was drawn: the host never
reads a draw nor copies one to the device, so a step that augments never waits (``SyncCounter`` counts both).
This module also holds the operation table, the grouped per-sample form AugMix uses (``apply_per_sample``,
which reads its draws on the host) and the normalisation helpers.
Source: Cubuk et al. 2020, "RandAugment"; torchvision RandAugment; Composer RandAugment docs.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable

import torch

from speedkit.core.batch import with_inputs
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.methods.channels_last import is_channels_last

MAX_MAGNITUDE = 30  # RandAugment's magnitude scale: 31 levels, 0..30


class _LazyFunctional:
    """``torchvision.transforms.v2.functional``, imported on first use: torchvision takes seconds to import,
    and every ``import speedkit`` (each training process, each CLI call) would pay for it otherwise."""

    def __getattr__(self, name):
        import torchvision.transforms.v2.functional as functional

        return getattr(functional, name)


TF = _LazyFunctional()


def _nearest():
    from torchvision.transforms import InterpolationMode

    return InterpolationMode.NEAREST


def _affine(images, angle=0.0, translate=(0, 0), shear=(0.0, 0.0)):
    # Shear about the top-left corner, as torchvision's RandAugment does; fill 0 = black.
    return TF.affine(images, angle=angle, translate=list(translate), scale=1.0, shear=list(shear),
                     interpolation=_nearest(), fill=0.0, center=[0, 0])


def _shear_degrees(strength: float) -> float:
    return math.degrees(math.atan(0.3 * strength))


def _translation(size: int, strength: float) -> int:
    return int(150.0 / 331.0 * size * strength)


# name -> fn(images [B, C, H, W] in [0, 1], signed strength in [-1, 1]) -> images
OPERATIONS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "identity": lambda img, s: img,
    "autocontrast": lambda img, s: TF.autocontrast(img),
    "equalize": lambda img, s: TF.equalize(img),
    "rotate": lambda img, s: TF.rotate(img, 30.0 * s, interpolation=_nearest(), fill=0.0),
    "solarize": lambda img, s: TF.solarize(img, 1.0 - abs(s)),
    "color": lambda img, s: TF.adjust_saturation(img, 1.0 + 0.9 * s),
    "contrast": lambda img, s: TF.adjust_contrast(img, 1.0 + 0.9 * s),
    "brightness": lambda img, s: TF.adjust_brightness(img, 1.0 + 0.9 * s),
    "sharpness": lambda img, s: TF.adjust_sharpness(img, 1.0 + 0.9 * s),
    "shear_x": lambda img, s: _affine(img, shear=(_shear_degrees(s), 0.0)),
    "shear_y": lambda img, s: _affine(img, shear=(0.0, _shear_degrees(s))),
    "translate_x": lambda img, s: _affine(img, translate=(_translation(img.shape[-1], s), 0)),
    "translate_y": lambda img, s: _affine(img, translate=(0, _translation(img.shape[-2], s))),
    "posterize": lambda img, s: TF.posterize(img, 8 - int(round(4 * abs(s)))),
}
RANDAUGMENT_OPS = tuple(OPERATIONS)
SIGNED_OPS = frozenset({"rotate", "color", "contrast", "brightness", "sharpness",
                        "shear_x", "shear_y", "translate_x", "translate_y"})
UNSCALED_OPS = frozenset({"identity", "autocontrast", "equalize"})  # no magnitude


def apply_operation(images: torch.Tensor, name: str, strength: float) -> torch.Tensor:
    """Apply one named operation at a signed ``strength`` in [-1, 1] to images [..., C, H, W] in [0, 1]."""
    if name not in OPERATIONS:
        raise ValueError(f"unknown operation {name!r}; known: {list(OPERATIONS)}")
    return OPERATIONS[name](images, float(strength)).clamp(0.0, 1.0)


def apply_per_sample(images: torch.Tensor, op_names, op_index: torch.Tensor, level: torch.Tensor,
                     negative: torch.Tensor, num_levels: int) -> torch.Tensor:
    """Sample i gets ``op_names[op_index[i]]`` at strength ``+/- level[i] / num_levels``; ``op_index < 0`` = skip.

    Samples with the same (operation, level, sign) are transformed together in one batched call.
    """
    names = list(op_names)
    signed = torch.tensor([n in SIGNED_OPS for n in names], dtype=torch.bool)
    unscaled = torch.tensor([n in UNSCALED_OPS for n in names], dtype=torch.bool)
    op_index, level, negative = op_index.cpu(), level.cpu().long(), negative.cpu().bool()
    active = op_index >= 0
    safe_index = op_index.clamp(min=0)
    # Canonical draws: the sign only matters for signed ops, the level only for scaled ones.
    negative = negative & signed[safe_index]
    level = torch.where(unscaled[safe_index], torch.zeros_like(level), level)
    key = (safe_index * (num_levels + 1) + level) * 2 + negative.long()
    out = images.clone()
    for value in torch.unique(key[active]).tolist():
        members = torch.nonzero(active & (key == value)).flatten()
        op, rest = divmod(value, 2 * (num_levels + 1))
        lvl, neg = divmod(rest, 2)
        if names[op] == "identity":
            continue
        strength = (-1.0 if neg else 1.0) * lvl / num_levels
        index = members.to(images.device)
        out.index_copy_(0, index, apply_operation(images.index_select(0, index), names[op], strength))
    return out


def randaugment_batch(images: torch.Tensor, num_ops: int = 2, magnitude: int = 9,
                      generator: torch.Generator | None = None, ops=RANDAUGMENT_OPS) -> torch.Tensor:
    """RandAugment images [N, C, H, W] with values in [0, 1] (grayscale or RGB), each image on its own.

    Each image gets ``num_ops`` operations drawn uniformly from ``ops``, every one at strength
    ``magnitude / 30`` with a random sign where the operation has one. Returns a new tensor in [0, 1].
    The draws are made on the images' device (``generator``, where given, must be one of that device), and
    nothing is read back or copied from the host: a step that augments never makes the host wait.
    """
    check_unit_images(images, "randaugment")
    if not 0 <= magnitude <= MAX_MAGNITUDE:
        raise ValueError(f"magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}")
    n, device = images.shape[0], images.device
    out = images
    for _ in range(num_ops):
        op_index = torch.randint(0, len(ops), (n,), device=device, generator=generator)
        negative = torch.rand(n, device=device, generator=generator) < 0.5
        strength = magnitude / MAX_MAGNITUDE
        out = apply_drawn_operations(out, ops, op_index, torch.where(negative, -strength, strength))
    return out


def apply_drawn_operations(images: torch.Tensor, op_names, op_index: torch.Tensor,
                           strength: torch.Tensor) -> torch.Tensor:
    """Sample i gets ``op_names[op_index[i]]`` at signed ``strength[i]`` in [-1, 1]; both [N] on the images'
    device. Unsigned operations use the strength's size.

    Every operation of the list is computed for the whole batch with per-sample parameters (one warp for the
    geometric ones, a blend with a per-sample factor for the colour ones) and kept where drawn: the work does
    not depend on the draws, so the host never reads them and every shape is static. Matches
    ``apply_operation`` image by image (the geometric ones up to a pixel rounded the other way).
    """
    names = list(op_names)
    unknown = [name for name in names if name not in OPERATIONS]
    if unknown:
        raise ValueError(f"unknown operations {unknown}; known: {list(OPERATIONS)}")
    drawn = {name: op_index == i for i, name in enumerate(names)}
    out = images
    geometric = [name for name in _GEOMETRIC if name in drawn]
    if geometric:
        chosen = torch.stack([drawn[name] for name in geometric]).any(0)
        out = _keep_where(chosen, _warp(out, drawn, strength), out)
    for name, degenerate in _BLENDS.items():
        if name in drawn:
            factor = 1.0 + 0.9 * strength
            blended = (out * _per_sample(factor) + degenerate(out) * _per_sample(1.0 - factor)).clamp(0.0, 1.0)
            out = _keep_where(drawn[name], blended, out)
    for name, operation in _WHOLE_BATCH.items():
        if name in drawn:
            out = _keep_where(drawn[name], operation(out, strength.abs()).clamp(0.0, 1.0), out)
    return out


def _per_sample(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float32)[:, None, None, None]


def _keep_where(chosen: torch.Tensor, changed: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return torch.where(chosen[:, None, None, None], changed.to(images.dtype), images)


def _posterize(images: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    levels = _per_sample(torch.pow(2.0, 8 - torch.round(4 * size)))
    return torch.minimum((images * levels).floor().clamp(min=0.0), levels - 1) / levels


def _solarize(images: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    return torch.where(images >= _per_sample(1.0 - size), 1.0 - images, images)


# What the colour operations blend each image with (torchvision's degenerate images: factor 0 gives them).
_BLENDS = {
    "color": lambda img: TF.adjust_saturation(img, 0.0),
    "contrast": lambda img: TF.adjust_contrast(img, 0.0),
    "brightness": torch.zeros_like,
    "sharpness": lambda img: _blurred(img),
}


def _blurred(images: torch.Tensor) -> torch.Tensor:
    """torchvision's sharpness degenerate: a 3x3 smoothing inside, the border pixels as they are; its kernel is
    built on the device (torchvision's own comes from a Python list, a copy from the host at every call)."""
    channels, height, width = images.shape[-3:]
    if height <= 2 or width <= 2:
        return images
    kernel = torch.full((3, 3), 1.0 / 13.0, dtype=images.dtype, device=images.device)
    kernel[1, 1] = 5.0 / 13.0
    out = images.clone()
    out[..., 1:-1, 1:-1] = torch.nn.functional.conv2d(images, kernel.expand(channels, 1, 3, 3), groups=channels)
    return out


_WHOLE_BATCH = {
    "autocontrast": lambda img, size: TF.autocontrast(img),
    "equalize": lambda img, size: TF.equalize(img),
    "solarize": _solarize,
    "posterize": _posterize,
}
_GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


def _warp(images: torch.Tensor, drawn: dict, strength: torch.Tensor) -> torch.Tensor:
    """Each image through its own affine map (identity where no geometric operation was drawn), as
    torchvision's ``rotate`` (about the centre) and ``affine`` (shear and translation about the top-left
    corner) map it: nearest pixel, black outside."""
    height, width = images.shape[-2:]
    # the inverse map in double, as torchvision computes it in Python floats (MPS has no double)
    s = strength.to(torch.float32 if strength.device.type == "mps" else torch.float64)
    zero = torch.zeros_like(s)

    def where(name, value):
        return torch.where(drawn[name], value, zero) if name in drawn else zero

    angle = where("rotate", -30.0 * s)  # torchvision's rotate turns the other way from its affine
    shear_x = where("shear_x", torch.rad2deg(torch.atan(0.3 * s)))
    shear_y = where("shear_y", torch.rad2deg(torch.atan(0.3 * s)))
    translate_x = where("translate_x", torch.trunc(150.0 / 331.0 * width * s))
    translate_y = where("translate_y", torch.trunc(150.0 / 331.0 * height * s))
    about_corner = ~drawn["rotate"] if "rotate" in drawn else torch.ones_like(s, dtype=torch.bool)
    center_x = torch.where(about_corner, -0.5 * width, 0.0)
    center_y = torch.where(about_corner, -0.5 * height, 0.0)
    theta = _inverse_affine(angle, shear_x, shear_y, translate_x, translate_y, center_x, center_y)
    return _grid_sample(images, theta.to(torch.float32))


def _inverse_affine(angle, shear_x, shear_y, tx, ty, cx, cy) -> torch.Tensor:
    """torchvision's inverse affine matrix (``_get_inverse_affine_matrix``, scale 1), one per sample: [N, 2, 3]."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=-1).reshape(-1, 2, 3)


def _grid_sample(images: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """torchvision's grid for ``theta`` (pixel centres about the image centre), one per sample; nearest pixel."""
    n, _, height, width = images.shape
    device = images.device
    xs = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device)
    ys = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device)
    base = torch.stack([xs.expand(height, width), ys[:, None].expand(height, width),
                        torch.ones(height, width, device=device)], dim=-1).reshape(1, height * width, 3)
    scaled = theta.transpose(1, 2) / torch.stack([torch.full((), 0.5 * width, device=device),
                                                  torch.full((), 0.5 * height, device=device)])
    grid = base.expand(n, -1, -1).bmm(scaled).reshape(n, height, width, 2)
    warped = torch.nn.functional.grid_sample(images.float(), grid, mode="nearest", padding_mode="zeros",
                                             align_corners=False)
    return warped.to(images.dtype)


# ---------------------------------------------------------------------- normalisation helpers


def check_unit_images(images: torch.Tensor, method: str) -> None:
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{method} needs images [N, C, H, W] with 1 or 3 channels, got shape {list(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"{method} works on float images in [0, 1], got {images.dtype}")


def _per_channel(value, channels: int, device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32).flatten()
    if t.numel() == 1:
        t = t.expand(channels)
    if t.numel() != channels:
        raise ValueError(f"the loader's normalisation has {t.numel()} values but the images have {channels} channels")
    return t.reshape(1, channels, 1, 1).to(device)


def loader_normalization(loader, channels: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mean, std) as [1, C, 1, 1] tensors with which ``loader`` normalised its [0, 1] images, or None if unknown.

    Reads ``loader.mean`` / ``loader.std`` when the loader has them, else a BatchLoader's constructor
    options (where None means 0 and 1: the images are already in [0, 1]).
    """
    mean, std = getattr(loader, "mean", None), getattr(loader, "std", None)
    if mean is None and std is None:
        options = getattr(loader, "_options", None)
        if not isinstance(options, dict) or "mean" not in options:
            return None
        mean, std = options.get("mean"), options.get("std")
    mean = 0.0 if mean is None else mean
    std = 1.0 if std is None else std
    return _per_channel(mean, channels, device), _per_channel(std, channels, device)


_NORMALIZATIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loader -> {(channels, device): stats}


def normalization_once(loader, channels: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``loader_normalization`` made once per loader, channel count and device and kept: made again at every
    step, its mean and std would be two copies from the host a step, each a wait on a GPU."""
    try:
        kept = _NORMALIZATIONS.setdefault(loader, {})
    except TypeError:  # a loader that cannot be weakly referenced or hashed: made each time
        return loader_normalization(loader, channels, device)
    key = (channels, str(device))
    if key not in kept:
        kept[key] = loader_normalization(loader, channels, device)
    return kept[key]


def to_unit_range(x: torch.Tensor, stats, method: str) -> torch.Tensor:
    """Normalised float32 images back to [0, 1] with ``stats = (mean, std)``; None = already in [0, 1]."""
    images = x.float()
    if stats is None:
        lo, hi = float(images.min()), float(images.max())
        if lo < -1e-3 or hi > 1 + 1e-3:
            raise ValueError(f"{method} needs to know how the inputs were normalised (values span [{lo:.2f}, "
                             f"{hi:.2f}]): use speedkit's BatchLoader, or give the loader `mean` and `std` "
                             f"attributes, or feed images in [0, 1]")
        return images.clamp(0.0, 1.0)
    mean, std = stats
    return (images * std + mean).clamp(0.0, 1.0)


def from_unit_range(images: torch.Tensor, stats, like: torch.Tensor) -> torch.Tensor:
    """[0, 1] images normalised again like the loader did, in ``like``'s dtype and memory format."""
    if stats is not None:
        mean, std = stats
        images = (images - mean) / std
    images = images.to(like.dtype)
    if is_channels_last(like):
        images = images.contiguous(memory_format=torch.channels_last)
    return images


def augment_normalised_batch(state, method: str, augment: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Un-normalise ``state.batch``'s images, apply ``augment`` on [0, 1] images, normalise again."""
    x = state.batch_inputs()
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        raise ValueError(f"{method} needs float image batches [N, C, H, W], got "
                         f"{getattr(x, 'shape', type(x))}; remove {method} for this task")
    stats = normalization_once(state.train_dataloader, x.shape[1], x.device)
    images = augment(to_unit_range(x, stats, method))
    state.batch = with_inputs(state.batch, from_unit_range(images, stats, x))


class RandAugment(Method):
    CARD = MethodCard(
        name="randaugment",
        summary="Apply N random image operations of magnitude M to each training image.",
        domain="vision",
        events=(Event.AFTER_DATALOADER,),
        reads=("batch",),
        writes=("batch",),
        hparams=(
            HParam("num_ops", int, 2, low=0, high=4, step=1, help="operations applied to each image"),
            HParam("magnitude", int, 9, low=0, high=MAX_MAGNITUDE, step=1,
                   help="strength of every operation, 0..30"),
        ),
        requirements=("image batches [N, C, H, W] with 1 or 3 channels",
                      "the loader's normalisation known (BatchLoader, or `mean`/`std` on the loader), "
                      "or inputs in [0, 1]"),
        runs_after=("colout", "progressive_resizing", "cutout"),  # on AFTER_DATALOADER: runs before those
        effect="about +0.7% top-1 on ResNet-50/ImageNet for long runs (Composer); costs input-pipeline time "
               "and slows convergence on short runs",
        source="Cubuk et al. 2020 (RandAugment); torchvision RandAugment; Composer RandAugment docs",
    )

    def apply(self, event, state, logger):
        augment_normalised_batch(state, self.name, lambda images: randaugment_batch(
            images, self.params["num_ops"], self.params["magnitude"]))
