"""An in-memory (or on-device) batch loader for small image datasets.

A small dataset such as Fashion-MNIST or CIFAR fits in memory many times over, so instead of
decoding, transforming and collating one sample at a time (torchvision + DataLoader), we keep
the whole set as one uint8 tensor on the training device and make every batch with a handful
of whole-batch tensor ops: index, crop, flip, scale, normalise. The input pipeline then costs
a small fraction of a training step and never becomes the bottleneck.

Each epoch is a pure function of (seed, epoch): the order and every augmentation choice come
from the loader's own generator, drawn for the whole epoch up front. That makes runs
reproducible and lets a resumed run start at batch k without producing batches 0..k-1.

Where the set lives (``placement``): on the training device when it fits there, as airbench keeps
CIFAR-10 on the GPU, so a batch is made without a single host-to-device copy; a set too large for the
GPU stays in host memory, and each batch is made there (still uint8), copied from pinned memory without
blocking the host, and the next batch's copy is started before this one is handed over, so the copy
overlaps the step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import torch

from speedkit.core.distributed import resolve_shard, shard_span
from speedkit.core.seeding import FLIP_PHASE, make_generator

from ._sharding import GlobalBatch

FLIP_MODES = ("random", "alternating", None)
PLACEMENTS = ("auto", "device", "host")
# "auto" keeps the set on the GPU when it takes at most this share of the memory free there: the rest is the
# model's, its activations' and the optimizer's.
DEVICE_SHARE = 0.25


def choose_placement(placement: str, device: torch.device, dataset_bytes: int,
                     free_bytes: Optional[int] = None) -> str:
    """``"device"`` (the set on ``device``, batches made there) or ``"host"`` (pinned copies, prefetched)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement != "auto":
        return placement
    if device.type != "cuda":
        return "device"  # a CPU (or MPS: unified memory) has no copy to save
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return "device" if dataset_bytes <= DEVICE_SHARE * free_bytes else "host"
PAD_MODES = ("reflect", "zeros")
Stat = Union[float, Sequence[float], torch.Tensor, None]


@dataclass(frozen=True)
class Augment:
    """Batch-level augmentation: random translation (crop of a padded image) and horizontal flip.

    crop_pad: translate each image by up to this many pixels in each direction (0 = off),
        like torchvision's RandomCrop(size, padding=crop_pad).
    flip: "random" flips each image with probability 1/2; "alternating" flips each image on
        every other epoch (a random half on even epochs, the other half on odd ones), which
        shows the model both views of every image within any two consecutive epochs;
        None disables flipping.
    pad_mode: how the border is filled: "reflect" (mirror the image) or "zeros".
    """

    crop_pad: int = 2
    flip: Optional[str] = "random"
    pad_mode: str = "reflect"

    def __post_init__(self):
        if self.crop_pad < 0:
            raise ValueError(f"crop_pad must be >= 0, got {self.crop_pad}")
        if self.flip not in FLIP_MODES:
            raise ValueError(f"flip must be one of {FLIP_MODES}, got {self.flip!r}")
        if self.pad_mode not in PAD_MODES:
            raise ValueError(f"pad_mode must be one of {PAD_MODES}, got {self.pad_mode!r}")


@dataclass
class _EpochPlan:
    """Every random choice of one epoch, indexed by position in the epoch."""

    order: torch.Tensor  # dataset indices, [N]
    # Where each output pixel reads from, per sample, with the shift, the mirrored border and the flip folded in
    # (int32): the source row times the image width, [N, H], and the source column, [N, W]. Worked out once an
    # epoch, so that a batch's augmentation is an add and a gather, not a dozen small ops at every step.
    source_rows: Optional[torch.Tensor] = None
    source_cols: Optional[torch.Tensor] = None
    # Zero padding: 1 where an output row (column) reads inside the image, uint8 [N, H] ([N, W]).
    inside_rows: Optional[torch.Tensor] = None
    inside_cols: Optional[torch.Tensor] = None


class BatchLoader(GlobalBatch):
    """Yields (images, labels) batches from tensors held on `device`.

    x: uint8 images [N, H, W] or [N, C, H, W] (floating images are taken as already scaled to
       [0, 1] and are not divided by 255); y: integer labels [N].
    Output images are `dtype` [B, C, H, W] (a channel dimension is added for [N, H, W]),
    normalised as (x / 255 - mean) / std; labels are int64 [B].

    Several processes (torchrun): `batch_size` is the *global* batch size. Each of `world_size`
    ranks yields its contiguous slice of the same global batch a single process would yield (same
    order, same augmentations), so a rank's batches have batch_size / world_size samples
    (`local_batch_size`). `rank` and `world_size` default to this process's (from torchrun's
    environment; 0 and 1 in a single process); pass `world_size=1` for a loader every rank reads whole.
    A training loader (`shuffle=True`) needs a batch size divisible by the world size, and its last,
    partial batch is cut to a multiple of it (at most world_size - 1 samples per epoch left out), so
    every rank has the same number of equal batches. An evaluation loader (`shuffle=False`) splits
    every batch as evenly as it can and pads nothing: the ranks together see each sample once.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        device="cpu",
        augment: Optional[Augment] = None,
        mean: Stat = None,
        std: Stat = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        placement: str = "auto",
    ):
        rank, world_size = resolve_shard(rank, world_size)
        self._options = dict(
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, device=device, augment=augment,
            mean=mean, std=std, dtype=dtype, channels_last=channels_last, seed=seed, rank=rank,
            world_size=world_size, placement=placement,
        )
        x, y = torch.as_tensor(x), torch.as_tensor(y)
        _check_inputs(x, y, batch_size, augment)
        _check_shard(batch_size, shuffle, world_size)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.placement = choose_placement(placement, self.device, x.numel() * x.element_size())
        # Where batches are made: the training device, or the host when the set does not fit there.
        self.storage = self.device if self.placement == "device" else torch.device("cpu")
        # A view adds the channel dimension once, so every later op sees [N, C, H, W].
        self.images = (x.unsqueeze(1) if x.ndim == 3 else x).to(self.storage)
        self.labels = y.to(self.storage, torch.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.augment = augment
        self.dtype = dtype
        self.channels_last = channels_last
        self.seed = seed
        self.epoch = 0
        self._scale, self._shift = self._normalisation(mean, std)
        self._flip_phase = self._alternating_phase()

    # ------------------------------------------------------------------ sizes and options

    @property
    def dataset_size(self) -> int:
        return self.images.shape[0]

    @property
    def image_shape(self) -> tuple:
        """Shape of one output image, [C, H, W]."""
        return tuple(self.images.shape[1:])

    @property
    def mean(self) -> Stat:
        """The normalisation mean (pixel scale [0, 1]), so methods can undo and redo normalisation."""
        return self._options["mean"]

    @property
    def std(self) -> Stat:
        return self._options["std"]

    @property
    def _epoch_size(self) -> int:
        """Samples an epoch uses: all of them, less a training loader's remainder that does not split."""
        n = self.dataset_size
        if self.world_size > 1 and self.shuffle and not self.drop_last:
            n -= (n % self.batch_size) % self.world_size
        return n

    def __len__(self) -> int:
        if self.drop_last:
            return self.dataset_size // self.batch_size
        return math.ceil(self._epoch_size / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose which epoch's order and augmentations the next iteration produces."""
        self.epoch = int(epoch)

    def with_options(self, **changes) -> "BatchLoader":
        """A copy with some constructor options changed (same data, same current epoch)."""
        unknown = set(changes) - set(self._options)
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {sorted(self._options)}")
        copy = BatchLoader(self.images, self.labels, **{**self._options, **changes})
        copy.epoch = self.epoch
        return copy

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[tuple]:
        return self.iter_from(0)

    def iter_from(self, batch_index: int) -> Iterator[tuple]:
        """This epoch's batches from `batch_index` on; skipped batches cost nothing.

        A fully consumed iteration advances `epoch` by one (unless `set_epoch` was called
        meanwhile), so a plain loop over epochs gets a fresh order each time.
        """
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        # Fix the epoch now, at iter() time, not lazily at the first next().
        return self._batches(self.epoch, batch_index)

    def _batches(self, epoch: int, batch_index: int) -> Iterator[tuple]:
        plan = self._plan(epoch)
        end = self._epoch_size
        ahead = None  # host placement: the next batch, its copy already under way
        for b in range(batch_index, len(self)):
            start, stop = b * self.batch_size, min((b + 1) * self.batch_size, end)
            if self.world_size > 1:  # this rank's slice of the global batch
                start, stop = shard_span(start, stop, self.rank, self.world_size)
                if start == stop:
                    continue  # an evaluation loader's last batch has fewer samples than ranks
            batch = self._make_batch(plan, slice(start, stop))
            if self.placement == "device":
                yield self._finish_batch(batch)
                continue
            batch = self._start_copy(batch)
            if ahead is not None:
                yield self._finish_batch(ahead)
            ahead = batch
        if ahead is not None:
            yield self._finish_batch(ahead)
        if self.epoch == epoch:
            self.epoch = epoch + 1

    def _start_copy(self, batch: tuple) -> tuple:
        """Host placement: the uint8 batch to the device from pinned memory, without waiting for it."""
        pin = self.device.type == "cuda"  # pinning needs the accelerator; elsewhere the copy is a no-op
        return tuple((t.pin_memory() if pin else t).to(self.device, non_blocking=True) for t in batch)

    def _finish_batch(self, batch: tuple) -> tuple:
        images, labels = batch
        return self._to_model_input(images), labels

    def _plan(self, epoch: int) -> _EpochPlan:
        """Draw the whole epoch's randomness at once, on the CPU generator: the order, and where each sample's
        output pixels read from (4 bytes for each row and column of an image: 13 MB for Fashion-MNIST's 60,000)."""
        n = self.dataset_size
        generator = make_generator(self.seed, epoch)
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        plan = _EpochPlan(order=order)  # drawn on the CPU, moved once per epoch to where batches are made
        aug = self.augment
        if aug is not None and (aug.crop_pad > 0 or aug.flip is not None):
            self._plan_source_pixels(plan, aug, generator, epoch)
        return _move(plan, self.storage)

    def _plan_source_pixels(self, plan: _EpochPlan, aug: Augment, generator: torch.Generator, epoch: int) -> None:
        """Draw the epoch's shifts and flips, in the order they always were drawn, and fill in ``plan``'s source
        rows and columns (and, for zero padding, which of them lie inside the image)."""
        n, (height, width) = len(plan.order), self.images.shape[-2:]
        shift_y = shift_x = flip = None
        if aug.crop_pad > 0:
            shift_y = torch.randint(-aug.crop_pad, aug.crop_pad + 1, (n,), generator=generator)
            shift_x = torch.randint(-aug.crop_pad, aug.crop_pad + 1, (n,), generator=generator)
        if aug.flip == "random":
            flip = torch.rand(n, generator=generator) < 0.5
        elif aug.flip == "alternating":
            flip = (self._flip_phase[plan.order] + epoch) % 2 == 1
        rows, cols = _source_coords(height, shift_y, n), _source_coords(width, shift_x, n)
        if flip is not None:  # mirroring the output = reading the (shifted) columns right to left
            cols = torch.where(flip[:, None], cols.flip(1), cols)
        plan.source_rows = (_reflect(rows, height) * width).int()
        plan.source_cols = _reflect(cols, width).int()
        if aug.pad_mode == "zeros":
            plan.inside_rows, plan.inside_cols = _inside(rows, height), _inside(cols, width)

    def _make_batch(self, plan: _EpochPlan, positions: slice) -> tuple:
        index = plan.order[positions]
        images = self.images.index_select(0, index)  # far faster than images[index] for uint8
        if plan.source_rows is not None:
            images = self._translate_and_flip(images, plan, positions)
        return images, self.labels.index_select(0, index)  # uint8 still: 4x less to copy from the host

    def _translate_and_flip(self, images: torch.Tensor, plan: _EpochPlan, positions: slice) -> torch.Tensor:
        """Shift and mirror each image by reading it through a per-sample index (still on uint8): one gather
        through a flat [H*W] index, half the cost of a gather per axis."""
        batch, channels, height, width = images.shape
        source = plan.source_rows[positions, :, None] + plan.source_cols[positions, None, :]
        flat_shape = (batch, channels, height * width)
        images = images.reshape(flat_shape).gather(2, source.reshape(batch, 1, -1).expand(flat_shape))
        images = images.reshape(batch, channels, height, width)
        if plan.inside_rows is not None:  # zero padding: blank what was read from outside the image
            inside = plan.inside_rows[positions, None, :, None] * plan.inside_cols[positions, None, None, :]
            images = images * inside
        return images

    def _to_model_input(self, images: torch.Tensor) -> torch.Tensor:
        # (x / 255 - mean) / std folded into one in-place multiply and add, in float32 for
        # accuracy (uint8 -> bf16 -> arithmetic would round twice), then cast once.
        images = images.to(torch.float32).mul_(self._scale).add_(self._shift).to(self.dtype)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    # ------------------------------------------------------------------ setup helpers

    def _normalisation(self, mean: Stat, std: Stat) -> tuple:
        channels = self.images.shape[1]
        mean_t = _per_channel(0.0 if mean is None else mean, channels, "mean")
        std_t = _per_channel(1.0 if std is None else std, channels, "std")
        if (std_t <= 0).any():
            raise ValueError(f"std must be positive, got {std}")
        pixel_scale = 255.0 if self.images.dtype == torch.uint8 else 1.0
        scale = 1.0 / (pixel_scale * std_t)
        shift = -mean_t / std_t
        shape = (1, channels, 1, 1)
        return (scale.reshape(shape).to(self.device, torch.float32), shift.reshape(shape).to(self.device, torch.float32))

    def _alternating_phase(self) -> Optional[torch.Tensor]:
        if self.augment is None or self.augment.flip != "alternating":
            return None
        return alternating_flip_phase(self.dataset_size, self.seed)

    def __repr__(self) -> str:
        return (
            f"BatchLoader(size={self.dataset_size}, image_shape={list(self.image_shape)}, "
            f"batch_size={self.batch_size}, batches={len(self)}, shuffle={self.shuffle}, "
            + (f"rank={self.rank}/{self.world_size}, " if self.world_size > 1 else "") +
            f"augment={self.augment}, device={self.device}, dtype={self.dtype}, epoch={self.epoch})"
        )


# ---------------------------------------------------------------------- module helpers


def alternating_flip_phase(n: int, seed: int) -> torch.Tensor:
    """Per-sample 0/1 phase of alternating flips: sample i is flipped in epoch e when (phase[i] + e) is odd.
    Seeded by the loader's seed on a stream apart from every epoch's; the per-image pipeline uses it too
    (``speedkit.data.per_image``), so both flip the same images in the same epochs."""
    return torch.randint(0, 2, (n,), generator=make_generator(seed, FLIP_PHASE))



def _check_inputs(x: torch.Tensor, y: torch.Tensor, batch_size: int, augment: Optional[Augment]) -> None:
    if x.ndim not in (3, 4):
        raise ValueError(f"x must be images [N, H, W] or [N, C, H, W], got shape {list(x.shape)}")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"y must be labels [N] with N = {x.shape[0]}, got shape {list(y.shape)}")
    if x.shape[0] == 0:
        raise ValueError("the dataset is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if y.is_floating_point():
        raise ValueError(f"y must hold integer class labels, got {y.dtype}")
    if augment is not None and augment.pad_mode == "reflect":
        height, width = x.shape[-2:]
        if augment.crop_pad >= min(height, width):
            raise ValueError(f"reflect padding needs crop_pad < image size, got {augment.crop_pad} for {height}x{width}")


def _check_shard(batch_size: int, shuffle: bool, world_size: int) -> None:
    if world_size > 1 and shuffle and batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} is the global batch size and must split evenly over "
                         f"world_size={world_size} ranks; use a multiple of {world_size}")


def _per_channel(value: Stat, channels: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float64).flatten()
    if t.numel() == 1:
        return t.expand(channels).clone()
    if t.numel() != channels:
        raise ValueError(f"{name} has {t.numel()} values but the images have {channels} channels")
    return t


def _source_coords(size: int, shift: Optional[torch.Tensor], count: int) -> torch.Tensor:
    """For each of ``count`` samples and each output pixel along one axis, the input coordinate it reads (may be
    out of range): [count, size]."""
    coords = torch.arange(size).expand(count, size)
    if shift is None:
        return coords
    # Translating an image by +s means output pixel i shows input pixel i - s.
    return coords - shift[:, None]


def _reflect(coords: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror out-of-range coordinates back inside (edge pixel not repeated, like 'reflect' padding).

    For zero padding the batch is masked afterwards (``_inside``), so any in-range index will do.
    """
    coords = coords.abs()
    return torch.where(coords >= size, 2 * (size - 1) - coords, coords)


def _inside(coords: torch.Tensor, size: int) -> torch.Tensor:
    """1 (uint8) where a coordinate lies inside the image, 0 where zero padding fills it."""
    return ((coords >= 0) & (coords < size)).to(torch.uint8)


def _move(plan: _EpochPlan, device: torch.device) -> _EpochPlan:
    # from pinned memory without blocking: a plain copy would make the host wait for the device's queue to drain
    pin = torch.device(device).type == "cuda"
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    return _EpochPlan(**{k: ((v.pin_memory() if pin else v).to(device, non_blocking=True) if v is not None else None)
                         for k, v in fields.items()})
