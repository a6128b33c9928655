"""The folder tasks on streamed shards: ``image-folder`` and ``text-folder`` when ``--data`` is a shard folder
(``speedkit data prepare``), when asked (``stream=True``), or when an image folder would not fit in memory.

A folder that is not a shard folder is prepared once into a cache folder (``$SPEEDKIT_SHARDS``, else
``~/.cache/speedkit/shards/``), named by the folder's path and the prepare's options; a later run finds it there
(a prepare whose source changed is refused with the fix, see :mod:`speedkit.data.streaming.prepare`).
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from speedkit.data.streaming.remote import describe
from speedkit.data.streaming.shards import MANIFEST, is_shard_folder, read_shards
from speedkit.tasks.task import DataRequest

# Evaluation reads at most this many windows (text) per evaluation, like the in-memory text loader's 64 x 32.
EVAL_WINDOWS = 64 * 32


def shard_cache(source: Path, what: str) -> Path:
    """Where the shards of ``source`` prepared as ``what`` live (see the module's docstring)."""
    root = Path(os.environ.get("SPEEDKIT_SHARDS") or Path.home() / ".cache" / "speedkit" / "shards")
    key = hashlib.sha256(f"{source.resolve()}|{what}".encode()).hexdigest()[:10]
    return root / f"{source.name}-{what}-{key}"


def shards_for(data, kind: str, reason: str, **options) -> Path | str:
    """``data`` itself when it is a shard folder (or an object-store URL of one), else its shards, prepared now
    unless already complete there."""
    from speedkit.data.streaming.remote import is_url, normalize

    if is_url(data):
        return normalize(data)
    source = Path(data).expanduser()
    if is_shard_folder(source):
        return source
    if kind == "tokens":  # the cache's name holds every option that changes the shards: the block order too
        options = {"shuffle_blocks": True, **options}
    what = "-".join(f"{k}{v}" for k, v in sorted(options.items()))
    out = shard_cache(source, what)
    done = (out / MANIFEST).is_file() and read_shards(out).complete
    warnings.warn(f"{source}: {reason}; streaming it from shards in {out}"
                  + ("" if done else " (preparing them now, once: `speedkit data prepare` does the same)"), stacklevel=3)
    if not done:
        from speedkit.data.streaming.prepare import prepare_images, prepare_text

        prepare = prepare_images if kind == "images" else prepare_text
        prepare(source, out, workers=min(8, os.cpu_count() or 1), progress=True, **options)
    return out


def _fraction(fraction: float | None) -> float:
    return 1.0 if fraction is None else float(fraction)


def streamed_image_task(shards: Path | str, image_size: int | None, target: float, flips_keep_labels: bool):
    """The image-folder Task over image shards."""
    from speedkit.data.streaming.loaders import StreamingImageLoader
    from speedkit.tasks.builtin._shared import LIBRARY_MODELS, classification_metrics, recipe_augment, vision_model_factory
    from speedkit.tasks.recipes import load_presets
    from speedkit.tasks.task import Task

    info = read_shards(shards)
    manifest = info.manifest
    if info.kind != "images":
        raise ValueError(f"{shards} holds {info.kind} shards; --task text-folder trains on them")
    size = image_size or int(manifest["options"]["short_side"])
    classes = manifest["classes"]

    def loader(request: DataRequest, train: bool):
        augment = recipe_augment(request.recipe) if train else None
        flip = (augment.flip if augment is not None else "random") if flips_keep_labels else None
        fraction = _fraction(request.data_fraction if train else request.eval_fraction)
        return StreamingImageLoader(shards, request.batch_size, split="train" if train else "val", image_size=size,
                                    flip=flip, seed=request.seed, device=request.device,
                                    num_workers=request.num_workers, subsample=fraction)

    partial = "" if info.complete else ", PARTIAL shards"
    return Task(name="image-folder", domain="vision",
                summary=f"{len(classes)}-class images streamed from shards {describe(info)}, {size}x{size}, "
                        f"{info.samples('train')} training images{partial}",
                model=vision_model_factory(3, len(classes)),
                train_data=lambda request: loader(request, True), eval_data=lambda request: loader(request, False),
                metrics=classification_metrics, target_metric="eval/accuracy", target_value=target,
                recipes=load_presets("image-folder"), models=("resnet9", "resnet8", *LIBRARY_MODELS),
                flips_keep_labels=flips_keep_labels)


STREAMED_GPTS = ("gpt-nano", "gpt-micro", "gpt-mini", "gpt-small", "gpt2-124m")


def streamed_text_task(shards: Path | str, target: float | None, recipes: dict):
    """The text-folder Task over BPE token shards: a GPT with the shards' vocabulary, evaluated by loss (nats per
    token: bits per byte would need the bytes each token stands for)."""
    from speedkit.data.streaming.loaders import StreamingTokenLoader
    from speedkit.models import get_model
    from speedkit.record.metrics import CrossEntropy
    from speedkit.tasks.builtin._shared import _context_length, _for_model
    from speedkit.tasks.task import Task

    info = read_shards(shards)
    if info.kind != "tokens":
        raise ValueError(f"{shards} holds {info.kind} shards; --task image-folder trains on them")
    vocab, block = int(info.manifest["vocab_size"]), int(info.manifest["block"])

    def seq_len(request: DataRequest) -> int:
        context = min(_context_length(request), block)
        return max(d for d in range(1, context + 1) if block % d == 0)

    def train(request: DataRequest):
        length = seq_len(request)
        batch = max(block // length, request.batch_size // (block // length) * (block // length))
        return _for_model(StreamingTokenLoader(shards, length, batch, seed=request.seed, device=request.device,
                                               num_workers=request.num_workers,
                                               subsample=_fraction(request.data_fraction)), request)

    def evaluate(request: DataRequest):
        length = seq_len(request)
        per_block = block // length
        windows = info.samples("val") * per_block
        fraction = min(1.0, EVAL_WINDOWS / max(1, windows)) * _fraction(request.eval_fraction)
        return _for_model(StreamingTokenLoader(shards, length, 8 * per_block, split="val", device=request.device,
                                               num_workers=request.num_workers, subsample=fraction), request)

    def model(name: str):
        return get_model(name, vocab_size=vocab)

    return Task(name="text-folder", domain="language",
                summary=f"a GPT on {info.manifest.get('tokens', {}).get('train', '?')} BPE tokens (vocabulary "
                        f"{vocab}) streamed from shards {describe(info)}"
                        + ("" if info.complete else ", PARTIAL shards"),
                model=model, train_data=train, eval_data=evaluate, metrics=lambda: {"loss": CrossEntropy()},
                target_metric="eval/loss", target_value=4.0 if target is None else target, models=STREAMED_GPTS,
                recipes=recipes)
