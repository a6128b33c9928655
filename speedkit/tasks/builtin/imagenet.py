"""The imagenet task: ResNets on an ImageNet-layout folder or its shards (``--task imagenet --data DIR``).

``DIR`` is a shard folder (``speedkit data prepare``) or an ImageNet-layout folder (``train/<class>/`` and
``val/<class>/`` of JPEG/PNG of any size, or class folders split ``val_fraction`` per class), prepared into
shards once at the profile's short side, as ``image-folder --stream`` does; images are streamed from them
(``speedkit.tasks.builtin._streamed``), decoded and cropped in the loader's workers.

Two profiles (``speedkit.tasks.builtin._seed``): ``gpu``, the seed's real sizes: torchvision ResNet-50 with
Composer's published recipes (``presets/imagenet.yaml``), training at 176 px and evaluated at 224 px; ``cpu``, a
rehearsal: the same methods on a ResNet-18 at 64 px, evaluated at 80 px, except progressive resizing, whose
smallest image would fall below the published one (``smallest_image_kept``). Evaluating at a higher resolution than
training is FFCV's test (``eval_image_size``): random-resized crops make objects look larger in training than a
centre crop does at test time, which a larger test image corrects (Touvron et al. 2019, "Fixing the train-test
resolution discrepancy"; FFCV's ImageNet configs, which Composer's recipes follow with 176/224).
"""
from __future__ import annotations

import dataclasses

from speedkit.data.images import check_image_size
from speedkit.tasks.builtin import _seed
from speedkit.tasks.builtin._shared import LIBRARY_MODELS, classification_metrics, recipe_augment, vision_model_factory
from speedkit.tasks.task import DataRequest, Task

HOW = ("--data is an ImageNet-layout folder (train/<class>/*.JPEG and val/<class>/*.JPEG, or <class>/ folders "
       "split per class) or its shards: `speedkit data prepare DIR --out SHARDS --short-side 256` writes them once")
MODELS = ("resnet50", "resnet101", "resnet18", *LIBRARY_MODELS)  # torchvision (weights=None), timm:<name> by name


@dataclasses.dataclass(frozen=True)
class ImagenetProfile:
    image_size: int  # training crops
    eval_image_size: int  # evaluation: larger than training (FFCV's test, see the module's docstring)
    short_side: int  # what a raw folder's images are stored at in its shards
    model: str
    target: float  # top-1 accuracy
    batch_size: int | None = None  # None: the recipes' own
    duration_scale: float = 1.0
    epoch_samples: int | None = None  # the published runs' data set, whose epochs their windows count in


IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC-2012's training set, the one Composer's recipes were published on

PROFILES = {
    # Composer's recipes: train crop 176, evaluation crop 224; top-1 target MLPerf's ResNet-50 one (75.9%)
    "gpu": ImagenetProfile(image_size=176, eval_image_size=224, short_side=256, model="resnet50", target=0.759),
    # A rehearsal: ResNet-18 at 64 px (the 64-128 px), the ratio of 176 to 224 kept for evaluation;
    # batch 64 (learning rates scaled linearly) and a tenth of each budget, the EMA's window kept at its share of
    # the published run (_seed.windows_as_shares) and no image smaller than the published recipes train on
    # (smallest_image_kept). Its target is the user's data's.
    "cpu": ImagenetProfile(image_size=64, eval_image_size=80, short_side=96, model="resnet18", target=0.5,
                           batch_size=64, duration_scale=0.1, epoch_samples=IMAGENET_TRAIN_IMAGES),
}


def smallest_image_kept(recipe, image_size: int):
    """``recipe`` with progressive resizing's smallest training image no smaller in pixels than in the published
    recipe, which trains at 176 px from half that, 88 px.

    What a picture shows depends on its pixels, not on its share of a full size: a rehearsal that trains at 64 px
    and kept the published half would start at 32 px, where a ResNet's last stage sees one pixel and a small
    object in the frame is a few; on a held-out set of photographed things that rehearsal of ``mild`` learned
    nothing in the 40% of its run held at 32 px (bench/README.md, "progressive resizing"). The rehearsal has
    already spent the saving progressive resizing buys by training at 64 px, so below 88 px the method is
    dropped, and the summary says so."""
    resizing = recipe.methods.get("progressive_resizing")
    published_size = PROFILES["gpu"].image_size
    if resizing is None or image_size >= published_size:
        return recipe
    smallest = resizing["initial_scale"] * published_size  # every imagenet preset states it
    methods = dict(recipe.methods)
    if smallest < image_size:
        methods["progressive_resizing"] = {**resizing, "initial_scale": round(smallest / image_size, 3)}
        note = f"progressive resizing from {smallest:.0f} px"
    else:
        del methods["progressive_resizing"]
        note = f"progressive resizing off: its smallest image, {smallest:.0f} px, is not below {image_size} px"
    return recipe.with_changes(methods=methods, summary=f"{recipe.summary} [{note}]")


def imagenet_recipes(profile: str, image_size: int | None = None) -> dict:
    """The presets (``presets/imagenet.yaml``) as the profile runs them, at its training size or ``image_size``
    (``smallest_image_kept``)."""
    size = PROFILES[profile].image_size if image_size is None else image_size
    return {name: smallest_image_kept(recipe, size)
            for name, recipe in _seed.profile_recipes("imagenet", PROFILES[profile], scale_lr=True).items()}


def imagenet_task(data=None, profile: str | None = None, image_size: int | None = None,
                  eval_image_size: int | None = None, val_fraction: float = 0.1, seed: int = 0,
                  target: float | None = None, skip_unreadable: bool = False, stream: bool | None = None) -> Task:
    """ResNets on an ImageNet-layout folder or its shards, with Composer's ResNet-50 recipes (``--task imagenet``).

    ``profile``: ``gpu`` (ResNet-50, 176 px training, 224 px evaluation) or ``cpu`` (a rehearsal: ResNet-18 at
    64/80 px); None: ``gpu`` where CUDA is available. ``image_size`` and ``eval_image_size`` override the
    profile's (evaluating larger than training is FFCV's test). ``target`` is the top-1 accuracy to reach.
    ``stream`` is accepted for the folder tasks' flags: this task always streams."""
    profile = _seed.pick_profile("imagenet", profile)
    folder = _seed.need_data("imagenet", data, HOW)
    sizes = PROFILES[profile]
    train_size = sizes.image_size if image_size is None else check_image_size(image_size)
    if eval_image_size is None:
        eval_size = sizes.eval_image_size if image_size is None else train_size
    else:
        eval_size = check_image_size(eval_image_size, "--eval-image-size (eval_image_size)")
    from speedkit.data.streaming.loaders import StreamingImageLoader
    from speedkit.data.streaming.shards import read_shards
    from speedkit.tasks.builtin import _streamed

    shards = _streamed.shards_for(folder, "images", "an ImageNet-layout folder", short_side=sizes.short_side,
                                  val_fraction=val_fraction, seed=seed, skip_bad=skip_unreadable)
    info = read_shards(shards)
    if info.kind != "images":
        raise ValueError(f"task imagenet: {shards} holds {info.kind} shards, not images; {HOW}")
    classes = info.manifest["classes"]

    def loader(request: DataRequest, train: bool):
        augment = recipe_augment(request.recipe) if train else None
        flip = augment.flip if augment is not None else "random"
        fraction = request.data_fraction if train else request.eval_fraction
        return StreamingImageLoader(shards, request.batch_size, split="train" if train else "val",
                                    image_size=train_size if train else eval_size, flip=flip, seed=request.seed,
                                    device=request.device, num_workers=request.num_workers,
                                    subsample=1.0 if fraction is None else float(fraction))

    partial = "" if info.complete else ", PARTIAL shards"
    return Task(name="imagenet", domain="vision",
                summary=f"imagenet ({profile} profile): {len(classes)} classes streamed from shards "
                        f"{_streamed.describe(info)}, "
                        f"{info.samples('train')} training images at {train_size} px, evaluated at {eval_size} px"
                        + partial,
                model=vision_model_factory(3, len(classes)),
                train_data=lambda request: loader(request, True), eval_data=lambda request: loader(request, False),
                metrics=classification_metrics, target_metric="eval/accuracy",
                target_value=sizes.target if target is None else target,
                recipes=imagenet_recipes(profile, train_size),
                models=(sizes.model, *[m for m in MODELS if m != sizes.model]),
                baselines=("baseline", "plain-bf16"))


imagenet_task.data_hint = HOW
