"""Tasks into runs: the one resolver of a task (a name, a ``Task``, ``"pkg.mod:attr"``, a function, a folder),
and where recipes become Trainer arguments. ``Task``, the registry and the recipe resolver ``get_recipe`` are in
``speedkit.tasks.task``, the built-in tasks in ``speedkit.tasks.builtin``.

The CLI, the demo, the notebooks and the benchmark all build their runs through ``make_trainer``,
so a configuration means the same thing everywhere. A hand-built Trainer takes a recipe's parts from
``recipe_parts``: the Trainer itself takes parts, never recipes, so a recipe is resolved here only.
"""
from __future__ import annotations

import inspect
import os
import re
import warnings
from types import SimpleNamespace

import torch

from speedkit.core.batch import batch_inputs, call_model, to_device
from speedkit.core.devices import loader_workers, resolve_device
from speedkit.core.method import NothingToChangeError
from speedkit.methods import build_methods
from speedkit.optim.factory import make_optimizer_factory
from speedkit.record.metrics import Evaluator
from speedkit.tasks.ladder import STRONG_BASELINE, measure_hint, with_enough_steps, with_ladder
from speedkit.tasks.recipes import Recipe, timing_eval_interval, without_flips
from speedkit.tasks.task import (FOLDER_TASKS, TASKS, DataRequest, Task, did_you_mean, get_recipe, import_attribute,
                                  is_baseline, register_task)
from speedkit.tasks.request import RECIPE_OVERRIDES, RunRequest
from speedkit.train.checks import check_first_outputs, describe
from speedkit.train.trainer import Trainer


# -- tasks: one resolver for every entry point --------------------------------------------------
def resolve_task(task, data=None, **options) -> Task:
    """The Task that ``task`` names (see ``find_task``), registered so that its name works everywhere afterwards."""
    return register_task(find_task(task, data, **options), replace=True)


def find_task(task, data=None, **options) -> Task:
    """The Task that ``task`` names, not registered (``make_trainer`` registers it once the run is built).

    ``task`` is a Task, a registered name (``"fashion-mnist"``), a folder task's name with ``data`` (the
    folder: ``"image-folder"``, ``"text-folder"``), ``"package.module:attr"`` naming a Task or a function
    returning one, or such a function itself (called with ``data=`` when ``data`` is given). ``options`` go
    to a folder task's function (``image_size=64``) or the user's. A folder task's name without ``data`` is
    the folder last resolved in this process (how a benchmark's or a search's runs find it again).
    """
    if isinstance(task, Task):
        _refuse_data(data, options, f"task object {task.name!r}")
        return task
    if isinstance(task, str) and task in FOLDER_TASKS:
        if data is None and not options and task in TASKS:
            return TASKS[task]  # the folder resolved (and registered) earlier in this process: a search's trials
        if data is None:
            hint = getattr(FOLDER_TASKS[task], "data_hint", "")
            raise ValueError(f"task {task!r} trains on your files: give the folder (--data DIR, or data=DIR)"
                             + (f"; {hint}" if hint else ""))
        _refuse_unknown_options(FOLDER_TASKS[task], options, f"task {task!r}")
        return _reading(FOLDER_TASKS[task](data, **options), data)
    if isinstance(task, str) and task in TASKS:
        _refuse_data(data, options, f"task {task!r}")
        return TASKS[task]
    if isinstance(task, str) and ":" in task:
        return find_task(import_attribute(task), data, **options)
    if callable(task):
        _refuse_unknown_options(task, options, f"task function {getattr(task, '__qualname__', task)!r}")
        made = task(data=data, **options) if data is not None else task(**options)
        if not isinstance(made, Task):
            raise TypeError(f"task function {getattr(task, '__qualname__', task)!r} returned {type(made).__name__}, "
                            f"not a speedkit.Task")
        return made if data is None else _reading(made, data)
    known = sorted({*TASKS, *FOLDER_TASKS})
    raise ValueError(f"unknown task {task!r}{did_you_mean(task, known)}; give one of {known}, a speedkit.Task, "
                     f"'package.module:attr' naming one, or a function returning one")


def _reading(task: Task, data) -> Task:
    """``task``, made from ``data``, knowing it (``Task.data_source``) unless its maker said where it reads."""
    if task.data_source is None and isinstance(data, (str, os.PathLike)):
        object.__setattr__(task, "data_source", str(data))  # a frozen Task, completed once where it is made
    return task


def _refuse_unknown_options(make_task, options: dict, what: str) -> None:
    """An option ``make_task`` does not take, named with those it does (a bare TypeError named neither the task nor
    what to give instead)."""
    try:
        parameters = inspect.signature(make_task).parameters
    except (TypeError, ValueError):  # a callable Python cannot read the signature of: its own error, if any
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    taken = [name for name, p in parameters.items()
             if name != "data" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = [name for name in options if name not in taken]
    if unknown:
        raise ValueError(f"{what} takes no option {', '.join(map(repr, unknown))}"
                         f"{did_you_mean(unknown[0], taken)}; its options: {', '.join(taken)}")


def _refuse_data(data, options: dict, what: str) -> None:
    if options:
        raise ValueError(f"{what} is made already, so the options {sorted(options)} would be ignored; they are for "
                         f"{sorted(FOLDER_TASKS)} and for task functions")
    if data is not None:
        raise ValueError(f"{what} loads its own data, so data={str(data)!r} would be ignored; --data DIR is for "
                         f"{sorted(FOLDER_TASKS)} and for task functions that take data=")


# A folder task's presets are read without its folder (``speedkit recipes --task imagenet`` lists them): per task,
# its domain, its baselines and a function of the options the presets depend on (the seed tasks' sizes, imagenet's
# training size).
def _image_folder_presets(sizes, image_size):
    from speedkit.tasks.recipes import load_presets

    return load_presets("image-folder")


def _text_folder_presets(sizes, image_size):
    from speedkit.tasks.builtin.pydocs import PYDOCS
    from speedkit.tasks.builtin.text_folder import _adopted

    return _adopted(PYDOCS.recipes, ("baseline",))


def _imagenet_presets(sizes, image_size):
    from speedkit.tasks.builtin._seed import pick_sizes
    from speedkit.tasks.builtin.imagenet import imagenet_recipes

    return imagenet_recipes(pick_sizes("imagenet", sizes), image_size)


def _gpt2_presets(sizes, image_size):
    from speedkit.tasks.builtin._seed import pick_sizes
    from speedkit.tasks.builtin.gpt2 import gpt2_recipes

    return gpt2_recipes(pick_sizes("gpt2", sizes))


FOLDER_PRESETS = {"image-folder": ("vision", ("baseline",), _image_folder_presets),
                  "text-folder": ("language", ("baseline",), _text_folder_presets),
                  "imagenet": ("vision", ("baseline", "plain-bf16"), _imagenet_presets),
                  "gpt2": ("language", ("baseline",), _gpt2_presets)}


def folder_task_presets(task: str, sizes: str | None = None, image_size: int | None = None) -> SimpleNamespace:
    """A folder task's ``recipes`` and ``baselines`` as the task runs them, without its folder: the same recipes
    ``find_task(task, DIR).recipes`` holds (the seed tasks' at ``sizes``, imagenet's at ``image_size``),
    the domain's ladder rebuilt on the baseline where the task ships none of its rungs; ``sizes`` names the ones
    they are at (None for a task that has one size)."""
    from speedkit.tasks.builtin._seed import pick_sizes

    domain, baselines, presets = FOLDER_PRESETS[task]
    recipes = with_ladder(domain, presets(sizes, image_size))
    if STRONG_BASELINE in recipes and STRONG_BASELINE not in baselines:
        baselines = (*baselines, STRONG_BASELINE)
    sizes = pick_sizes(task, sizes) if task in ("imagenet", "gpt2") else None
    return SimpleNamespace(recipes=recipes, baselines=baselines, sizes=sizes)


def model_fit_problem(task: Task, model: str) -> str | None:
    """Why ``model`` does not fit the task's data (channels, classes, vocabulary), or None when it does."""
    return task.model_fit_problem(model)


# -- recipes into Trainer arguments -------------------------------------------------------------
def recipe_parts(recipe: str | Recipe, model: torch.nn.Module | None = None, *,
                 max_duration: str | None = None, optimizers=None, schedulers=None, methods=None,
                 precision: str | None = None, loggers=None, config: dict | None = None) -> dict:
    """The Trainer arguments a recipe supplies, with the ones given here winning over the recipe's.

    ``recipe`` is a Recipe, ``"task:name"`` or a bare name picked by ``model``'s domain (vision or
    language): ``Trainer(model, data, **recipe_parts("mild", model, max_duration="2ep"))``. The data is yours, so
    what a recipe says of it (its batch size, augmentation, loader and ``resolution``) is for your loaders to do.
    """
    recipe = get_recipe(None, recipe, model=model)
    return {"max_duration": max_duration or recipe.duration,
            "optimizers": optimizers or make_optimizer_factory(recipe.optimizer),
            "schedulers": recipe.schedule if schedulers is None else schedulers,
            "methods": build_methods(recipe.methods) if methods is None else methods,
            "precision": precision or recipe.precision,
            "loggers": list(recipe.loggers) if loggers is None else loggers,
            "config": {"recipe": recipe.name, "recipe_spec": recipe.to_dict(), **(config or {})}}


# -- the one way to build a run -----------------------------------------------------------------
# Runs built here (the CLI, the explorer, notebooks) checkpoint as they train: a kill (SIGKILL, out of memory)
# loses at most this much training, and runs shorter than it pay nothing beyond their final checkpoint.
# The cost of a save is measured by bench/results/2026-12-01-checkpoint-cost/measure_checkpoint_cost.py
# (not in a test: it is a timing).
DEFAULT_SAVE_INTERVAL = "5m"


def make_trainer(task: str | Task | RunRequest = "fashion-mnist", recipe: str | Recipe = "baseline",
                 **overrides) -> Trainer:
    """The Trainer for a run request: ``make_trainer(RunRequest(...))``, or the convenience form
    ``make_trainer(task, recipe, **overrides)``, which builds the request (``RunRequest.build``): each
    keyword is a request field (``duration="2ep"``, ``methods="label_smoothing"``, ``seed=1``,
    ``data_fraction=0.1``, ...) or a Trainer keyword argument (``callbacks=[...]``, ``autoresume=True``,
    ``overwrite=True``, ``extend_duration=True``). ``save_interval`` defaults to a checkpoint every
    ``DEFAULT_SAVE_INTERVAL`` of training (any duration: ``"200ba"``, ``"1ep"``; None: only the final one).

    ``task`` is anything ``resolve_task`` takes (a name, a Task, ``"pkg.mod:attr"``, a function); ``data``
    is the folder of a folder task, ``task_options`` its options (``{"image_size": 64}``). ``extra_config``
    is stored in the RunRecord's config beside the task and recipe (the benchmark marks seeds and
    leave-one-out runs this way).
    """
    if isinstance(task, RunRequest):
        if overrides or recipe != "baseline":
            raise TypeError("make_trainer(request) takes the request alone; change it with "
                            "request.replace(field=value), or call make_trainer(task, recipe, **overrides)")
        request = task
    else:
        request = RunRequest.build(task, recipe, **overrides)
    return _build_trainer(request)


def request_task(request: RunRequest) -> Task:
    """The Task a request names (not registered: ``make_trainer`` registers it once the run is built)."""
    return find_task(request.task, request.data, **(request.task_options or {}))


def request_recipe(request: RunRequest, task: Task) -> Recipe:
    """The request's recipe for ``task`` (by name, from a file, or as given), with its overrides applied, and
    without flips where a flip changes the task's labels (``Task.flips_keep_labels``)."""
    recipe = get_recipe(task, request.recipe).with_changes(
        model=request.model, duration=request.duration, precision=request.precision,
        batch_size=request.batch_size, eval_interval=request.eval_interval)
    if _timed_baseline(request, task):
        recipe = recipe.with_changes(eval_interval=timing_eval_interval(recipe))
    if request.methods is not None:
        recipe = recipe.with_changes(methods=request.methods)
    if recipe.resolution is not None and not task.reads_resolution:
        raise ValueError(f"recipe {recipe.name!r} sets resolution {recipe.resolution}, which task {task.name!r} "
                         f"does not read (its loaders decode at the task's own image size): leave resolution out "
                         f"of the recipe, or give the size as the task's option (--image-size)")
    return recipe if task.flips_keep_labels else _keep_labels(task, recipe, asked=request.methods or {})


def _timed_baseline(request: RunRequest, task: Task) -> bool:
    """Whether the request trains one of the task's baselines to its target, with no cadence given. Such a run
    evaluates as ``speedkit bench`` and ``speedkit tune`` time baselines, so a speed-up checked by hand is not
    measured against a time rounded up to the baseline's next coarse evaluation."""
    named = isinstance(request.recipe, str) and is_baseline(task, request.recipe)
    return named and request.stop_at_target and request.eval_interval is None


def _keep_labels(task: Task, recipe: Recipe, asked: dict) -> Recipe:
    """``recipe`` without its flips, with a warning naming what was taken out; a method asked for by name that
    would be taken out whole is refused instead, naming it."""
    adapted, removed = without_flips(recipe)
    refused = sorted(set(asked) - set(adapted.methods))
    if refused:
        raise ValueError(f"methods {refused} only flip images, but on task {task.name!r} a horizontal flip changes "
                         f"the label (flips_keep_labels=False); leave them out")
    if removed:
        warnings.warn(f"task {task.name!r}: a horizontal flip changes its labels, so recipe {recipe.name!r} runs "
                      f"without {', '.join(removed)}", stacklevel=2)
    return adapted


def resolved_request(request: RunRequest, task: Task | None = None) -> RunRequest:
    """The same run with its recipe resolved and the overrides folded into it: two requests for the same
    run resolve equal, whichever front end built them."""
    recipe = request_recipe(request, task if task is not None else request_task(request))
    return request.replace(recipe=recipe, step_floor=planned_on_data(request),
                           **{name: None for name in RECIPE_OVERRIDES})


def planned_on_data(request: RunRequest) -> bool:
    """Whether a rebuilt rung in ``request`` is planned on the data (lengthened to the ladder's step floor): a
    length the user asks for is theirs; a rung named, or given with ``step_floor``, is planned."""
    return request.duration is None and (isinstance(request.recipe, str) or request.step_floor)


def _build_trainer(request: RunRequest) -> Trainer:
    spec = request_task(request)
    recipe = request_recipe(request, spec)
    problem = model_fit_problem(spec, recipe.model)
    if problem:
        raise ValueError(problem)
    measuring = {"bench", "tune"} & set(request.extra_config or {})  # a run of the measurement the hint names
    if recipe.unmeasured_rebuild and not measuring and not is_baseline(spec, recipe.name):
        hint = measure_hint(_task_spelling(request, spec), recipe.name, request.data, request.task_options,
                            spec.baselines[-1])
        warnings.warn(f"recipe {recipe.name!r} on task {spec.name!r} is {recipe.adopted_from} rebuilt on this task's "
                      f"baseline, and nobody has measured it here: before trusting its speed-up, see whether it "
                      f"reaches the target, with `{hint}`", stacklevel=3)
    dropped: dict[str, str] = {}
    while True:
        try:
            return _trainer_of(request, spec, recipe, dropped)
        except NothingToChangeError as e:  # a rung rebuilt for this task: a surgery with nothing to change here
            if recipe.adopted_from is None or e.method not in recipe.methods:
                raise
            warnings.warn(f"recipe {recipe.name!r} on task {spec.name!r} runs without {e.method}: {e}", stacklevel=3)
            recipe = recipe.with_changes(methods={k: v for k, v in recipe.methods.items() if k != e.method})
            dropped[e.method] = str(e)


def _task_spelling(request: RunRequest, spec: Task) -> str:
    """How the CLI names the request's task: its name, or the 'package.module:attr' it was given as."""
    return request.task if isinstance(request.task, str) else spec.name


def _trainer_of(request: RunRequest, spec: Task, recipe: Recipe, dropped: dict[str, str]) -> Trainer:
    device = resolve_device(request.device)
    torch.manual_seed(request.seed)  # the same initial weights for every recipe with the same seed
    net = spec.model(recipe.model)
    data_request = DataRequest(batch_size=recipe.batch_size, device=device, seed=request.seed,
                               data_fraction=request.data_fraction, eval_fraction=request.eval_fraction,
                               recipe=recipe, model=net, download=request.download,
                               num_workers=loader_workers(request.num_workers, device))
    train = spec.train_data(data_request)
    rung = recipe.adopted_from is not None and not is_baseline(spec, recipe.name) and "baseline" in spec.recipes
    if rung and planned_on_data(request):
        recipe = with_enough_steps(recipe, spec.recipes["baseline"], _length(train))  # never a handful of steps
    evaluators = [Evaluator(spec.eval_data(data_request), dict(spec.metrics()))]
    eval_batch = check_model_fits_data(spec, net, evaluators[0].dataloader)
    target_value = request.target if request.target is not None else recipe_target(spec, recipe)
    inputs = input_sizes(train, eval_batch)
    config = {"task": spec.name, "data_fraction": request.data_fraction,
              "target": {"metric": spec.target_metric, "value": target_value}, **_data_description(request, spec),
              **({"inputs": inputs} if inputs else {}), **departures(request, spec, recipe, dropped),
              **(request.extra_config or {})}
    where = {k: v for k, v in (("run_name", request.run_name), ("run_dir", request.run_dir)) if v is not None}
    trainer = Trainer(
        net, train, evaluators=evaluators, device=device, seed=request.seed,
        **recipe_parts(recipe, net, config=config, loggers=request.loggers),
        eval_interval=recipe.eval_interval,
        stop_at=(spec.target_metric, target_value) if request.stop_at_target else None,
        loss_fn=spec.loss, **where, **{"save_interval": DEFAULT_SAVE_INTERVAL, **request.trainer_options})
    trainer.record.target = {"metric": spec.target_metric, "value": target_value}
    register_task(spec, replace=True)  # built: its name and recipes now work everywhere (not before: a refused
    return trainer                     # task stays out of the explorer's list)


def _data_description(request: RunRequest, spec: Task) -> dict:
    """The data part of the run description a resume is checked against (speedkit.record.run_folder): the folder
    given, or the one the task named here was made from (a benchmark's or a search's runs name it alone)."""
    described = {"eval_fraction": request.eval_fraction, "stop_at_target": bool(request.stop_at_target)}
    if spec.data_identity is not None:  # a task made from request.data knows it (find_task)
        described["data"] = spec.data_identity
    if request.task_options:
        described["task_options"] = dict(request.task_options)
    return described


def check_model_fits_data(task: Task, model: torch.nn.Module, eval_data):
    """One evaluation batch through the fresh model, so that a model whose outputs do not fit the task's
    labels is refused when the run is built, naming both, rather than when it starts training. Returns that
    batch (what evaluation takes in: ``input_sizes`` reads it)."""
    device = next(model.parameters(), torch.empty(0)).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # training's draws stay put
        batch = next(iter(eval_data), None)
        if batch is None:
            raise ValueError(f"task {task.name!r}: its evaluation data yielded no batches; eval_data(request) "
                             f"must return at least one batch")
        batch = to_device(batch, device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                outputs = call_model(model, batch)
        except Exception as e:
            raise ValueError(f"task {task.name!r}: its model {type(model).__name__} cannot take its data: it raised "
                             f"{type(e).__name__} on the batch {describe(batch)}: {e}") from e
        finally:
            model.train(was_training)
    default_loss = task.loss is None and not callable(getattr(model, "loss", None))  # the Trainer's cross-entropy
    try:
        check_first_outputs(SimpleNamespace(batch=batch, outputs=outputs, model=model), default_loss=default_loss)
    except (ValueError, TypeError) as e:
        raise type(e)(f"task {task.name!r}: {e}") from e
    return batch


# -- what a run trains, beside what its recipe publishes ----------------------------------------
def departures(request: RunRequest, task: Task, recipe: Recipe, dropped: dict[str, str]) -> dict:
    """Where the run departs from the preset it names, for its record and the lines a run starts with:
    ``switched_off`` (method -> why: left out by the task as it runs here, e.g. at its cpu sizes; a flip that would
    change the labels; a surgery with nothing to change) and ``precision_published`` where the task runs another
    precision than the preset file states. A run whose methods or precision the user gave departs on purpose:
    those are not listed."""
    found = {}
    own = task.recipes.get(recipe.name) if isinstance(request.recipe, str) else None
    published = _published_preset(task.name, recipe.name) if own is not None else None
    if request.methods is None and own is not None:
        off = {}
        for name in (published or own).methods:
            if name in recipe.methods:
                continue
            if name in dropped:
                off[name] = dropped[name]
            elif name not in own.methods:
                off[name] = _note_on(own.summary, name) or f"left out by task {task.name!r} as it runs here"
            elif not task.flips_keep_labels:
                off[name] = f"a horizontal flip changes task {task.name!r}'s labels"
        if off:
            found["switched_off"] = off
    if published is not None and request.precision is None and published.precision != recipe.precision:
        found["precision_published"] = published.precision
    return found


def _published_preset(task: str, name: str) -> Recipe | None:
    """A built-in task's preset as its recipe file states it, before the task adapts it (to its sizes)."""
    from speedkit.tasks.recipes import PRESETS, load_presets

    if not (PRESETS / f"{task}.yaml").is_file():
        return None
    return load_presets(task).get(name)


def _note_on(summary: str, method: str) -> str | None:
    """The bracketed note a task added to a recipe's summary about ``method`` ("[progressive resizing off: ...]")."""
    words = method.replace("_", " ")
    return next((note for note in re.findall(r"\[([^\]]+)\]", summary or "") if words in note), None)


# -- what a run takes in ------------------------------------------------------------------------
def input_sizes(train_loader, eval_batch) -> dict | None:
    """The input sizes a run trains and evaluates at, as they are, not as a recipe publishes them:
    ``{"train": 32, "eval": 32, "unit": "px"}`` (an image's side, ``"HxW"`` where not square) or ``"tokens"`` (a
    sequence's length). Training's is what its loader decodes at (a progressive resize starts below it);
    evaluation's is read from an evaluation batch. None where neither is known (a loader of the user's own)."""
    sizes = {"train": _loader_input_size(train_loader), "eval": _batch_input_size(eval_batch)}
    units = {size[1] for size in sizes.values() if size is not None}
    if len(units) != 1:
        return None
    return {**{part: size[0] for part, size in sizes.items() if size is not None}, "unit": units.pop()}


def _loader_input_size(loader) -> tuple | None:
    """(size, unit) that a loader states: a streamed loader's full image size, an in-memory one's stored images,
    a token loader's sequence length; a wrapped loader's (``.loader``)."""
    for _ in range(3):
        size = getattr(loader, "full_image_size", None) or getattr(loader, "image_size", None)
        if isinstance(size, int):
            return size, "px"
        images = getattr(loader, "images", None)
        if isinstance(images, torch.Tensor) and images.ndim == 4:
            return _side(images.shape[-2:]), "px"
        if isinstance(getattr(loader, "seq_len", None), int):
            return loader.seq_len, "tokens"
        if isinstance(loader, torch.utils.data.DataLoader):
            return _sample_input_size(loader.dataset)
        loader = getattr(loader, "loader", None)
    return None


def _sample_input_size(dataset) -> tuple | None:
    """(size, unit) of a map-style dataset's first sample as its transforms make it (an image [C, H, W] or a
    sequence of token ids), drawn with torch's generators put back, so training's draws stay as they were."""
    if not hasattr(dataset, "__getitem__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    try:
        with torch.random.fork_rng(devices=[]):
            sample = dataset[0]
    except Exception:  # a dataset that cannot be indexed so: its size stays unknown, the run goes on
        return None
    inputs = batch_inputs(sample) if isinstance(sample, (tuple, list, dict)) else sample
    if isinstance(inputs, torch.Tensor) and inputs.ndim == 3:
        return _side(inputs.shape[-2:]), "px"
    if isinstance(inputs, torch.Tensor) and inputs.ndim == 1 and not inputs.is_floating_point():
        return int(inputs.shape[0]), "tokens"
    return None


def _batch_input_size(batch) -> tuple | None:
    inputs = batch_inputs(batch) if batch is not None else None
    if not isinstance(inputs, torch.Tensor):
        return None
    if inputs.ndim == 4:
        return _side(inputs.shape[-2:]), "px"
    if inputs.ndim == 2 and not inputs.is_floating_point():
        return int(inputs.shape[-1]), "tokens"
    return None


def _side(shape) -> int | str:
    height, width = int(shape[0]), int(shape[1])
    return height if height == width else f"{height}x{width}"


def recipe_target(spec: Task, recipe: Recipe) -> float:
    """The target a run of ``recipe`` is measured against: the one it was tuned for, else the task's."""
    if recipe.target is None:
        return spec.target_value
    if recipe.target["metric"] != spec.target_metric:
        raise ValueError(f"recipe {recipe.name!r} targets {recipe.target['metric']}, but task {spec.name!r} "
                         f"measures {spec.target_metric}; set the recipe's target metric to {spec.target_metric!r}")
    return recipe.target["value"]



def _length(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
