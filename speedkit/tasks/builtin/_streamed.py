"""Tasks on streamed shards: the base the seed tasks (``imagenet``, ``gpt2``) build on (``streamed_image_task``,
``streamed_token_task``), and the folder tasks ``image-folder`` and ``text-folder`` on it when ``--data`` is a
shard folder (``speedkit data prepare``), when asked (``stream=True``), or when an image folder would not fit in
memory.

A folder that is not a shard folder is prepared once into a cache folder (``$SPEEDKIT_SHARDS``, else
``~/.cache/speedkit/shards/``), named by the folder's path and the prepare's options; a later run finds it there
(a prepare whose source changed is refused with the fix, see :mod:`speedkit.data.streaming.prepare`).
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from speedkit.data.folder_split import has_given_split
from speedkit.data.streaming.remote import describe
from speedkit.data.streaming.shards import MANIFEST, is_shard_folder, read_shards
from speedkit.tasks.task import DataRequest, Task

# text-folder's evaluation reads at most this many tokens: the in-memory text loader's 64 x 32 windows of 256.
EVAL_TOKENS = 64 * 32 * 256


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
    stale = done and split_unrecorded(read_shards(out))
    warnings.warn(f"{source}: {reason}; streaming it from shards in {out}"
                  + (" (prepared before the in-memory and streamed paths split an image folder by one rule: "
                     "preparing them again)" if stale else "" if done else
                     " (preparing them now, once: `speedkit data prepare` does the same)"), stacklevel=3)
    if stale or not done:
        from speedkit.data.streaming.prepare import prepare_images, prepare_text

        prepare = prepare_images if kind == "images" else prepare_text
        prepare(source, out, workers=min(8, os.cpu_count() or 1), progress=True, overwrite=stale, **options)
    return out


def split_unrecorded(info) -> bool:
    """Whether image shards were prepared before their manifest recorded how the folder was split (``split_rule``,
    :mod:`speedkit.data.folder_split`): such a split may differ from the in-memory image-folder task's."""
    if info.kind != "images" or "split_rule" in info.manifest:
        return False
    source = Path(str(info.manifest.get("source", "")))  # a folder with its own train/ and val/ was never split
    return not (source.is_absolute() and has_given_split(source))


def streams(task: str, data, stream: bool | None) -> bool:
    """Whether a folder task streams ``data`` from the start: a shard folder always (``stream=False`` is refused
    for one, not ignored), anything else where ``stream`` asks."""
    if is_shard_folder(data):
        if stream is False:
            raise ValueError(f"{task}: --data {data} is a shard folder (speedkit data prepare), which is streamed, "
                             f"never read into memory; leave out stream=False, or give the folder it was prepared "
                             f"from")
        return True
    return bool(stream)


def _fraction(fraction: float | None) -> float:
    return 1.0 if fraction is None else float(fraction)


def read_kind(shards: Path | str, kind: str, refusal: str):
    """The shards' ``ShardSet``, refused with ``refusal`` (``{shards}`` and ``{kind}`` filled in) unless they
    hold ``kind``; image shards split before the folder split rule was shared are warned of."""
    info = read_shards(shards)
    if info.kind != kind:
        raise ValueError(refusal.format(shards=shards, kind=info.kind))
    if kind == "images" and split_unrecorded(info):
        warnings.warn(f"{shards} was prepared before speedkit split an image folder by one rule in memory and "
                      f"streamed: where it split class folders into training and validation (no train/ and val/ "
                      f"of their own), a class of few images may hold other validation images than the in-memory "
                      f"image-folder task's; `speedkit data prepare SOURCE --out {shards} --overwrite` prepares "
                      f"them again by the shared rule", stacklevel=3)
    return info


def _partial(info) -> str:
    return "" if info.complete else ", PARTIAL shards"


def streamed_image_task(shards: Path | str, info, *, name: str, sizes, target: float, summary,
                        flips_keep_labels: bool = True, crop_scale: tuple[float, float] | None = None,
                        **task) -> Task:
    """A classification Task over the image shards ``shards`` (``info``: their ``read_kind``): ``image-folder``'s
    streamed path and ``imagenet``.

    ``sizes(recipe, train)``: ``(image size, evaluation crop fraction or None)`` a loader reads at; ``summary(info,
    classes)``: the task's summary before the shards' state; ``crop_scale``: the share of an image a training crop
    may take (None: the loader's); ``task``: the rest of the Task's fields (recipes, models, ...)."""
    from speedkit.data.streaming.loaders import StreamingImageLoader
    from speedkit.tasks.builtin._shared import classification_metrics, recipe_augment, vision_model_factory

    classes = info.manifest["classes"]

    def loader(request: DataRequest, train: bool):
        augment = recipe_augment(request.recipe) if train else None
        flip = (augment.flip if augment is not None else "random") if flips_keep_labels else None
        size, crop_fraction = sizes(request.recipe, train)
        options = {"crop_fraction": crop_fraction} if crop_fraction is not None else {}
        options.update({"scale": crop_scale} if crop_scale is not None else {})
        return StreamingImageLoader(shards, request.batch_size, split="train" if train else "val", image_size=size,
                                    flip=flip, seed=request.seed, device=request.device,
                                    num_workers=request.num_workers,
                                    subsample=_fraction(request.data_fraction if train else request.eval_fraction),
                                    **options)

    return Task(name=name, domain="vision", summary=summary(info, classes) + _partial(info),
                model=vision_model_factory(3, len(classes)),
                train_data=lambda request: loader(request, True), eval_data=lambda request: loader(request, False),
                metrics=classification_metrics, target_metric="eval/accuracy", target_value=target,
                flips_keep_labels=flips_keep_labels, **task)


def folder_image_task(shards: Path | str, image_size: int | None, target: float, flips_keep_labels: bool):
    """The image-folder Task over image shards, at ``image_size`` (None: the shards' short side)."""
    from speedkit.tasks.builtin._shared import LIBRARY_MODELS
    from speedkit.tasks.recipes import load_presets

    info = read_kind(shards, "images", "{shards} holds {kind} shards; --task text-folder trains on them")
    size = image_size or int(info.manifest["options"]["short_side"])
    return streamed_image_task(
        shards, info, name="image-folder", sizes=lambda recipe, train: (size, None), target=target, flips_keep_labels=flips_keep_labels,
        summary=lambda info, classes: f"{len(classes)}-class images streamed from shards {describe(info)}, "
                                      f"{size}x{size}, {info.samples('train')} training images",
        recipes=load_presets("image-folder"), models=("resnet9", "resnet8", *LIBRARY_MODELS))


STREAMED_GPTS = ("gpt-nano", "gpt-micro", "gpt-mini", "gpt-small", "gpt2-124m")


def streamed_token_task(shards: Path | str, info, *, name: str, longest_context: int, eval_tokens: int,
                        target: float, summary, model=None, **task) -> Task:
    """A GPT Task over the BPE token shards ``shards`` (``info``: their ``read_kind``), evaluated by loss (nats per token: bits per byte would need the bytes each
    token stands for): ``text-folder``'s streamed path and ``gpt2``.

    Windows are the model's context, at most ``longest_context``, cut down to divide the shards' block (windows
    never cross blocks); evaluation reads at most ``eval_tokens`` per evaluation. ``model(name, vocab)``: the
    model (None: ``get_model`` with the shards' vocabulary); ``summary(info, vocab)``: the task's summary before
    the shards' state; ``task``: the rest of the Task's fields."""
    from speedkit.data.streaming.loaders import StreamingTokenLoader
    from speedkit.models import get_model
    from speedkit.record.metrics import CrossEntropy
    from speedkit.tasks.builtin._shared import _context_length, _for_model

    vocab, block = int(info.manifest["vocab_size"]), int(info.manifest["block"])

    def seq_len(request: DataRequest) -> int:
        return floor_to_divisor(block, _context_length(request, longest_context))

    def train(request: DataRequest):
        length = seq_len(request)
        per_block = block // length
        batch = max(per_block, request.batch_size // per_block * per_block)  # whole blocks, in windows
        return _for_model(StreamingTokenLoader(shards, length, batch, seed=request.seed, device=request.device,
                                               num_workers=request.num_workers,
                                               subsample=_fraction(request.data_fraction)), request)

    def evaluate(request: DataRequest):
        length = seq_len(request)
        per_block = block // length
        windows = info.samples("val") * per_block
        share = min(1.0, eval_tokens / length / max(1, windows)) * _fraction(request.eval_fraction)
        return _for_model(StreamingTokenLoader(shards, length, max(per_block, 8 // per_block * per_block),
                                               split="val", device=request.device, num_workers=request.num_workers,
                                               subsample=share), request)

    return Task(name=name, domain="language", summary=summary(info, vocab) + _partial(info),
                model=lambda model_name: (model or (lambda n, v: get_model(n, vocab_size=v)))(model_name, vocab),
                train_data=train, eval_data=evaluate, metrics=lambda: {"loss": CrossEntropy()},
                target_metric="eval/loss", target_value=target, **task)


def folder_token_task(shards: Path | str, target: float | None, recipes: dict):
    """The text-folder Task over BPE token shards: a GPT with the shards' vocabulary."""
    info = read_kind(shards, "tokens", "{shards} holds {kind} shards; --task image-folder trains on them")
    return streamed_token_task(
        shards, info, name="text-folder",
        longest_context=256, eval_tokens=EVAL_TOKENS, target=4.0 if target is None else target,
        summary=lambda info, vocab: f"a GPT on {info.manifest.get('tokens', {}).get('train', '?')} BPE tokens "
                                    f"(vocabulary {vocab}) streamed from shards {describe(info)}",
        models=STREAMED_GPTS, recipes=recipes)


def floor_to_divisor(block: int, length: int) -> int:
    """The longest window at most ``length`` that divides the shards' ``block`` (windows never cross blocks)."""
    length = max(1, min(length, block))
    return max(d for d in range(1, length + 1) if block % d == 0)
