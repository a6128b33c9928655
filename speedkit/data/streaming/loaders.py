"""Loaders over a shard folder, on litdata's ``StreamingDataset`` and ``StreamingDataLoader``.

They yield batches in the form of the in-memory loaders (``BatchLoader``: ``(images, labels)``, images
normalised floats [B, 3, S, S]; ``TokenBatchLoader``: ``(inputs, targets)``, int64 [B, seq_len]), with the
same conventions, so the Trainer and the methods work on them unchanged:

* ``batch_size`` is the global batch; each rank yields its ``batch_size / world_size`` samples, from chunks
  litdata assigns to it (disjoint between ranks and between a rank's worker processes). A training loader on
  several ranks drops the epoch's last samples that do not fill a batch on every rank (fewer than one global
  batch), so every rank takes the same number of steps.
* ``set_epoch(e)`` chooses the epoch's order (a function of ``seed`` and ``e``); a fully consumed iteration
  moves to the next epoch; ``iter_from(k)`` continues an epoch after its first ``k`` batches without decoding
  them, from litdata's loader state when one was loaded (``load_state_dict``; the Trainer's checkpoint carries
  ``state_dict()``), so each sample is seen once in the epoch and the batches equal an uninterrupted run's.
* Every random choice of a sample (its crop, its flip) is drawn from ``(seed, epoch, sample id)``, so it does
  not depend on which worker process decodes the sample, nor on a resume.

Images are decoded and augmented in the worker processes at the size the step needs now: ``image_size``,
or the size set with ``set_image_size`` (progressive resizing), which takes effect when the next epoch's
iteration starts (every batch of an epoch has the same size, and a resumed epoch decodes at the size the
uninterrupted one did). JPEG decoding uses PIL's draft mode, so a small output decodes at a reduced scale.
The worker processes persist across epochs: the epoch and the size reach them through shared memory. A batch
leaves them as uint8 [B, S, S, 3], comes from pinned memory with a non-blocking copy on CUDA, and is permuted to
[B, 3, S, S] and normalised on the device.

Tokens: each stored block of ``block + 1`` tokens gives ``block / seq_len`` consecutive windows. The loader
serves windows of the model's full ``seq_len``; sequence-length warmup (``seq_length_warmup``) truncates or
splits them in the step, as it does for the in-memory loader.
"""
from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch

from speedkit.core.distributed import resolve_shard
from speedkit.data._sharding import GlobalBatch
from speedkit.data.streaming import shards as S

FLIP_MODES = ("random", "alternating", None)


def _rng(seed: int, epoch: int, sample_id: int) -> random.Random:
    return random.Random(f"{seed}/{epoch}/{sample_id}")


class _InWorkers:
    """A transform that litdata carries into the worker processes with the dataset. ``from_store``: the shards are
    in an object store, so a worker started by spawn (not fork) installs speedkit's ``s3://`` downloader too
    (:func:`speedkit.data.streaming.remote.allow_http_endpoints`), as the parent did."""

    from_store = False

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.from_store:
            from speedkit.data.streaming.remote import allow_http_endpoints

            allow_http_endpoints()


class _DecodeImage(_InWorkers):
    """In a worker: JPEG bytes -> uint8 [size, size, 3] (HWC, as decoded), random-resized crop and flip (train) or
    a centre crop. ``epoch`` and ``size`` live in shared memory: the worker processes persist across epochs and
    read what the parent sets there, so a new size (progressive resizing) reaches them without starting them again.

    ``on_device``: the worker only reads the JPEG's header and draws the crop and flip; it hands over the bytes,
    and the loader decodes them on its device (:func:`decode_crops`)."""

    def __init__(self, size: int, train: bool, seed: int, flip: Optional[str], scale: tuple, ratio: tuple,
                 crop_fraction: float, on_device: bool = False):
        self._shared = torch.zeros(2, dtype=torch.int64).share_memory_()  # [epoch, size]
        self.size, self.train, self.seed, self.flip = size, train, seed, flip
        self.scale, self.ratio, self.crop_fraction = scale, ratio, crop_fraction
        self.on_device = on_device
        self.epoch = 0

    # read and written through numpy: a tensor's .item() is an aten op, which a sync counter would see
    @property
    def epoch(self) -> int:
        return int(self._shared.numpy()[0])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._shared.numpy()[0] = int(value)

    @property
    def size(self) -> int:
        return int(self._shared.numpy()[1])

    @size.setter
    def size(self, value: int) -> None:
        self._shared.numpy()[1] = int(value)

    def __call__(self, item: dict) -> dict:
        import numpy as np
        from PIL import Image

        sample_id, size, epoch = int(item["id"]), self.size, self.epoch
        data = item["image"]
        with Image.open(_as_file(data)) as image:
            full = image.size
            image.draft("RGB", (size, size))  # reads no pixels: the size a reduced-scale decode will have
            box, flip = self._crop(image.size, sample_id, epoch)
            if self.on_device:  # the box in the full image's pixels, which the device decodes
                sx, sy = full[0] / image.size[0], full[1] / image.size[1]
                box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
                jpeg = torch.frombuffer(bytearray(bytes(data)), dtype=torch.uint8)
                return {"jpeg": jpeg, "box": box, "flip": bool(flip), "label": int(item["label"]), "id": sample_id}
            image = image.convert("RGB")
            image = image.resize((size, size), Image.BILINEAR, box=box)
            if flip:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.array(image, dtype=np.uint8))
        return {"image": pixels, "label": int(item["label"]), "id": sample_id}


    def _crop(self, size: tuple, sample_id: int, epoch: int) -> tuple:
        """(box, flip) of a sample of ``size`` (width, height): drawn from (seed, epoch, id) in training."""
        if not self.train:
            return _center_box(size, self.crop_fraction), False
        rng = _rng(self.seed, epoch, sample_id)
        box = _random_resized_box(size, self.scale, self.ratio, rng)
        flip = (self.flip == "random" and rng.random() < 0.5) or (
            self.flip == "alternating" and (_rng(self.seed, -1, sample_id).getrandbits(1) + epoch) % 2)
        return box, flip


def decode_crops(jpegs: Sequence[torch.Tensor], boxes: Sequence[tuple], flips: Sequence[bool], size: int,
                 device) -> torch.Tensor:
    """JPEG bytes (CPU uint8 tensors) -> float32 [B, 3, size, size] pixel values in 0..255 on ``device``: decoded
    there by torchvision (nvJPEG on CUDA, in one batched call), each cut to its ``(left, top, right, bottom)`` box in
    the image's pixels, resized with antialiasing like PIL's bilinear, flipped where ``flips`` says, rounded as a
    uint8 image is."""
    from torchvision.io import ImageReadMode, decode_jpeg

    device = torch.device(device)
    images = decode_jpeg(list(jpegs), mode=ImageReadMode.RGB, device=device)
    out = torch.empty(len(images), 3, size, size, device=device)
    for i, (image, box, flip) in enumerate(zip(images, boxes, flips)):
        height, width = image.shape[-2:]
        left, top = min(int(round(box[0])), width - 1), min(int(round(box[1])), height - 1)
        right, bottom = max(int(round(box[2])), left + 1), max(int(round(box[3])), top + 1)
        crop = image[None, :, top:bottom, left:right].to(torch.float32)
        crop = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                                               align_corners=False)
        out[i] = crop[0].flip(-1) if flip else crop[0]
    return out.round_().clamp_(0, 255)


def _as_file(data):
    import io

    return io.BytesIO(bytes(data))


def _random_resized_box(size: tuple, scale: tuple, ratio: tuple, rng: random.Random) -> tuple:
    """torchvision's RandomResizedCrop box, drawn from ``rng``."""
    width, height = size
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return (left, top, left + w, top + h)
    return _center_box(size, 1.0)


def _center_box(size: tuple, fraction: float) -> tuple:
    """The centre square covering ``fraction`` of the short side."""
    width, height = size
    side = min(width, height) * fraction
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def _collate_jpegs(items: list) -> tuple:
    """The batch's JPEG bytes end to end in one tensor (pinned as one block) with each one's length, their boxes and
    flips as lists (read on the host when the device decodes), labels, ids."""
    return (torch.cat([i["jpeg"] for i in items]), [len(i["jpeg"]) for i in items], [i["box"] for i in items],
            [i["flip"] for i in items], torch.tensor([i["label"] for i in items], dtype=torch.int64),
            torch.tensor([i["id"] for i in items], dtype=torch.int64))


def _collate_images(items: list) -> tuple:
    """uint8 [B, S, S, 3] contiguous: HWC images stack into one block of memory (permuted CHW views would be
    gathered element by element); the device permutes and normalises them."""
    return (torch.stack([i["image"] for i in items]), torch.tensor([i["label"] for i in items], dtype=torch.int64),
            torch.tensor([i["id"] for i in items], dtype=torch.int64))


class _Windows:
    """Stored blocks [b, block + 1] -> (inputs, targets, ids) windows [b * k, seq_len]; ``ids`` per block."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def __call__(self, items: list) -> tuple:
        import numpy as np

        blocks = torch.from_numpy(np.stack([np.asarray(i["tokens"]) for i in items]).astype(np.int64))
        inputs = blocks[:, :-1].reshape(-1, self.seq_len)
        targets = blocks[:, 1:].reshape(-1, self.seq_len)
        return inputs, targets, torch.tensor([int(i["id"]) for i in items], dtype=torch.int64)


def _plain(value):
    """litdata's state with its numpy integers (a subsample's region of interest) as Python numbers: a checkpoint
    is loaded weights-only and holds plain data."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value.item() if hasattr(value, "item") and type(value).__module__ == "numpy" else value


class _StreamingLoader(GlobalBatch):
    """What the image and token loaders share: the litdata loader, epochs, resuming, ranks."""

    kind = ""
    # its batches are made on the host, in a torch DataLoader's workers: a read of a CPU value there (the
    # DataLoader draws each epoch's worker seed with .item()) waits on no device (callbacks/sync_counter.py)
    makes_batches_on_host = True

    def __init__(self, root, split: str, batch_size: int, items_per_batch: int, *, shuffle: bool, seed: int,
                 device, num_workers: int, rank: Optional[int], world_size: Optional[int], transform, collate,
                 allow_partial: bool = True, subsample: float = 1.0):
        S.disable_litdata_network()
        from litdata import StreamingDataLoader

        from speedkit.data.streaming.dataset import ShardDataset

        # a ShardSet already read (the token loader reads it first) is not read again: for shards in an object
        # store, each read lists the store
        self.shards = root if isinstance(root, S.ShardSet) else S.read_shards(root, need_complete=not allow_partial)
        if not allow_partial:
            S.check_complete(self.shards)
        if self.shards.kind != self.kind:
            raise S.ShardError(f"{self.shards.location} holds {self.shards.kind} shards, not {self.kind}")
        if self.shards.samples(split) == 0:
            raise S.ShardError(f"{self.shards.location} has no {split} samples; prepare a folder that has them")
        self.rank, self.world_size = resolve_shard(rank, world_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if batch_size % self.world_size:
            raise ValueError(f"batch_size={batch_size} is the global batch size and must split evenly over "
                             f"world_size={self.world_size} ranks; use a multiple of {self.world_size}")
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.device = torch.device(device)
        self.split, self.num_workers = split, num_workers
        self.epoch = 0
        self.fingerprint = self.shards.fingerprint
        self._transform = transform
        transform.from_store = self.shards.url is not None
        # Training on several ranks: every rank the same number of equal batches (see the module's docstring).
        drop_last = shuffle and self.world_size > 1
        if not 0.0 < subsample <= 1.0:
            raise ValueError(f"subsample must be in (0, 1], got {subsample}")
        # subsample < 1: a seeded share of the chunks' samples (litdata's), the same in every epoch. Shards in an
        # object store: litdata downloads each chunk into the cache folder when a worker first needs it.
        advice = (f"`speedkit data info {self.shards.location} --verify` lists every chunk that differs; "
                  f"{S.repair_advice(self.shards, verify=True)}")
        self.dataset = ShardDataset(self.shards.split_source(split), shuffle=shuffle, seed=seed, drop_last=drop_last,
                                    subsample=float(subsample), decode=transform,
                                    where=f"{self.shards.location}/{split}", advice=advice)
        # speedkit's ranks (torchrun's environment, or as given), also when the loader is built before the
        # process group is (litdata would read the group, and see one process).
        from litdata.utilities.env import _DistributedEnv

        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size) or self.world_size)
        self.dataset.distributed_env = _DistributedEnv(self.world_size, self.rank, max(1, self.world_size // per_node))
        # Persistent workers: an epoch's iteration does not start the processes again; what changes between epochs
        # (the epoch, the image size) reaches them through shared memory (ShardDataset, _DecodeImage).
        self.loader = StreamingDataLoader(self.dataset, batch_size=items_per_batch, num_workers=num_workers,
                                          collate_fn=collate, pin_memory=self.device.type == "cuda",
                                          persistent_workers=num_workers > 0)
        self._workers_hold_state = False  # the workers were started with a loaded state in their dataset
        self._pending: Optional[dict] = None  # a loaded state, used when iteration resumes at its batch
        self._yielded = 0  # batches handed out in the current iteration
        self._iter_epoch = 0
        self.seen_ids: Optional[list] = None  # set to a list to record every sample id handed out
        self.resumed_at: Optional[tuple] = None  # (epoch, batch) an iteration continued from a loaded state

    # -- sizes and epochs ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)

    @property
    def dataset_size(self) -> int:
        return self.shards.samples(self.split)

    @property
    def persistent_workers(self) -> bool:
        """Whether the worker processes outlive an epoch's iteration (they do whenever there are any)."""
        return bool(self.loader.persistent_workers)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    # -- iteration and resuming ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple]:
        """This epoch's batches; after ``load_state_dict`` of a state taken mid-epoch, the rest of that epoch (a
        loop that restores a loader's state and then iterates it, as Lightning does, continues where it was)."""
        state = self._pending
        if state is not None and state["epoch"] == self.epoch:
            return self.iter_from(state["batches"])
        return self.iter_from(0)

    def iter_from(self, batch_index: int) -> Iterator[tuple]:
        """This epoch's batches from ``batch_index`` on (see the module's docstring)."""
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        return self._batches(self.epoch, batch_index)

    def _batches(self, epoch: int, batch_index: int) -> Iterator[tuple]:
        state = self._pending
        self._pending = None
        if not (batch_index and state is not None and (state["epoch"], state["batches"]) == (epoch, batch_index)):
            state = None  # not where this iteration starts (an epoch that ended, another run's): not used
        self._before_epoch(epoch, state)
        self._transform.epoch = epoch
        skip = batch_index
        if state is not None or self._workers_hold_state:
            # litdata hands a loaded state to the workers in their copy of the dataset, when they start: workers
            # that hold none (or an earlier one) are started again for it, and once more after it
            self._stop_workers()
        self._workers_hold_state = state is not None
        if state is not None:
            self.loader.load_state_dict(state["litdata"])
            skip, self.resumed_at = 0, (epoch, batch_index)
        else:
            self.loader.current_epoch = epoch  # litdata counts epochs from 1: its iteration adds one
            self.loader.restore = False
        self._iter_epoch, self._yielded = epoch, batch_index - skip
        for batch in self._read():
            if skip:  # no state for this point: replay to it (correct, decodes what it skips)
                skip -= 1
                self._yielded += 1
                continue
            self._yielded += 1
            *batch, ids = batch
            if self.seen_ids is not None:
                self.seen_ids.extend(ids.tolist())
            yield self._finish(batch)
        if self.epoch == epoch:
            self.epoch = epoch + 1

    def _read(self) -> Iterator:
        """litdata's batches; a sample that cannot be read is its one ShardError, from a worker process too."""
        from speedkit.data.streaming.dataset import worker_message

        message = None
        try:
            yield from self.loader
        except S.ShardError as error:
            message = worker_message(error)
        except RuntimeError as error:
            if "Bus error" not in str(error):
                raise
            # A worker reads chunks through a memory map: an offset altered in a chunk points past its end.
            message = (f"a loader worker was killed by a bus error reading {self.shards.location}/{self.split}: "
                       f"either a chunk's bytes changed since it was written (`speedkit data info "
                       f"{self.shards.location} --verify` lists them; {S.repair_advice(self.shards, verify=True)}), "
                       f"or the workers ran out of shared memory (give /dev/shm more room, or use fewer workers)")
        if message is not None:  # raised here, so that it holds no reference to the workers' iterator: they end now
            self._stop_workers()
            raise S.ShardError(message)

    def _stop_workers(self) -> None:
        """End the persistent worker processes; the next iteration starts new ones."""
        iterator, self.loader._iterator = self.loader._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def _before_epoch(self, epoch: int, resumed: Optional[dict]) -> None:
        """Set-up of an epoch's iteration; ``resumed`` is the loaded state it continues from, if any."""

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)  # pinned by the DataLoader on CUDA

    def _finish(self, batch: list) -> tuple:
        return tuple(self._to_device(t) for t in batch)

    # -- the checkpoint's part ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where the iteration stands (epoch, batches handed out, litdata's loader state) and which data it is."""
        return {"kind": self.kind, "fingerprint": self.fingerprint, "root": self.shards.location,
                "split": self.split, "epoch": self._iter_epoch, "batches": self._yielded,
                "litdata": _plain(self.loader.state_dict()) if self._yielded else None}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` at the next ``iter_from`` of its epoch and batch; refuse other data."""
        if not state:
            return
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"the run's checkpoint was trained on other data: its {state.get('split')} shards "
                f"({state.get('root')}, fingerprint {state.get('fingerprint')}) are not these ({self.shards.location}, "
                f"fingerprint {self.fingerprint}); the shards were prepared again or changed since. Resume with the "
                f"data the run started on, or start a new run (another run name, or without --autoresume)")
        self._pending = state if state.get("litdata") else None
        if self._pending is not None:  # mid-epoch: that epoch continues; at its end: the next one starts
            self.epoch = state["epoch"] + (1 if state["batches"] >= len(self) else 0)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.shards.location}/{self.split}, samples={self.dataset_size}, "
                f"batch_size={self.batch_size}, batches={len(self)}, shuffle={self.shuffle}, epoch={self.epoch}"
                + (f", rank={self.rank}/{self.world_size})" if self.world_size > 1 else ")"))


class StreamingImageLoader(_StreamingLoader):
    """(images, labels) batches from image shards: float [B, 3, S, S] normalised with the shards' mean and std
    (or ``mean``/``std``), int64 labels. ``train=True``: shuffled, random-resized crops of ``scale`` and
    ``ratio`` and ``flip`` ("random", "alternating" or None); else a centre crop of ``crop_fraction`` of the short
    side, in order. ``decode_on_device``: the workers only read each JPEG's header and draw its crop, and the
    loader decodes the batch on its device (:func:`decode_crops`); None (the default) chooses it on CUDA where
    torchvision is installed, else the workers decode with PIL. See the module's docstring."""

    kind = "images"

    def __init__(self, root, batch_size: int, *, split: str = "train", train: Optional[bool] = None,
                 image_size: int = 160, flip: Optional[str] = "random", scale: Sequence[float] = (0.35, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), crop_fraction: float = 0.875, mean=None, std=None,
                 dtype: torch.dtype = torch.float32, channels_last: bool = False, seed: int = 0, device="cpu",
                 num_workers: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None,
                 allow_partial: bool = True, subsample: float = 1.0, decode_on_device: Optional[bool] = None):
        train = split == "train" if train is None else train
        if flip not in FLIP_MODES:
            raise ValueError(f"flip must be one of {FLIP_MODES}, got {flip!r}")
        from speedkit.data.images import check_image_size

        self.image_size = self.full_image_size = check_image_size(image_size, "image_size")
        self._next_size = self.image_size
        self.decode_on_device = _choose_device_decoding(decode_on_device, torch.device(device))
        transform = _DecodeImage(self.image_size, train, seed, flip if train else None, tuple(scale), tuple(ratio),
                                 crop_fraction, on_device=self.decode_on_device)
        local = batch_size // max(1, resolve_shard(rank, world_size)[1])
        super().__init__(root, split, batch_size, local, shuffle=train, seed=seed, device=device,
                         num_workers=num_workers, rank=rank, world_size=world_size, transform=transform,
                         collate=_collate_jpegs if self.decode_on_device else _collate_images,
                         allow_partial=allow_partial, subsample=subsample)
        manifest = self.shards.manifest
        self.classes = tuple(manifest["classes"])
        self.mean = tuple(mean if mean is not None else manifest.get("mean", (0.5, 0.5, 0.5)))
        self.std = tuple(std if std is not None else manifest.get("std", (0.25, 0.25, 0.25)))
        self.dtype, self.channels_last = dtype, channels_last
        mean_t = torch.tensor(self.mean, dtype=torch.float32).reshape(1, 3, 1, 1)
        std_t = torch.tensor(self.std, dtype=torch.float32).reshape(1, 3, 1, 1)
        self._scale = (1.0 / (255.0 * std_t)).to(self.device)
        self._shift = (-mean_t / std_t).to(self.device)

    @property
    def image_shape(self) -> tuple:
        return (3, self.image_size, self.image_size)

    def set_image_size(self, size: int) -> None:
        """Decode at ``size`` from the next epoch's iteration on (progressive resizing sets it)."""
        from speedkit.data.images import check_image_size

        self._next_size = check_image_size(int(size), "image size")

    def _before_epoch(self, epoch: int, resumed: Optional[dict]) -> None:
        size = self._next_size
        if resumed is not None and resumed.get("image_size"):  # a resumed epoch decodes at the size it started at
            size = int(resumed["image_size"])
        self.image_size = self._transform.size = size

    def state_dict(self) -> dict:
        return {**super().state_dict(), "image_size": self.image_size, "next_image_size": self._next_size}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if state and state.get("next_image_size"):  # a resume at an epoch's start: the size asked for it
            self._next_size = int(state["next_image_size"])

    def _finish(self, batch: list) -> tuple:
        if self.decode_on_device:
            data, lengths, boxes, flips, labels = batch
            pixels = decode_crops(data.split(lengths), boxes, flips, self.image_size, self.device)
            labels = self._to_device(labels)
        else:
            # uint8 HWC crosses to the device (a quarter of float's bytes); its NCHW view is channels_last already
            images, labels = (self._to_device(t) for t in batch)
            pixels = images.permute(0, 3, 1, 2).to(torch.float32)
        images = pixels.mul_(self._scale).add_(self._shift).to(self.dtype)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        return images.contiguous(memory_format=memory_format), labels


def _choose_device_decoding(asked: Optional[bool], device: torch.device) -> bool:
    """Decode JPEGs on the device: as ``asked``, or (None) on CUDA where torchvision can; else in the workers."""
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
        available = True
    except ImportError:
        available = False
    if asked and not available:
        raise ImportError("decode_on_device=True needs torchvision's decode_jpeg: `pip install torchvision`, or "
                          "leave decode_on_device unset to decode in the loader's workers")
    return bool(asked) if asked is not None else device.type == "cuda" and available


class StreamingTokenLoader(_StreamingLoader):
    """(inputs, targets) int64 [B, seq_len] windows from token shards; ``batch_size`` counts windows (global).
    ``seq_len`` must divide the shards' block; each rank's batch must be a whole number of blocks. See the
    module's docstring."""

    kind = "tokens"

    def __init__(self, root, seq_len: int, batch_size: int, *, split: str = "train", shuffle: Optional[bool] = None,
                 seed: int = 0, device="cpu", num_workers: int = 0, rank: Optional[int] = None,
                 world_size: Optional[int] = None, allow_partial: bool = True, subsample: float = 1.0):
        shards = root if isinstance(root, S.ShardSet) else S.read_shards(root)
        block = int(shards.manifest["block"])
        if seq_len < 1 or block % seq_len:
            raise ValueError(f"seq_len={seq_len} must divide the shards' block of {block} tokens; use one of "
                             f"{[d for d in (block // k for k in (1, 2, 4, 8, 16)) if d * (block // d) == block]} "
                             f"or prepare the text again with --block a multiple of {seq_len}")
        per_block = block // seq_len
        world = resolve_shard(rank, world_size)[1]
        local = batch_size // max(1, world)
        if local % per_block:
            raise ValueError(f"batch_size={batch_size} windows ({local} per rank) must be a multiple of {per_block}: "
                             f"each stored block of {block} tokens gives {per_block} windows of {seq_len}")
        self.seq_len, self.block = seq_len, block
        self.vocab_size = int(shards.manifest["vocab_size"])
        super().__init__(shards, split, batch_size, local // per_block,
                         shuffle=split == "train" if shuffle is None else shuffle, seed=seed, device=device,
                         num_workers=num_workers, rank=rank, world_size=world_size, transform=_Epochless(),
                         collate=_Windows(seq_len), allow_partial=allow_partial, subsample=subsample)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def tokenizer(self):
        """The shards' tokenizer (Hugging Face ``tokenizers``)."""
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(Path(self.shards.root) / self.shards.manifest["tokenizer"]))


class _Epochless(_InWorkers):
    """Token blocks need no per-sample randomness; the loader still sets ``epoch`` on its transform."""

    epoch = 0

    def __call__(self, item):
        return item
