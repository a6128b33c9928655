"""The imagenet task: ResNets on an ImageNet-layout folder or its shards (``--task imagenet --data DIR``).

``DIR`` is a shard folder (``speedkit data prepare``) or an ImageNet-layout folder (``train/<class>/`` and
``val/<class>/`` of JPEG/PNG of any size, or class folders split ``val_fraction`` per class), prepared into
shards once at the sizes' short side, as ``image-folder --stream`` does; images are streamed from them
(``speedkit.tasks.builtin._streamed``), decoded and cropped in the loader's workers.

Each recipe trains and evaluates at its published image sizes (``Recipe.resolution``): Composer's baseline at
224 px, evaluated on 224 px cropped from 256; its speed-up recipes at 176 px, evaluated on 224 px cropped from
232. Training smaller than the test is part of what those recipes save, and evaluating larger than training is
FFCV's test: random-resized crops make objects look larger in training than a centre crop does at test time,
which a larger test image corrects (Touvron et al. 2019, "Fixing the train-test resolution discrepancy"; FFCV's
ImageNet configs, which Composer's recipes follow). Two sizes (``sizes=``, ``speedkit.tasks.builtin._seed``):
``gpu``, the seed's real ones, torchvision ResNet-50 at those sizes (``presets/imagenet.yaml``); ``cpu``, a
rehearsal: the same methods on a ResNet-18 with every size scaled by 64/176 (the speed-up recipes train at 64 px,
the baselines at 80, all evaluate at 80), except progressive resizing, whose smallest image would fall below the
published one (``smallest_image_kept``).
"""
from __future__ import annotations

from speedkit.data.images import check_image_size
from speedkit.tasks.builtin import _seed
from speedkit.tasks.builtin._seed import SeedSizes
from speedkit.tasks.builtin._shared import LIBRARY_MODELS
from speedkit.tasks.task import Task

HOW = ("--data is an ImageNet-layout folder (train/<class>/*.JPEG and val/<class>/*.JPEG, or <class>/ folders "
       "split per class) or its shards: `speedkit data prepare DIR --out SHARDS --short-side 256` writes them once")
MODELS = ("resnet50", "resnet101", "resnet18", *LIBRARY_MODELS)  # torchvision (weights=None), timm:<name> by name

IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC-2012's training set, the one Composer's recipes were published on
# torchvision's ImageNet pipeline (random-resized 224 px; 224 px cropped from 256 for evaluation), for a recipe that
# states no resolution of its own
STANDARD_RESOLUTION = {"train": 224, "eval": 224, "eval_crop": 0.875}
RECIPES_TRAIN_SIZE = 176  # Composer's speed-up recipes' training size, the one the cpu sizes scale to 64 px

SIZES = {
    # the published sizes and crops (torchvision's random-resized crop of 8-100% of an image, as in Composer's and
    # FFCV's ImageNet pipelines); top-1 target MLPerf's ResNet-50 one (75.9%)
    "gpu": SeedSizes(size_scale=1.0, short_side=256, model="resnet50", target=0.759),
    # A rehearsal: ResNet-18 with the speed-up recipes at 64 px (the 64-128 px) and every other size in
    # proportion; batch 64 (learning rates scaled linearly) and a tenth of each budget, the EMA's window kept at its
    # share of the published run (_seed.windows_as_shares) and no image smaller than the published recipes train on
    # (smallest_image_kept). Its crops take 35-100% of an image, the streaming loader's default, with which every
    # rehearsal in bench/results was run; the published 8-100% is not yet measured at these sizes. Its target is the
    # user's data's.
    "cpu": SeedSizes(size_scale=64 / RECIPES_TRAIN_SIZE, short_side=96, model="resnet18", target=0.5,
                     batch_size=64, duration_scale=0.1, epoch_samples=IMAGENET_TRAIN_IMAGES,
                     crop_scale=(0.35, 1.0)),
}


def published_resolution(recipe) -> dict:
    """``recipe``'s published image sizes, the standard ones filling what it does not state."""
    return {**STANDARD_RESOLUTION, **(getattr(recipe, "resolution", None) or {})}


def image_sizes(recipe, sizes: str, image_size: int | None = None,
                eval_image_size: int | None = None) -> tuple[int, int, float]:
    """``(training size, evaluation size, evaluation crop)`` for ``recipe`` at ``sizes``: its published
    sizes times their scale, to a multiple of 8 (the cpu sizes turn 224 px into 80). A size the user
    gives is used for every recipe as it is: ``image_size`` for training, and for evaluation unless
    ``eval_image_size`` is given."""
    published, scale = published_resolution(recipe), SIZES[sizes].size_scale

    def scaled(size: int) -> int:
        return max(8, 8 * round(size * scale / 8))

    train = scaled(published["train"]) if image_size is None else image_size
    if eval_image_size is None:
        eval_image_size = scaled(published["eval"]) if image_size is None else image_size
    return train, eval_image_size, published["eval_crop"]


def smallest_image_kept(recipe, image_size: int):
    """``recipe`` with progressive resizing's smallest training image no smaller in pixels than in the published
    recipe, which trains at 176 px from half that, 88 px.

    What a picture shows depends on its pixels, not on its share of a full size: a rehearsal that trains at 64 px
    and kept the published half would start at 32 px, where a ResNet's last stage sees one pixel and a small
    object in the frame is a few; on a held-out set of photographed things that rehearsal of ``mild`` learned
    nothing in the 40% of its run held at 32 px (bench/results/2026-12-04-imagenet-rehearsal/README.md). The
    rehearsal has already spent the saving progressive resizing buys by training at 64 px, so below 88 px the
    method is dropped, and the summary says so."""
    resizing = recipe.methods.get("progressive_resizing")
    published_size = published_resolution(recipe)["train"]
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


def imagenet_recipes(sizes: str, image_size: int | None = None) -> dict:
    """The presets (``presets/imagenet.yaml``) at ``sizes`` (``cpu``, ``gpu``), each at its training size there
    or at ``image_size`` (``smallest_image_kept``)."""
    recipes = _seed.sized_recipes("imagenet", SIZES[sizes], scale_lr=True)
    return {name: smallest_image_kept(recipe, image_sizes(recipe, sizes, image_size)[0])
            for name, recipe in recipes.items()}


def _describe_sizes(recipes: dict, sizes: str, image_size: int | None, eval_image_size: int | None) -> str:
    """"training images at 80 px (baseline, plain-bf16) and 64 px (mild, medium, hot), evaluated at 80 px", or
    "training images at 224 px, evaluated at 224 px" where every recipe trains at one size."""
    by_size: dict[int, list[str]] = {}
    evaluated = set()
    for name, recipe in recipes.items():
        train, evaluate, _ = image_sizes(recipe, sizes, image_size, eval_image_size)
        by_size.setdefault(train, []).append(name)
        evaluated.add(evaluate)
    trained = " and ".join(f"{size} px ({', '.join(names)})" for size, names in by_size.items()) \
        if len(by_size) > 1 else f"{next(iter(by_size))} px"
    return f"training images at {trained}, evaluated at {' / '.join(f'{s} px' for s in sorted(evaluated))}"


def imagenet_task(data=None, sizes: str | None = None, image_size: int | None = None,
                  eval_image_size: int | None = None, val_fraction: float = 0.1, seed: int = 0,
                  target: float | None = None, skip_unreadable: bool = False, stream: bool | None = None) -> Task:
    """ResNets on an ImageNet-layout folder or its shards, with Composer's ResNet-50 recipes (``--task imagenet``).

    ``sizes``: ``gpu`` (ResNet-50 at the published sizes) or ``cpu`` (a rehearsal: ResNet-18 with every size
    times 64/176); None: ``gpu`` where CUDA is available. ``image_size`` and ``eval_image_size``, where given,
    replace every recipe's sizes (``image_sizes``). ``target`` is the top-1 accuracy to reach.
    The task always streams: ``stream`` True or None, for the folder tasks' flags; False is refused."""
    _seed.refuse_in_memory("imagenet", stream)
    sizes = _seed.pick_sizes("imagenet", sizes)
    folder = _seed.need_data("imagenet", data, HOW)
    spec = SIZES[sizes]
    if image_size is not None:
        image_size = check_image_size(image_size)
    if eval_image_size is not None:
        eval_image_size = check_image_size(eval_image_size, "--eval-image-size (eval_image_size)")
    from speedkit.tasks.builtin import _streamed

    shards = _streamed.shards_for(folder, "images", "an ImageNet-layout folder", short_side=spec.short_side,
                                  val_fraction=val_fraction, seed=seed, skip_bad=skip_unreadable)
    info = _streamed.read_kind(shards, "images", "task imagenet: {shards} holds {kind} shards, not images; " + HOW)
    recipes = imagenet_recipes(sizes, image_size)

    def loader_sizes(recipe, train: bool) -> tuple[int, float]:
        train_size, eval_size, eval_crop = image_sizes(recipe, sizes, image_size, eval_image_size)
        return (train_size if train else eval_size), eval_crop

    return _streamed.streamed_image_task(
        shards, info, name="imagenet", sizes=loader_sizes, crop_scale=spec.crop_scale,
        target=spec.target if target is None else target,
        summary=lambda info, classes: f"imagenet ({sizes} sizes): {len(classes)} classes streamed from shards "
                                      f"{_streamed.describe(info)}, {info.samples('train')} "
                                      f"{_describe_sizes(recipes, sizes, image_size, eval_image_size)}",
        recipes=recipes, reads_resolution=True, models=(spec.model, *[m for m in MODELS if m != spec.model]),
        baselines=("baseline", "plain-bf16"))


imagenet_task.data_hint = HOW
