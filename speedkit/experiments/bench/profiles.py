"""Benchmark profiles as data: which recipes, seeds, device and budgets a time-to-accuracy run uses.

A profile changes how a recipe is *run* (device, budget, evaluation cadence, and on GPUs a larger
batch, bf16 and torch.compile); the recipes themselves stay with their task (``speedkit.tasks``). The task's baselines
(``Task.baselines``) are never changed by ``speedup_changes``: they stay what a competent
user writes by hand, and each evaluates at ``baseline_eval_interval``, by default as finely as
``timing_eval_interval`` says (free for them: a plain evaluation is excluded from the clock), while a
speed-up recipe keeps its own cadence, because the extra cost of its evaluation-time methods (test-time
augmentation, weight averaging) is counted.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from speedkit.experiments.baseline_plan import default_sweep
from speedkit.experiments.measure import refuse_planned
from speedkit.tasks import TASKS, Recipe, RunRequest, get_recipe, is_baseline
from speedkit.tasks.recipes import timing_eval_interval
from speedkit.train.checks import check_duration

# The benchmark's names for the built-in tasks (the README and summary.json use these keys); any other
# registered task (a user's) is benchmarked under its own name.
TASK_KEYS = {"vision": "fashion-mnist", "language": "pydocs"}
_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunRequest))


# RunRequest fields each run of a benchmark sets itself, and what to set instead: a value in a profile's ``run``
# would be overwritten in every run, or (methods) replace every recipe's methods, the baselines' too.
BENCH_PICKS = {
    "recipe": "name the recipes it runs, baselines among them, in recipes= (speedkit bench --recipes, --baselines)",
    "methods": "add methods to every speed-up recipe with speedup_changes={'methods': {...}}, or to one with "
               "recipe_changes={name: {'methods': {...}}}",
    "seed": "set seeds= (speedkit bench --seeds); each run has its own",
    "run_name": "leave it out: each run is named for its recipe and seed",
    "run_dir": "pass run_dir= to run_benchmark (speedkit bench --run-dir)",
    "extra_config": "leave it out: each run's config holds the benchmark's marks",
    "stop_at_target": "leave it out: a benchmark's runs train their whole budget, so that their final quality is "
                      "measured (--sweep and --find-budgets stop their own runs at the target)"}


def default_recipes(task: str) -> tuple[str, ...]:
    """Every baseline of ``task``, weakest first, then every other recipe it has."""
    spec = TASKS[task]
    return (*spec.baselines, *[r for r in spec.recipes if not is_baseline(spec, r)])


@dataclasses.dataclass(frozen=True)
class BenchProfile:
    """How one task is benchmarked. ``run`` is the RunRequest every run of the profile starts from: its task
    and the overrides each run adds (device, data and evaluation fractions, target; an ``eval_interval`` or a
    ``duration`` there is one cadence or one budget for every recipe, for smoke tests); what each run sets
    itself (``BENCH_PICKS``: its recipe, seed, name, folder) is refused there, naming the field that means it.
    The other fields are the benchmark's own; those left ``None`` keep each recipe's value."""

    name: str
    run: RunRequest
    recipes: tuple[str, ...] = ()  # baselines and speed-up recipes to run; () means default_recipes(task)
    seeds: int = 3
    baseline_eval_interval: str | None = None  # the baselines' (None: timing_eval_interval); recipes keep their own
    duration_scale: float = 1.0  # multiplies each recipe's budget
    report_targets: tuple[float, ...] = ()  # targets whose times are reported too (the task's is always)
    speedup_changes: Mapping[str, object] = dataclasses.field(default_factory=dict)  # every recipe but baseline
    recipe_changes: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)  # per recipe
    # baseline -> {"lr": values, "schedule": schedules, "budget": one}: what `--sweep` tries on that baseline
    sweeps: Mapping[str, Mapping[str, Sequence]] = dataclasses.field(default_factory=dict)
    # how finely `--find-budgets` searches a baseline's budget, in its unit (None: about a tenth of it, whole)
    budget_step: str | None = None
    budget_searched: tuple[str, ...] | None = None  # the baselines `--find-budgets` searches; None: all
    # baseline -> the budget `--find-budgets` found (or `--budgets FILE` gives), which it runs as it is: the search
    # ran at this profile's duration and duration_scale, so neither applies to it again
    found_budgets: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # every run compiles its model (torch_compile), but the recipes in `eager`: on a GPU a speed-up measured
    # between a compiled run and an uncompiled one would count the compiler as a recipe's
    compiled: bool = False
    eager: tuple[str, ...] = ()

    def __post_init__(self):
        refuse_planned(self.run, BENCH_PICKS, f"profile {self.name!r}", "run of the benchmark")
        if self.task not in TASKS:
            raise ValueError(f"profile {self.name!r}: unknown task {self.task!r}; known tasks: {sorted(TASKS)}")
        if not self.recipes:
            object.__setattr__(self, "recipes", default_recipes(self.task))
        spec = TASKS[self.task]
        if not any(is_baseline(spec, r) for r in self.recipes):
            raise ValueError(f"profile {self.name!r}: recipes {list(self.recipes)} include no baseline; "
                             f"add one of {list(spec.baselines)}")
        unknown = [r for r in (*self.recipes, *self.eager) if r not in spec.recipes]
        if unknown:
            raise ValueError(f"profile {self.name!r}: unknown recipes {unknown} for {self.task}; "
                             f"known: {sorted(spec.recipes)}")
        if self.seeds < 1:
            raise ValueError(f"profile {self.name!r}: seeds must be >= 1, got {self.seeds}")
        if not self.duration_scale > 0:
            raise ValueError(f"profile {self.name!r}: duration_scale must be positive, got {self.duration_scale}")
        check_duration("budget_step", self.budget_step, optional=True, fraction_ok=False)

    def replace(self, **changes) -> "BenchProfile":
        """A copy with some fields changed: a RunRequest field goes to ``run`` (checked there, naming it)."""
        run = {k: changes.pop(k) for k in list(changes) if k in _RUN_FIELDS}
        return dataclasses.replace(self, run=self.run.replace(**run) if run else self.run, **changes)

    @property
    def task(self) -> str:
        return self.run.task

    @property
    def baselines(self) -> tuple[str, ...]:
        """The baselines this profile runs, weakest first."""
        return tuple(r for r in TASKS[self.task].baselines if r in self.recipes)

    @property
    def target_value(self) -> float:
        return TASKS[self.task].target_value if self.run.target is None else self.run.target

    @property
    def targets(self) -> tuple[float, ...]:
        """Every target reported, the headline one included, in increasing order."""
        return tuple(sorted({*self.report_targets, self.target_value}))

    def recipe(self, name: str) -> Recipe:
        """The recipe as this profile runs it: profile-wide changes, then per-recipe ones.

        ``methods`` in a change are *added* to the recipe's methods (e.g. torch_compile on a GPU).
        """
        recipe = get_recipe(self.task, name)
        baseline = is_baseline(self.task, name)
        if self.run.eval_interval or not baseline:
            cadence = {"eval_interval": self.run.eval_interval}
        else:
            cadence = {"eval_interval": self.baseline_eval_interval or timing_eval_interval(recipe)}
        changes = [cadence] if baseline else [self.speedup_changes, cadence]
        for change in [*changes, self.recipe_changes.get(name, {})]:
            change = dict(change)
            if "methods" in change:
                change["methods"] = {**recipe.methods, **change["methods"]}
            recipe = recipe.with_changes(**change)
        if self.compiled and name not in self.eager and "torch_compile" not in recipe.methods:
            recipe = recipe.with_changes(methods={**recipe.methods, "torch_compile": {}})
        return recipe


# The language baseline's sweep: AdamW's learning rate around nanoGPT's 1e-3, with two schedules, at the
# baseline's budget (the tuned recipe carries the shorter budget `--find-budgets` found afterwards).
_DECAYS = ({"name": "cosine", "warmup": "0.05dur"}, {"name": "linear_to_zero", "warmup": "0.05dur"})
_LANGUAGE_SWEEP = {"lr": (1e-3, 2e-3, 4e-3), "schedule": _DECAYS, "budget": "600ba"}

PROFILES: dict[str, dict[str, BenchProfile]] = {
    "vision": {
        "cpu": BenchProfile(name="cpu", run=RunRequest(task="fashion-mnist", device="cpu"), report_targets=(0.90, 0.93)),
        "gpu": BenchProfile(name="gpu", run=RunRequest(task="fashion-mnist", device="cuda"), report_targets=(0.90, 0.93),
                            # twice the batch, twice the learning rate (linear scaling from the CPU recipes)
                            speedup_changes={"batch_size": 512, "precision": "bf16", "optimizer": {"lr": 0.4}},
                            # and 1.4 times the epochs: hot's 2.5 at that batch missed 0.92 in two seeds of three on
                            # an H200, its 3.5 held it in every held-out seed, as mild's 7 and medium's 4.2 did
                            # (bench/results/2026-12-07-gpu-profile-budgets/)
                            recipe_changes={"mild": {"duration": "7ep"}, "medium": {"duration": "4.2ep"},
                                            "hot": {"duration": "3.5ep"}},
                            compiled=True, eager=("baseline",)),  # the tutorial's per-image fp32 loop, as written
    },
    "language": {
        # The target is what the baseline reaches at about batch 470 of its 600, measured before the benchmark
        # was run, so the baseline reaches it with room to spare (bench/results/2026-12-03-design-notes/).
        "cpu": BenchProfile(name="cpu", run=RunRequest(task="pydocs", device="cpu", eval_interval="25ba",
                                                       eval_fraction=0.25, target=3.30),
                            report_targets=(3.5,), sweeps={"tuned": _LANGUAGE_SWEEP},
                            budget_step="50ba", budget_searched=("tuned",)),  # the baseline stays as it is
        # The baselines in bf16 autocast as well: on a GPU an fp32 GPT runs its matmuls far from the tensor cores'
        # rate, and nanoGPT's script, the baseline a skeptic would name, trains in bf16 by default where it can.
        # The target is the cpu profile's, on the same quarter of the evaluation set it was measured on: on the
        # whole set the same `tuned` run ends about 0.1 bpb higher, and so missed 3.30 in the first GPU run.
        "gpu": BenchProfile(name="gpu", run=RunRequest(task="pydocs", device="cuda", eval_interval="25ba",
                                                       eval_fraction=0.25, target=3.30),
                            speedup_changes={"batch_size": 128, "precision": "bf16"},
                            recipe_changes={name: {"precision": "bf16"} for name in ("baseline", "tuned")},
                            compiled=True),
    },
}


def with_default_sweeps(profile: BenchProfile) -> BenchProfile:
    """``profile`` itself where it sweeps a baseline; else with the default sweep of each of its baselines
    (``baseline_plan.default_sweep``: the grid tune's baseline plan tries too), at the baseline's own budget.
    Where the sweep keeps the rate and schedule, the tuned baseline is the one shipped."""
    if profile.sweeps:
        return profile
    return dataclasses.replace(profile, sweeps={name: default_sweep(get_recipe(profile.task, name))
                                                for name in profile.baselines})


def task_key(task: str) -> str:
    """``"vision"``/``"language"`` for a built-in task's key or name; a user's registered task's own name."""
    if task in TASK_KEYS or task in TASKS:
        return {name: key for key, name in TASK_KEYS.items()}.get(task, task)
    known = sorted([*TASK_KEYS, *TASK_KEYS.values(), *(set(TASKS) - set(TASK_KEYS.values()))])
    raise ValueError(f"unknown benchmark task {task!r}; known: {known} (a task of your own: register it with "
                     f"speedkit.tasks.register_task, or pass it as a Task or 'package.module:attr')")


def default_profiles(task: str) -> dict[str, BenchProfile]:
    """The profiles of a task that has none of its own (a user's): every recipe it has against its
    baselines, at each recipe's own budget and cadence, to the task's own target."""
    return {"cpu": BenchProfile(name="cpu", run=RunRequest(task=task, device="cpu")),
            "gpu": BenchProfile(name="gpu", run=RunRequest(task=task, device="cuda"), compiled=True)}


def get_profile(task: str, profile: str | BenchProfile = "cpu") -> BenchProfile:
    """The named profile of a task (``"vision"``, ``"language"``, their task names, or a registered task's)."""
    if isinstance(profile, BenchProfile):
        return profile
    key = task_key(task)
    profiles = PROFILES[key] if key in PROFILES else default_profiles(key)
    if profile not in profiles:
        raise ValueError(f"unknown benchmark profile {profile!r} for {task}; known: {sorted(profiles)}")
    return profiles[profile]
