"""Recipes: a recipe names its model, methods, optimizer, schedule, duration, precision and input pipeline;
``speedkit.tasks.make_trainer`` turns one into a Trainer, and ``speedkit.tasks.get_recipe`` finds one by name.

A recipe file is YAML (or JSON) holding one recipe per document (``---`` between them): what
``Recipe.to_yaml`` writes, what ``speedkit train --recipe FILE`` and ``speedkit tune --base FILE`` read,
and what the built-in tasks' presets are (``presets/<task>.yaml``, shipped with the package; copy one to
start your own). ``FILE:NAME`` picks one recipe of a file that holds several. A recipe held by a Task takes
its task and domain from it, so the presets leave them out; what a preset reached in the benchmark is read
from ``presets/reached.json``, which ``make readme`` writes from ``bench/results/summary.json``.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

from speedkit.core.method import DOMAINS
from speedkit.core.method import show as _show
from speedkit.core.time import Time, TimeUnit
from speedkit.train.checks import check_duration

RECIPE_FILE_SUFFIXES = (".yaml", ".yml", ".json")
PRESETS = Path(__file__).with_name("presets")  # the built-in tasks' recipe files, and what they reached


class RecipeFileNotFoundError(FileNotFoundError, ValueError):
    """A recipe file that is not there: a missing file, and a bad ``recipe`` value."""


@dataclasses.dataclass
class Recipe:
    name: str
    model: str
    duration: str
    batch_size: int
    optimizer: dict
    schedule: dict | None = None
    methods: dict = dataclasses.field(default_factory=dict)  # method name -> parameters
    precision: str = "fp32"
    loader: str = "memory"  # "memory": speedkit's in-memory batch loader; "torch": Dataset + DataLoader
    augment: dict | None = None  # {"crop_pad": 2, "flip": "random"}
    # The image sizes the recipe was published with, {"train": 176, "eval": 224, "eval_crop": 0.966} (eval_crop:
    # the share of the short side the evaluation's centre crop keeps). Only a task that decodes images at a chosen
    # size reads it (Task.reads_resolution) and may scale it to its sizes; None: the task's own sizes.
    resolution: dict | None = None
    eval_interval: str = "1ep"
    summary: str = ""
    target: dict | None = None  # {"metric", "value"} it was tuned to reach; None: the task's target
    reached: dict | None = None  # what it reached when measured (presets: presets/reached.json; speedkit tune's winner)
    loggers: list = dataclasses.field(default_factory=list)  # logger names: tensorboard, csv, mlflow, wandb
    # Whose recipe it is. None where a Task holds it (the Task says); a recipe taken from a task, or written to
    # a file, carries them, so that a file is refused for another task.
    task: str | None = None
    domain: str | None = None  # one of speedkit.core.method.DOMAINS: which models it suits
    # "task:name" of the ladder rung this recipe was rebuilt from for another task (speedkit.tasks.ladder): a
    # surgery of it that finds nothing in this task's model is left out with a warning instead of refusing the run.
    adopted_from: str | None = None

    def __post_init__(self):
        """Every field is checked now, so a bad recipe (file) fails when read, naming the field."""
        where = f"recipe {_show(self.name)}"
        for field in ("name", "task", "model", "summary", "adopted_from"):
            value = getattr(self, field)
            if value is None and field in ("task", "adopted_from"):
                continue
            if not isinstance(value, str):
                raise TypeError(f"{where}: {field} must be a string, got {type(value).__name__} {_show(value)}")
            if field != "summary" and not value.strip():
                raise ValueError(f"{where}: {field} must not be empty")
        if self.domain is not None and (not isinstance(self.domain, str) or self.domain not in DOMAINS):
            raise ValueError(f"{where}: domain must be one of {DOMAINS} (or left out), got {_show(self.domain)}")
        for field in ("duration", "eval_interval"):  # a budget cannot be a fraction of itself
            try:
                check_duration(field, getattr(self, field), optional=False, fraction_ok=field == "eval_interval")
            except (ValueError, TypeError) as e:
                raise type(e)(f"{where}: {e}") from None
        if not isinstance(self.loader, str) or self.loader not in ("memory", "torch"):
            raise ValueError(f"{where}: loader must be 'memory' or 'torch', got {_show(self.loader)}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"{where}: batch_size must be a whole number >= 1, got {_show(self.batch_size)}")
        self._check_loggers(where)
        self._check_parts(where)

    def _check_loggers(self, where: str) -> None:
        from speedkit.record.loggers import check_logger_name

        if not isinstance(self.loggers, list) or not all(isinstance(name, str) for name in self.loggers):
            raise TypeError(f"{where}: loggers must be a list of logger names such as [tensorboard, csv], "
                            f"got {_show(self.loggers)}")
        for name in self.loggers:
            try:
                check_logger_name(name)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None

    def _check_parts(self, where: str) -> None:
        """Optimizer, schedule, methods, precision and augmentation, checked by the code that will use them."""
        from speedkit.core.devices import PRECISIONS
        from speedkit.data import Augment
        from speedkit.methods import build_methods
        from speedkit.optim import get_schedule
        from speedkit.optim.factory import make_optimizer_factory

        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            raise ValueError(f"{where}: precision must be one of {PRECISIONS}, got {_show(self.precision)}")
        for field, expected in (("optimizer", "a dict with a 'name', e.g. {'name': 'sgd', 'lr': 0.1}"),
                                ("methods", "a dict {method name: {parameters}}"),
                                ("augment", "a dict such as {'crop_pad': 2, 'flip': 'random'}, or null"),
                                ("target", "a dict {'metric': 'eval/accuracy', 'value': 0.92}, or null"),
                                ("reached", "a dict, or null")):
            value = getattr(self, field)
            if not isinstance(value, dict) and not (value is None and field in ("augment", "target", "reached")):
                raise TypeError(f"{where}: {field} must be {expected}, got {type(value).__name__} {_show(value)}")
        name = self.optimizer.get("name")
        if not isinstance(name, str):
            raise TypeError(f"{where}: optimizer needs a 'name' string such as 'sgd' or 'adamw', got {_show(name)}")
        for key, value in self.optimizer.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{where}: optimizer {key} must be a finite number, got {value!r}")
        if self.target is not None and (set(self.target) != {"metric", "value"} or not isinstance(
                self.target["metric"], str) or isinstance(self.target["value"], bool)
                or not isinstance(self.target["value"], (int, float))):
            raise ValueError(f"{where}: target must be {{'metric': <name>, 'value': <number>}}, got {_show(self.target)}")
        self._check_resolution(where)
        if self.augment is not None:
            crop_pad = self.augment.get("crop_pad", 0)
            if isinstance(crop_pad, bool) or not isinstance(crop_pad, int):
                raise TypeError(f"{where}: augment.crop_pad must be a whole number >= 0, got {_show(crop_pad)}")
        checks = (("optimizer", lambda: make_optimizer_factory(self.optimizer)),
                  ("schedule", lambda: self.schedule is None or get_schedule(self.schedule)),
                  ("methods", lambda: build_methods(self.methods)),
                  ("augment", lambda: self.augment is None or Augment(**self.augment)))
        for field, check in checks:
            try:
                check()
            except (ValueError, TypeError) as e:
                raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{where}: {field}: {e}") from e

    def _check_resolution(self, where: str) -> None:
        if self.resolution is None:
            return
        example = "{'train': 176, 'eval': 224, 'eval_crop': 0.966}"
        if not isinstance(self.resolution, dict) or not set(self.resolution) <= {"train", "eval", "eval_crop"}:
            raise ValueError(f"{where}: resolution must be a dict with some of train, eval (pixels) and eval_crop "
                             f"(a share of the short side), e.g. {example}, or null; got {_show(self.resolution)}")
        for key in ("train", "eval"):
            size = self.resolution.get(key, 8)
            if isinstance(size, bool) or not isinstance(size, int) or size < 8:
                raise ValueError(f"{where}: resolution.{key} must be a whole number of pixels >= 8, got {_show(size)}")
        crop = self.resolution.get("eval_crop", 1.0)
        if isinstance(crop, bool) or not isinstance(crop, (int, float)) or not 0 < crop <= 1:
            raise ValueError(f"{where}: resolution.eval_crop is the share of the short side the evaluation's centre "
                             f"crop keeps, in (0, 1] (0.875 crops 224 px of 256), got {_show(crop)}")

    @property
    def unmeasured_rebuild(self) -> bool:
        """A ladder rung rebuilt for this task that nobody has measured on it: its speed-up is not known here."""
        return self.adopted_from is not None and self.reached is None

    def with_changes(self, **changes) -> "Recipe":
        """A copy with some fields replaced (``methods`` and ``optimizer`` dicts are merged)."""
        data = copy.deepcopy(dataclasses.asdict(self))
        for key in ("optimizer", "methods"):
            if key in changes and changes[key] is not None:
                data[key] = {**data[key], **changes.pop(key)} if key == "optimizer" else dict(changes.pop(key))
        data.update({k: v for k, v in changes.items() if v is not None})
        return Recipe(**data)

    def with_budget(self, duration: str) -> "Recipe":
        """A copy that trains for ``duration`` and evaluates as many times in it as this one does in its own
        budget: a budget cut in half with the cadence kept would leave a recipe half its evaluations, and a time
        to target is read only at an evaluation. The cadence is kept where it is a share of the run ("0.1dur")
        or the units differ."""
        interval, old, new = (Time.from_input(v) for v in (self.eval_interval, self.duration, duration))
        cadence = self.eval_interval
        if interval is not None and interval.unit == old.unit == new.unit:
            value = interval.value * new.value / old.value
            cadence = f"{value:.3g}ep" if interval.unit == TimeUnit.EPOCH else f"{max(1, round(value))}{interval.unit.value}"
        return dataclasses.replace(self, duration=duration, eval_interval=cadence)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The recipe as a file ``speedkit train --recipe file.yaml`` and ``make_trainer`` read back."""
        import yaml

        # whose it is first; an empty logger list is left out, so files of recipes without loggers read as before
        fields = {"name": self.name, "task": self.task, "domain": self.domain, **self.to_dict()}
        data = {k: v for k, v in fields.items() if v is not None and k != "reached" and v != []}
        if "betas" in data["optimizer"]:
            data["optimizer"]["betas"] = list(data["optimizer"]["betas"])
        return yaml.safe_dump(data, sort_keys=False)

    @classmethod
    def from_file(cls, path, name: str | None = None) -> "Recipe":
        """The recipe in a recipe file, or the one called ``name`` in a file that holds several."""
        recipes = read_recipe_file(path)
        if name is None and len(recipes) == 1:
            return next(iter(recipes.values()))
        if name is None:
            raise ValueError(f"recipe file {path} holds the recipes {list(recipes)}; name one as "
                             f"'{path}:{next(iter(recipes))}'")
        if name not in recipes:
            raise ValueError(f"recipe file {path} has no recipe {name!r}; it holds {list(recipes)}")
        return recipes[name]


# How often a run that is timed to a target evaluates: time to target is read at evaluations, so a run
# that evaluates every epoch is credited with the whole epoch in which it passed the target. The built-in
# benchmarks evaluate their baselines every quarter epoch, and language runs 20-odd times in their budget.
TIMING_EVAL_EPOCHS = 0.25
TIMING_EVALS_PER_BUDGET = 20


def timing_eval_interval(recipe: Recipe) -> str:
    """The evaluation cadence at which ``recipe`` (a baseline, or the base of a search) is timed to a target:
    its own where that is fine enough, else every quarter epoch for a budget in epochs, else 20 evaluations
    in its budget. A coarse cadence rounds every time to target up to its next evaluation, by up to a fifth
    of a fast recipe's time, which is enough to rank recipes in the wrong order."""
    own, budget = Time.from_input(recipe.eval_interval), Time.from_input(recipe.duration)
    if budget.unit is TimeUnit.EPOCH:
        fine = Time(TIMING_EVAL_EPOCHS, TimeUnit.EPOCH)
    elif budget.unit in (TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN):
        fine = Time(max(1, int(budget.value // TIMING_EVALS_PER_BUDGET)), budget.unit)
    else:
        return recipe.eval_interval  # a budget in wall clock: no count to divide
    if own is not None and own.unit is fine.unit and own <= fine:
        return recipe.eval_interval
    return str(fine)


FLIPPING_METHODS = ("alternating_flip", "test_time_augmentation")  # the methods that mirror images


def without_flips(recipe: Recipe) -> tuple[Recipe, list[str]]:
    """``recipe`` for images whose label a horizontal flip changes (digits, letters, text): no flip
    augmentation, no alternating flips, no mirrored test-time view (shifted views stay); and what was taken out."""
    removed, augment, methods = [], dict(recipe.augment or {}), copy.deepcopy(recipe.methods)
    if augment.get("flip"):
        removed.append(f"augment flip={augment['flip']!r}")
        augment["flip"] = None
    if "alternating_flip" in methods:
        del methods["alternating_flip"]
        removed.append("alternating_flip")
    tta = methods.get("test_time_augmentation", False)
    if tta is not False and (tta or {}).get("flip", True):
        if (tta or {}).get("shifts", 0):
            methods["test_time_augmentation"] = {**tta, "flip": False}
            removed.append("test_time_augmentation's mirrored view")
        else:  # the mirrored view was its only one
            del methods["test_time_augmentation"]
            removed.append("test_time_augmentation")
    return dataclasses.replace(recipe, augment=augment or None, methods=methods), removed


def read_recipe_file(path) -> dict[str, Recipe]:
    """Every recipe in a recipe file (YAML or JSON, one recipe per document), by name; unknown fields are an error."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise RecipeFileNotFoundError(f"recipe file {path} does not exist")
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"recipe file {path} is not valid YAML/JSON: {e}") from None
    if not documents:
        raise ValueError(f"recipe file {path} holds no recipe; a recipe has the fields {sorted(_FIELDS)}")
    recipes: dict[str, Recipe] = {}
    for number, data in enumerate(documents, start=1):
        where = f"recipe file {path}" + (f", recipe {number}" if len(documents) > 1 else "")
        recipe = _recipe_from_mapping(data, where)
        if recipe.name in recipes:
            raise ValueError(f"{where}: a second recipe named {recipe.name!r}; give each recipe its own name")
        recipes[recipe.name] = recipe
    return recipes


_FIELDS = {f.name for f in dataclasses.fields(Recipe)}
_REQUIRED = sorted(f.name for f in dataclasses.fields(Recipe)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def _recipe_from_mapping(data, where: str) -> Recipe:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a mapping of recipe fields, got {type(data).__name__}")
    unknown = sorted(map(str, set(data) - _FIELDS))
    missing = [f for f in _REQUIRED if f not in data]
    if unknown or missing:
        raise ValueError(f"{where}: unknown fields {unknown}, missing fields {missing}; "
                         f"a recipe has the fields {sorted(_FIELDS)}")
    try:
        return Recipe(**data)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}") from None


def recipe_file_spec(spec) -> tuple[str, str | None] | None:
    """``(path, name)`` where ``spec`` names a recipe file (``FILE`` or ``FILE:NAME``), else None."""
    if isinstance(spec, Path):
        return str(spec), None
    if not isinstance(spec, str):
        return None
    if spec.endswith(RECIPE_FILE_SUFFIXES):
        return spec, None
    path, _, name = spec.rpartition(":")
    if path.endswith(RECIPE_FILE_SUFFIXES) and name:
        return path, name
    return None


# -- the built-in tasks' presets ----------------------------------------------------------------
def load_presets(task: str) -> dict[str, Recipe]:
    """The presets of built-in task ``task`` (``presets/<task>.yaml``), each with what it reached in the
    committed benchmark (``presets/reached.json``) where it was measured."""
    recipes = read_recipe_file(PRESETS / f"{task}.yaml")
    for name, reached in preset_reached().get(task, {}).items():
        if name not in recipes:
            raise ValueError(f"{PRESETS / 'reached.json'} has figures for {task}:{name}, which "
                             f"{PRESETS / (task + '.yaml')} does not hold; run `make readme` to write it again")
        recipes[name].reached = reached
    return recipes


def preset_reached() -> dict[str, dict[str, dict]]:
    """What each preset reached in the committed benchmark: task -> recipe -> figures (``presets/reached.json``,
    written by ``scripts/update_readme.py`` from ``bench/results/summary.json``)."""
    return json.loads((PRESETS / "reached.json").read_text(encoding="utf-8"))


__all__ = ["PRESETS", "Recipe", "RecipeFileNotFoundError", "load_presets", "preset_reached", "read_recipe_file",
           "recipe_file_spec"]
