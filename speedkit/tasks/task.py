"""Task: a model, its data, its metrics and target, its recipes and its baselines, as one public object;
the one registry of tasks by name; and ``get_recipe``, the one way a recipe is named.

The built-in tasks (``speedkit.tasks.builtin``) are defined with it and take no special path, so a
user's task runs wherever theirs do: ``make_trainer(task, recipe)``, ``speedkit train --task``,
``speedkit bench``, the explorer, ``speedkit tune`` and the notebooks. ``register_task`` makes a task
known by name (and its recipes by ``get_recipe(task.name, ...)``). The registry knows the built-in tasks
by name and imports each where it is first asked for, so nothing has to be imported to fill it.
"""
from __future__ import annotations

import copy
import dataclasses
import fnmatch
import functools
import importlib
from typing import Callable, Iterable, Iterator, Mapping, MutableMapping

import torch

from speedkit.core.method import DOMAINS, check_free_name, show
from speedkit.record.metrics import Metric
from speedkit.tasks.ladder import STRONG_BASELINE, with_ladder
from speedkit.tasks.recipes import Recipe, recipe_file_spec


@dataclasses.dataclass(frozen=True)
class DataRequest:
    """What a task's data factories are asked for. ``model`` is the run's model, built before the data
    (a language task reads its context length); ``recipe`` carries the input pipeline (augmentation, loader)."""

    batch_size: int
    device: torch.device
    seed: int = 0
    data_fraction: float = 1.0  # train on this class-balanced or leading share of the training data
    eval_fraction: float | None = None  # None: the whole evaluation set
    recipe: Recipe | None = None
    model: torch.nn.Module | None = None
    download: bool = False
    num_workers: int = 0


@dataclasses.dataclass(frozen=True)
class Task:
    """A training problem the toolkit can run, measure and tune.

    ``model(name)`` builds the model a recipe names (``recipe.model``); ``models`` lists the names it
    accepts, shell patterns allowed (``"torchvision:*"``), the first being the default. ``train_data`` and
    ``eval_data`` take a :class:`DataRequest` and return an iterable of batches (a DataLoader, a list, ...)
    in any shape ``speedkit.core.batch`` reads: ``(inputs, targets)``, ``(inputs, targets, extra...)`` or a
    dict. ``metrics()`` returns fresh metrics by name; ``target_metric`` is ``"eval/<one of them>"``.
    ``loss(outputs, targets)`` is optional: by default the model's own ``loss`` or cross-entropy.
    ``recipes`` maps names to Recipes and must hold a ``"baseline"``; a recipe leaves out its task and domain
    (the task's) or states this task's. ``baselines`` are the recipes speed-ups are measured against. A task
    whose recipes hold none of its domain's speed presets (mild, medium, hot) gets them rebuilt on its
    baseline, budgets scaled to the baseline's (``speedkit.tasks.ladder``).
    """

    name: str
    domain: str  # one of speedkit.core.method.DOMAINS: which models, methods and preset recipes suit it
    model: Callable[[str], torch.nn.Module]
    train_data: Callable[[DataRequest], Iterable]
    eval_data: Callable[[DataRequest], Iterable]
    metrics: Callable[[], Mapping[str, Metric]]
    target_metric: str
    target_value: float
    recipes: Mapping[str, Recipe]
    loss: Callable | None = None
    summary: str = ""
    models: tuple[str, ...] = ()  # empty: the models its recipes name
    baselines: tuple[str, ...] = ("baseline",)  # the recipes speed-ups are measured against, weakest first
    # Whether a horizontal flip leaves an image's label as it is: not for digits, letters or text. Where it does
    # not, runs train without flip augmentation, alternating flips and the mirrored test-time view.
    flips_keep_labels: bool = True
    # Whether its loaders decode images at the sizes a recipe's ``resolution`` states; a run of a recipe with one is
    # refused on a task that would ignore it (speedkit.tasks.build.request_recipe).
    reads_resolution: bool = False
    # The folder or file its data is read from, as given (None: its own data); every run records what it held
    # (``data_identity``), so runs of one task name on other files are never taken for each other.
    data_source: str | None = None

    def __post_init__(self):
        where = f"task {show(self.name)}"
        if not isinstance(self.name, str) or not self.name.strip() or ":" in self.name:
            raise ValueError(f"{where}: name must be a non-empty string without ':' (that marks 'module:attr')")
        if self.domain not in DOMAINS:
            raise ValueError(f"{where}: domain must be one of {DOMAINS}, got {show(self.domain)}")
        if not isinstance(self.reads_resolution, bool):
            raise TypeError(f"{where}: reads_resolution must be True or False (whether its loaders decode at a "
                            f"recipe's resolution), got {show(self.reads_resolution)}")
        if not isinstance(self.flips_keep_labels, bool):
            raise TypeError(f"{where}: flips_keep_labels must be True or False (whether a horizontal flip keeps "
                            f"an image's label), got {show(self.flips_keep_labels)}")
        for field in ("model", "train_data", "eval_data", "metrics"):
            if not callable(getattr(self, field)):
                raise TypeError(f"{where}: {field} must be a function, got {show(getattr(self, field))}")
        if self.loss is not None and not callable(self.loss):
            raise TypeError(f"{where}: loss must be a function loss(outputs, targets) or None, got {show(self.loss)}")
        self._check_target(where)
        self._check_recipes(where)
        recipes = with_ladder(self.domain, dict(self.recipes))
        if STRONG_BASELINE in recipes and STRONG_BASELINE not in self.recipes:  # rebuilt: the strongest baseline
            object.__setattr__(self, "baselines", (*self.baselines, STRONG_BASELINE))
        object.__setattr__(self, "recipes", recipes)
        if not self.models:
            object.__setattr__(self, "models", tuple(dict.fromkeys(r.model for r in self.recipes.values())))

    @functools.cached_property
    def data_identity(self) -> dict | str | None:
        """What ``data_source`` holds (``speedkit.data.identity``: path, files, fingerprint), read once for the
        task rather than at every run of it (a large folder is a stat per file); None for a task's own data."""
        from speedkit.data.identity import data_identity

        return None if self.data_source is None else data_identity(self.data_source)

    def _check_target(self, where: str) -> None:
        metrics = self.metrics()
        if not isinstance(metrics, Mapping) or not metrics:
            raise TypeError(f"{where}: metrics() must return a dict {{name: Metric}}, got {show(metrics)}")
        allowed = [f"eval/{name}" for name in metrics]
        if self.target_metric not in allowed:
            raise ValueError(f"{where}: target_metric {show(self.target_metric)} is not one of its metrics "
                             f"{allowed}; name one of them")
        if isinstance(self.target_value, bool) or not isinstance(self.target_value, (int, float)):
            raise TypeError(f"{where}: target_value must be a number, got {show(self.target_value)}")

    def _check_recipes(self, where: str) -> None:
        if not isinstance(self.recipes, Mapping) or "baseline" not in self.recipes:
            raise ValueError(f"{where}: recipes must be a dict holding a 'baseline' Recipe, got {show(self.recipes)}")
        for key, recipe in self.recipes.items():
            if not isinstance(recipe, Recipe):
                raise TypeError(f"{where}: recipes[{key!r}] must be a speedkit.tasks.recipes.Recipe, got {show(recipe)}")
            if recipe.name != key or recipe.task not in (None, self.name) or recipe.domain not in (None, self.domain):
                raise ValueError(f"{where}: recipes[{key!r}] says name={recipe.name!r}, task={recipe.task!r}, "
                                 f"domain={recipe.domain!r}; it must say name={key!r} and leave out task and "
                                 f"domain (or say task={self.name!r}, domain={self.domain!r})")
        missing = [b for b in self.baselines if b not in self.recipes]
        if missing:
            raise ValueError(f"{where}: baselines {missing} are not among its recipes {sorted(self.recipes)}")

    def recipe(self, name: str) -> Recipe:
        """A copy of the recipe called ``name``, saying whose it is (this task and its domain)."""
        if name not in self.recipes:
            raise ValueError(f"unknown recipe {name!r} for {self.name}; known: {sorted(self.recipes)}")
        recipe = copy.deepcopy(self.recipes[name])
        recipe.task, recipe.domain = self.name, self.domain
        return recipe

    # -- what menus show and what make_trainer checks ------------------------------------------
    @property
    def model_names(self) -> list[str]:
        """The models to offer by name (patterns such as ``"torchvision:*"`` left out)."""
        return [m for m in self.models if not _is_pattern(m)]

    def model_fit_problem(self, model: str) -> str | None:
        """Why the model named ``model`` does not fit this task's data, or None when it does."""
        if any(fnmatch.fnmatchcase(model, accepted) for accepted in self.models):
            return None
        return f"model {model!r} does not fit task {self.name!r}; use one of {list(self.models)}"


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


# -- the registry: name -> Task ------------------------------------------------------------------
def import_attribute(spec: str):
    """The object ``"package.module:attr"`` names, with an error that says what failed and what to check."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"task {spec!r}: expected 'package.module:attr', e.g. 'mytasks:flowers'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"task {spec!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); check "
                         f"that it is on the Python path (run from its folder, or pip install its package)") from e
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise ValueError(f"task {spec!r}: module {module_name!r} has no attribute {attr!r}; name a Task or a "
                             f"function returning one")
        value = getattr(value, part)
    return value


class LazyTable(Mapping):
    """name -> an object defined in a module, imported when it is first asked for (``{"name": "pkg.mod:attr"}``)."""

    def __init__(self, where: Mapping[str, str]):
        self._where, self._loaded = dict(where), {}

    def __getitem__(self, name: str):
        if name not in self._loaded:
            self._loaded[name] = import_attribute(self._where[name])  # KeyError for an unknown name
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name) -> bool:
        return name in self._where


# The built-in tasks, by name and where each is defined: known here, imported when first used.
BUILT_IN_TASKS = LazyTable({"fashion-mnist": "speedkit.tasks.builtin.fashion_mnist:FASHION_MNIST",
                            "pydocs": "speedkit.tasks.builtin.pydocs:PYDOCS"})
# The tasks over the user's own files: functions of the folder (``--task image-folder --data DIR``).
FOLDER_TASKS = LazyTable({"image-folder": "speedkit.tasks.builtin.image_folder:image_folder_task",
                          "text-folder": "speedkit.tasks.builtin.text_folder:text_folder_task",
                          # the seed's workloads, each at cpu (rehearsal) or gpu sizes
                          "imagenet": "speedkit.tasks.builtin.imagenet:imagenet_task",
                          "gpt2": "speedkit.tasks.builtin.gpt2:gpt2_task"})
BUILT_IN = frozenset(BUILT_IN_TASKS)  # names a user's task may not take over


class TaskRegistry(MutableMapping):
    """Every task known by name: the built-in ones first (imported when first asked for), then the registered."""

    def __init__(self, built_in: LazyTable):
        self._built_in, self._registered = built_in, {}

    def __getitem__(self, name: str) -> Task:
        if name in self._registered:
            return self._registered[name]
        if name in self._built_in:
            return self._built_in[name]
        raise KeyError(name)

    def __setitem__(self, name: str, task: Task) -> None:
        if name in self._built_in:
            raise ValueError(f"task name {name!r} is built in; give your task another name")
        self._registered[name] = task

    def __delitem__(self, name: str) -> None:
        if name in self._built_in:
            raise ValueError(f"task {name!r} is built in and cannot be removed")
        del self._registered[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._built_in), **self._registered})

    def __len__(self) -> int:
        return len(set(self._built_in) | set(self._registered))

    def __contains__(self, name) -> bool:
        return name in self._registered or name in self._built_in

    def __repr__(self) -> str:
        return f"TaskRegistry({list(self)})"


TASKS = TaskRegistry(BUILT_IN_TASKS)


def register_task(task: Task, *, replace: bool = False) -> Task:
    """Make ``task`` known by its name everywhere a task name is accepted, its recipes and baselines with it
    (they are the task's own); returns it.

    A different task under a taken name is refused unless ``replace=True``; built-in names are never replaced.
    """
    if not isinstance(task, Task):
        raise TypeError(f"register_task takes a speedkit.Task, got {show(task)}")
    check_free_name("task", task.name, TASKS.get(task.name), task, BUILT_IN, replace, rename="your task")
    if task.name not in BUILT_IN:
        TASKS[task.name] = task
    return task


def did_you_mean(name, known) -> str:
    """`` (did you mean 'fashion-mnist'?)`` for a near miss among ``known``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def get_task(name: str) -> Task:
    """A registered task by name (``speedkit.tasks.resolve_task`` also takes objects, modules and folders)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}{did_you_mean(name, TASKS)}; known tasks: {sorted(TASKS)}")
    return TASKS[name]


def is_baseline(task: "Task | str | None", recipe: str) -> bool:
    """True for the recipes that speed-ups on ``task`` (a Task or a task's name) are measured against (its
    ``baselines``); for a task not known here, the recipe called ``"baseline"``. The one baseline test: the
    benchmark, the search, the run board and ``make_trainer`` all ask it."""
    if isinstance(task, str) and task in TASKS:
        task = TASKS[task]
    return recipe in task.baselines if isinstance(task, Task) else recipe == "baseline"


# -- the one recipe resolver --------------------------------------------------------------------
def get_recipe(task: Task | str | None, recipe: str | Recipe = "baseline", *, model=None) -> Recipe:
    """The recipe that ``recipe`` names, for every entry point (``make_trainer``, ``recipe_parts``, the CLI,
    the explorer, the benchmark and the search).

    ``recipe`` is a Recipe (returned as it is), the name of one of ``task``'s recipes, ``"task:name"``, a
    recipe file (``*.yaml``, ``*.yml``, ``*.json``; ``FILE:NAME`` for one of several in a file, such as a
    preset file), or, with ``task`` None, a bare preset name of the built-in task whose domain fits ``model``.
    ``task`` is a Task, a registered task's name, or None. A recipe for another task, or for another
    domain than ``model``'s, is refused, naming both.
    """
    if isinstance(recipe, Recipe):
        return recipe
    owner = TASKS[task] if isinstance(task, str) and task in TASKS else task
    if isinstance(owner, str):
        get_task(owner)  # an unknown task: the error lists the known ones
    file = recipe_file_spec(recipe)
    if file is not None:
        found = Recipe.from_file(*file)
        if owner is not None and found.task not in (None, owner.name):
            raise ValueError(f"recipe file {recipe} is for task {found.task!r}, not {owner.name!r}")
        if owner is not None and found.domain not in (None, owner.domain):
            raise ValueError(f"recipe file {recipe} is for {found.domain} tasks, but {owner.name!r} is a "
                             f"{owner.domain} task")
        if owner is not None:  # a file that leaves them out (a copy of a preset file) is for this task now
            found.task, found.domain = owner.name, owner.domain
        return _fits_model(found, str(recipe), model)
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a name such as 'mild', 'fashion-mnist:mild', a recipe file or a Recipe, "
                        f"got {recipe!r}")
    if ":" in recipe:
        task_name, name = recipe.split(":", 1)
        if task_name not in TASKS:
            raise ValueError(f"recipe {recipe!r} names task {task_name!r}, which is not registered; known tasks: "
                             f"{sorted(TASKS)}")
        named = TASKS[task_name]
        if owner is not None and named is not owner:
            raise ValueError(f"recipe {recipe!r} is task {task_name!r}'s, not {owner.name!r}'s; name one of "
                             f"{sorted(owner.recipes)}")
        return _fits_model(named.recipe(name), recipe, model)
    if owner is None:
        return _preset_named(recipe, model)
    return owner.recipe(recipe)


def _preset_named(name: str, model) -> Recipe:
    """The built-in task's preset called ``name`` whose domain is ``model``'s: a registered task's recipes are
    named ``"task:name"``, or one name (its own ``"baseline"``) would match several."""
    domain = model_domain(model) if model is not None else None
    matches = [task.recipe(name) for task in BUILT_IN_TASKS.values()
               if name in task.recipes and (domain is None or task.domain == domain)]
    if len(matches) != 1:
        known = sorted(f"{task.name}:{r}" for task in BUILT_IN_TASKS.values() for r in task.recipes)
        why = "no" if not matches else "more than one"
        raise ValueError(f"{why} {domain or ''} recipe named {name!r}; name one of {known}")
    return matches[0]


def _fits_model(recipe: Recipe, spec: str, model) -> Recipe:
    if model is not None and recipe.domain is not None and recipe.domain != model_domain(model):
        domain = model_domain(model)
        raise ValueError(f"recipe {spec!r} is for {recipe.domain} models, but {type(model).__name__} is a "
                         f"{domain} model; pick a {domain} recipe")
    return recipe


def model_domain(model) -> str:
    """"language" for models with token embeddings, else "vision"."""
    return "language" if any(isinstance(m, torch.nn.Embedding) for m in model.modules()) else "vision"
