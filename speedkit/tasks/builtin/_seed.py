"""What the seed's workloads (``imagenet``, ``gpt2``) share: their two sizes (``sizes=``) and the rule that turns a
published recipe (the ``gpu`` sizes, the seed's real ones) into its CPU rehearsal.

The sizes say how big a run of the task is, not which methods it uses: the ``cpu`` rehearsal keeps every
preset's methods and their arguments, and scales the model, the inputs, the batch (the learning rate with it,
by the linear scaling rule) and the budget so that a rehearsal could train on a CPU; a method's window counted in
the published run's batches (EMA's half-life) keeps its share of the run. At its ``gpu`` sizes the task compiles the
model (``torch_compile``), as a GPU engineer would; the rehearsal does not (compiling on a CPU costs more than it
saves in a short run). ``sizes=None`` picks ``gpu`` where CUDA is available, else ``cpu``, and the task's
summary says which.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping

from speedkit.core.time import Time, TimeUnit, scaled_duration
from speedkit.tasks.recipes import Recipe, load_presets

SIZE_NAMES = ("cpu", "gpu")


@dataclasses.dataclass(frozen=True)
class SeedSizes:
    """A seed task's sizes under one name (``cpu``, ``gpu``): the run's (model, target, batch, budget) and its
    data's. Image and text tasks differ in which data sizes they read, not in kind: a field a task's data has no
    use for keeps its default (``imagenet`` reads the image ones, ``gpt2`` ``context``)."""
    model: str
    target: float  # imagenet: top-1 accuracy; gpt2: validation loss, nats per token
    batch_size: int | None = None  # None: the recipes' own, and the recipes run as published (``compiled``)
    duration_scale: float = 1.0  # each recipe's budget times this, in a rehearsal
    eval_interval: str | None = None  # None: the recipes' own
    durations: Mapping[str, str] = dataclasses.field(default_factory=dict)  # a recipe's own rehearsal budget
    epoch_samples: int | None = None  # the published runs' data set, whose epochs their windows count in
    # images
    size_scale: float = 1.0  # each recipe's published image sizes (its resolution) times this, to a multiple of 8
    short_side: int | None = None  # what a raw folder's images are stored at in its shards
    crop_scale: tuple[float, float] = (0.08, 1.0)  # the share of an image each training crop may take
    # text
    context: int | None = None  # the longest window the models are built for, and a text folder's shard block


def refuse_in_memory(task: str, stream: bool | None) -> None:
    """The seed tasks always stream from shards: ``stream=False`` (in memory) is refused, not ignored."""
    if stream is False:
        raise ValueError(f"task {task} always streams from shards (a folder is prepared into them once); leave out "
                         f"stream=False, or train in memory with --task "
                         f"{'image-folder' if task == 'imagenet' else 'text-folder'}")


def pick_sizes(task: str, sizes: str | None) -> str:
    """``sizes`` checked, or the ones this machine suits (see the module's docstring)."""
    if sizes is None:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    if sizes not in SIZE_NAMES:
        raise ValueError(f"task {task}: sizes must be one of {SIZE_NAMES} (cpu: a rehearsal with a narrow model and "
                         f"small inputs; gpu: the seed's real sizes), got {sizes!r}")
    return sizes


def need_data(task: str, data, how: str) -> Path | str:
    """``data`` as a folder that exists, or an error that names ``--data`` and how to prepare one. An object-store
    URL (``s3://bucket/prefix``, shards uploaded as prepared) is returned as it is once its scheme is one speedkit
    reads; reading it checks the rest (:mod:`speedkit.data.streaming.remote`)."""
    if data is None:
        raise ValueError(f"task {task!r} trains on your files: give the folder with --data DIR (data=DIR in "
                         f"Python); {how}")
    from speedkit.data.streaming.remote import is_url, normalize

    if is_url(data):
        return normalize(data)
    folder = Path(data).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"task {task!r}: --data {data} is not a folder; {how}")
    return folder


def _count(value) -> Time | None:
    """``value`` as a count of batches or epochs ("100ba", "2ep"), else None."""
    if not isinstance(value, str):
        return None
    try:
        time = Time.from_input(value)
    except (ValueError, TypeError):
        return None
    return time if time.unit in (TimeUnit.BATCH, TimeUnit.EPOCH) else None


def _in_batches(time: Time, epoch_batches: float) -> float:
    return time.value * epoch_batches if time.unit is TimeUnit.EPOCH else time.value


def windows_as_shares(recipe: Recipe, epoch_samples: int | None) -> dict[str, dict]:
    """``recipe``'s methods with each window counted in its published run's batches or epochs given as its share
    of that run (``"dur"``), for a rehearsal that runs the same schedule over far fewer batches.

    Composer's EMA half-life of 100 batches is 0.44% of ``mild``'s published run (36 epochs of ImageNet at batch
    2048, 22,500 batches); kept at 100 batches in a 628-batch rehearsal it would be 16% of it, and evaluation would
    see weights about 140 batches old. As a share it stays 0.44%. EMA's update every 20 batches is a saving tied to
    that window (the smoothing per update is set by their ratio): its share is under one batch of a rehearsal, so
    the rehearsal updates every batch, the exact average the published cadence approximates. ``epoch_samples``:
    the size of the data set the recipe was published on, needed where a window and the budget are counted in
    different units."""
    budget = _count(recipe.duration)
    epoch_batches = epoch_samples / recipe.batch_size if epoch_samples else None
    methods = {name: dict(args) for name, args in recipe.methods.items()}
    for name, args in methods.items():
        for key, value in args.items():
            window = _count(value)
            if window is None or budget is None:
                continue
            if window.unit == budget.unit:
                share = window.value / budget.value
            elif epoch_batches:
                share = _in_batches(window, epoch_batches) / _in_batches(budget, epoch_batches)
            else:
                raise ValueError(f"recipe {recipe.name!r}: {name}.{key}={value!r} and its budget "
                                 f"{recipe.duration!r} count different units; give the size of the data set it "
                                 f"was published on (epoch_samples) to turn the window into a share of the run")
            args[key] = f"{share:.3g}dur"
        if name == "ema" and _count(recipe.methods[name].get("half_life")) is not None:
            args["update_interval"] = 1
    return methods


def rehearsal(recipes: Mapping[str, Recipe], *, model: str, batch_size: int, duration_scale: float,
              scale_lr: bool, eval_interval: str | None = None, durations: Mapping[str, str] | None = None,
              epoch_samples: int | None = None) -> dict[str, Recipe]:
    """The published recipes at a rehearsal's size: the same methods, ``model``, a batch of ``batch_size`` (with
    ``scale_lr``, the learning rate scaled linearly with it: SGD's rule, Goyal et al. 2017), budgets times
    ``duration_scale`` (or the budget ``durations`` gives a recipe: one chosen for the rehearsal where the scaled
    one proved too short), the methods' windows kept at their share of the run (``windows_as_shares``; an EMA
    half-life of 100 published batches would otherwise span a sixth of a rehearsal), and bf16 only where it is
    fast (``precision: auto``): on most CPUs bf16 autocast is emulated, so a rehearsal there runs in fp32."""
    out = {}
    for name, recipe in recipes.items():
        factor = batch_size / recipe.batch_size
        optimizer = {"lr": float(f"{recipe.optimizer['lr'] * factor:.4g}")} if scale_lr and factor != 1 else {}
        # Muon's rate stays: its update is orthogonalized, its size set by that rate, not by the batch
        out[name] = recipe.with_changes(model=model, batch_size=batch_size, optimizer=optimizer,
                                        methods=windows_as_shares(recipe, epoch_samples),
                                        duration=(durations or {}).get(name)
                                        or scaled_duration(recipe.duration, duration_scale, whole=True),
                                        precision="auto" if recipe.precision == "bf16" else recipe.precision,
                                        eval_interval=eval_interval or recipe.eval_interval,
                                        summary=f"{recipe.summary} [cpu rehearsal: {model}, batch {batch_size}]")
    return out


def sized_recipes(task: str, sizes: SeedSizes, *, scale_lr: bool) -> dict[str, Recipe]:
    """``presets/TASK.yaml`` at ``sizes``: as published where they keep the published batch (``sizes.batch_size``
    None), else as a ``rehearsal`` at their model, batch and budget share."""
    recipes = load_presets(task)
    if sizes.batch_size is None:
        return compiled(recipes)
    return rehearsal(recipes, model=sizes.model, batch_size=sizes.batch_size, duration_scale=sizes.duration_scale,
                     scale_lr=scale_lr, eval_interval=sizes.eval_interval, durations=sizes.durations,
                     epoch_samples=sizes.epoch_samples)


def compiled(recipes: Mapping[str, Recipe]) -> dict[str, Recipe]:
    """``recipes`` with ``torch_compile`` on, where a recipe does not set it itself."""
    return {name: recipe if "torch_compile" in recipe.methods else
            recipe.with_changes(methods={**recipe.methods, "torch_compile": {}}) for name, recipe in recipes.items()}

