"""The search: what it is asked (``TuneSettings``) and its configuration (``TuneConfig``, shared by every worker
process), the Optuna studies, the objective, and the phases (tune the baseline, then search) each worker runs until
they close. Two studies share one storage: ``<name>-baseline``, which keeps the runs of the baseline plan
(``speedkit.experiments.baseline_plan``, as the benchmark tunes a baseline), and ``<name>`` (the search), where
Optuna proposes and ranks on the search's seed; and the confirmation on fresh seeds is measured runs in the run folder
(``confirm.py``). What it proposes in what order, and why, is in docs/guide.md ("Tune: search for the fastest recipe").
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from speedkit.core.seeding import process_seed
from speedkit.core.time import scaled_duration
from speedkit.data.identity import data_identity
from speedkit.experiments.baseline_plan import BaselinePlan, Outcome, Point, answer, next_run
from speedkit.experiments.measure import budget_scale, refuse_planned
from speedkit.experiments.tune.objective import TrialContext, resolve_runner, score_record, train_and_store
from speedkit.experiments.tune.space import SearchSpace, TuneInputError, describe_change, recipe_params, suggest_recipe
from speedkit.experiments.tune.storage import (START_LOCK, FolderLock, finished_trials, open_storage, optuna_module,
                                               read_plan, requeue, started_trials, worker_id)

PHASES = ("baseline", "search")
BASE_START = "baseline"  # start_from of the base recipe's own trial in the baseline study
SEARCH_SEED = 0  # every trial's seed; the confirmation's are fresh (1, 2, 3)
REPEAT_SEED = 100  # the seed a would-be best recipe runs again on before moves start from it
PRUNERS = ("halving", "hyperband", "median", "none")
RUN_FIELDS = ("device", "data_fraction", "eval_fraction", "eval_interval")  # the RunRequest fields every run shares


def parse_budget(budget: str | float | int, name: str = "budget") -> float:
    """Seconds from a wall-clock time (``"30m"``, ``"90s"``, ``"1.5h"``, read by ``speedkit.core.Time``) or a
    number of seconds."""
    from speedkit.core.time import Time, TimeUnit

    try:
        seconds = None if isinstance(budget, bool) else float(budget)
    except (TypeError, ValueError):  # not a number of seconds: a time such as "30m"
        try:
            time_ = Time.from_string(budget)
            seconds = time_.value if time_.unit is TimeUnit.SECOND else None
        except (TypeError, ValueError):
            seconds = None
    if seconds is None:
        raise TuneInputError(f"{name} must be a wall-clock time such as '30m', '90s' or '1h', got {budget!r}")
    if not seconds > 0:
        raise TuneInputError(f"{name} must be longer than zero, got {budget!r}")
    return seconds


def resolve_target(task_spec, target) -> tuple[str, float]:
    """(metric, value) from None (the task's), a number (the task's metric), ``"metric=value"`` or a pair."""
    if target is None:
        return task_spec.target_metric, float(task_spec.target_value)
    if isinstance(target, (int, float)) and not isinstance(target, bool):
        return task_spec.target_metric, float(target)
    if isinstance(target, str):
        metric, sep, value = target.partition("=")
        if not sep:
            try:
                return task_spec.target_metric, float(target)
            except ValueError:
                raise TuneInputError(f"target must be a number or 'metric=value' such as "
                                     f"'{task_spec.target_metric}=0.9', got {target!r}") from None
        target = (metric.strip(), value)
    if isinstance(target, (tuple, list)) and len(target) == 2:
        try:
            return str(target[0]), float(target[1])
        except ValueError:
            raise TuneInputError(f"target value must be a number, got {target[1]!r}") from None
    raise TuneInputError(f"target must be a number, 'metric=value' or (metric, value), got {target!r}")


def logged_metrics(task: str, base, device: str, data_fraction: float, eval_fraction) -> list[str]:
    """The metric names the task's evaluators log (what a target may name)."""
    import tempfile

    from speedkit.tasks import make_trainer

    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(task, base, device=device, data_fraction=data_fraction, eval_fraction=eval_fraction,
                               run_dir=run_dir, save_checkpoints=False)
        return [f"{'eval' if ev.label == 'eval' else 'eval/' + ev.label}/{name}"
                for ev in trainer.state.evaluators for name in ev.metrics]


# The RunRequest fields a search takes as keywords of TuneSettings too (the CLI's, the panel's and the notebooks'
# flat arguments); they build its ``run``, and are kept nowhere else.
RUN_KEYWORDS = ("task", "data", "task_options", "device", "data_fraction", "eval_fraction", "eval_interval", "run_dir")


# RunRequest fields every trial sets itself, and the TuneSettings field that says what the user meant instead: a
# value in ``run`` would be overwritten in each trial, or (duration, methods) override what the search draws.
SEARCH_PICKS = {"methods": "name the methods it may turn on in searched_methods=",
                "recipe": "name the recipe it starts from in base=",
                "duration": "set the range of budgets it draws in duration_scale_range=",
                "seed": "set seeds_to_confirm=; each trial draws its own seed",
                "target": "pass target=", "stop_at_target": "pass target=",
                "run_name": "set study_name= and out_dir=", "extra_config": "leave it out"}


@dataclasses.dataclass(frozen=True, init=False)
class TuneSettings:
    """What a search is asked to do: ``tune(TuneSettings(task=..., budget="30m", ...))``; the CLI, the explorer's
    Tune panel and the notebooks build one. ``run`` is the RunRequest every run of the search starts from (its
    task, data and task options, device, data and evaluation fractions, evaluation cadence, run folder), as a bench
    profile's ``run`` is; those fields may also be given as keywords (``TuneSettings("fashion-mnist",
    device="cpu")``), which build ``run`` and are checked there, naming the field. The rest is the search's own.

    ``run.task``: anything ``speedkit.tasks.resolve_task`` takes; worker processes (``n_workers``) build it again
    from its name, ``"pkg.mod:attr"`` or folder, so a Task object made in this process only they cannot.
    ``target``: None (the task's), a value of the task's metric, ``"metric=value"`` or (metric, value).
    ``budget``: wall clock for the whole search (``"30m"``, ``"1h"`` or seconds); ``trial_limit``: of one
    trial's training (default a fifth of the budget). ``base``: the recipe the search tunes and starts from
    (default the task's strongest baseline, the last of its ``baselines``). ``searched_methods``: those the
    search may turn on (default: all that fit); ``run.methods``, which would replace
    a recipe's methods, is refused: the search picks them. ``storage``: a journal file (default
    ``out_dir/study.journal``), a ``*.db`` file or a database URL; a rerun with the same ``storage`` and
    ``study_name`` continues the search. ``runner``: ``(TrialContext) -> RunRecord`` or ``"module:function"``
    replacing the real training (tests plant known answers this way). ``run.run_dir``: the runs' RunRecords
    (default ``out_dir/runs``).
    """

    run: Any  # speedkit.tasks.RunRequest
    target: Any = None
    budget: str | float = "30m"
    searched_methods: Sequence[str] | str | None = None
    base: Any = None
    storage: str | os.PathLike | None = None
    study_name: str = "tune"
    seeds_to_confirm: int = 3
    out_dir: str | os.PathLike = "runs/tune"
    n_workers: int = 1
    tune_hparams: bool = True
    trial_limit: str | float | None = None
    baseline_share: float = 0.15
    max_trials: int | None = None
    max_baseline_trials: int | None = None
    pruner: str = "halving"
    sampler_seed: int = 0
    # the range a trial's duration_scale (its budget over the base's, as a bench profile's) is drawn from
    duration_scale_range: tuple[float, float] = (0.1, 1.0)
    lr_factor: float = 10.0
    leave_one_out: bool = False
    runner: Any = None

    def __init__(self, task: Any = None, *, run=None, **settings):
        from speedkit.tasks import RunRequest

        run_fields = {name: settings.pop(name) for name in RUN_KEYWORDS if name in settings}
        if task is not None:
            run_fields["task"] = task
        if isinstance(run, dict):  # as tune_config.json stores it
            run = RunRequest(**run)
        run = RunRequest(**run_fields) if run is None else run.replace(**run_fields) if run_fields else run
        if not isinstance(run, RunRequest):
            raise TypeError(f"run must be a speedkit.tasks.RunRequest, got {type(run).__name__}")
        refuse_planned(run, SEARCH_PICKS, "TuneSettings", "trial of the search")
        if "methods" in settings:  # RunRequest.methods replaces a recipe's methods: another meaning
            raise TypeError("TuneSettings: the methods the search may turn on are searched_methods=, not methods=")
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"TuneSettings got unknown settings {unknown}; it takes {', '.join(RUN_KEYWORDS)} (which "
                            f"build run) and {', '.join(f.name for f in dataclasses.fields(self))}")
        object.__setattr__(self, "run", run)
        for field in dataclasses.fields(self)[1:]:
            object.__setattr__(self, field.name, settings.get(field.name, field.default))

    def replace(self, **changes) -> "TuneSettings":
        """A copy with some settings changed: a RunRequest field goes to ``run`` (checked there, naming it)."""
        run = {name: changes.pop(name) for name in list(changes) if name in RUN_KEYWORDS}
        kept = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return TuneSettings(**{**kept, "run": self.run.replace(**run) if run else self.run, **changes})


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """One search as every worker reads it (``tune_config.json`` in the output folder): the ``TuneSettings`` it
    was asked for, made concrete by ``build_config`` (the task by its name, folders and storage resolved, the
    runner as ``"module:function"``, the evaluation cadence fixed), and what the search derived from them. Not
    a second description of the search: a frozen view of the one ``TuneSettings``, built by ``build_config``
    alone, that nothing changes afterwards (every worker must read the same search)."""

    settings: TuneSettings
    metric: str
    target: float
    base: dict  # the base recipe as every run of the search trains it (Recipe.to_dict)
    spaces: dict  # phase -> SearchSpace.to_dict
    budget_s: float
    limit_s: float  # per-trial training limit, and the penalty's reference
    started_at: float  # time.time() when this tune call started
    spent_before_s: float  # search time used by earlier calls on the same studies
    left_out: dict = dataclasses.field(default_factory=dict)  # method -> why the search does not try it
    # How a worker process builds the task again: {"task": name or "pkg.mod:attr", "data": folder, "options": {}}
    task_source: dict | None = None
    move_prior: dict = dataclasses.field(default_factory=dict)  # method -> reference leave-one-out slowdown

    def rebuild_task(self) -> None:
        """Make the search's task known in this process (a worker's), as the first process built it."""
        from speedkit.tasks import TASKS, resolve_task

        task = self.settings.run.task
        if self.task_source is None:
            if task not in TASKS:
                raise TuneInputError(f"task {task!r} is not known in this worker process; give it as "
                                     f"'package.module:attr' or as a folder task with data=")
            return
        source = self.task_source
        spec = resolve_task(source["task"], source.get("data"), **(source.get("options") or {}))
        if spec.name != task:
            raise TuneInputError(f"the worker built task {spec.name!r} from {source}, but the search is on {task!r}")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1, default=str))

    @classmethod
    def load(cls, path) -> "TuneConfig":
        data = json.loads(Path(path).read_text())
        try:
            settings = data.pop("settings")
            settings = TuneSettings(**{**settings, "duration_scale_range": tuple(settings["duration_scale_range"])})
            return cls(settings=settings, **data)
        except (KeyError, TypeError) as e:
            raise TuneInputError(f"{path} is not a search config this speedkit writes ({e}); run the same `speedkit "
                                 f"tune` command again, which writes it anew and continues the study") from None

    def study(self, phase: str) -> str:
        return self.settings.study_name if phase == "search" else f"{self.settings.study_name}-{phase}"

    def run_settings(self) -> dict:
        """The RunRequest fields every run of the search shares, as summary.json records them."""
        return {name: getattr(self.settings.run, name) for name in RUN_FIELDS}

    def trial_run(self, recipe, seed: int, run_name: str, phase: str, trial=None):
        """One run of the search: ``settings.run`` with the trial's recipe, seed and name. The task goes by its
        name alone (``rebuild_task`` made it known in this process from its data and options)."""
        return self.settings.run.replace(
            data=None, task_options=None, recipe=recipe, seed=seed, run_name=run_name,
            extra_config={"seed": seed, "tune": {"study": self.settings.study_name, "phase": phase,
                                                 "trial": trial.number if trial else None, "target": self.target}})

    def max_trials(self) -> dict:
        """phase -> most trials it starts (None: until the time is used)."""
        return {"baseline": self.settings.max_baseline_trials, "search": self.settings.max_trials}

    def base_recipe(self):
        from speedkit.tasks.recipes import Recipe

        return Recipe(**self.base)

    def space(self, phase: str) -> SearchSpace:
        data = dict(self.spaces[phase])
        return SearchSpace(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def spent_s(self) -> float:
        return self.spent_before_s + (time.time() - self.started_at)


def load_study(config: TuneConfig, phase: str, worker_index: int = 0, storage=None):
    """The phase's study (created on first use), with this worker's sampler and the search's pruner."""
    optuna = optuna_module()
    with warnings.catch_warnings():  # `group` (conditional spaces: a method's settings only when it is on) is experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # worker 0 keeps sampler_seed (a one-process search samples as it always did); numpy's RandomState takes 32 bits
        seed = process_seed(config.settings.sampler_seed, worker_index, bits=32)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5,
                                             multivariate=True, group=True, constant_liar=config.settings.n_workers > 1)
    return optuna.create_study(study_name=config.study(phase), storage=storage or open_storage(config.settings.storage),
                               direction="minimize", sampler=sampler, pruner=make_pruner(config, phase),
                               load_if_exists=True)


PRUNER_STARTUP_TRIALS = 6  # finished trials a study needs before any trial is pruned


def make_pruner(config: TuneConfig, phase: str = "search"):
    """Successive halving (default) or Hyperband over training milliseconds, the trials' resource; any of
    them only once the study has a few finished trials and one that reached the target."""
    optuna = optuna_module()
    limit_ms, pruner = max(3, int(config.limit_s * 1000)), config.settings.pruner
    if pruner == "none" or phase == "baseline":  # the baseline plan decides from each run's outcome: none is cut
        return optuna.pruners.NopPruner()
    if pruner == "halving":
        inner = optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, limit_ms // 9), reduction_factor=3)
    elif pruner == "hyperband":
        inner = optuna.pruners.HyperbandPruner(min_resource=max(1, limit_ms // 27), max_resource=limit_ms,
                                               reduction_factor=3)
    elif pruner == "median":
        inner = optuna.pruners.MedianPruner(n_startup_trials=0)
    else:
        raise TuneInputError(f"pruner must be one of {', '.join(PRUNERS)}, got {pruner!r}")
    return _after_startup(optuna, inner)


def _after_startup(optuna, inner):
    """``inner``, consulted only once PRUNER_STARTUP_TRIALS trials finished and one reached the target.

    Successive halving promotes only the best of a rung's first trials, so in a small search the second
    trial is pruned whenever the first was ahead at that moment; and for time to target, being ahead early
    says little (a short schedule leads early and then stalls below the target) until some trial has shown
    where the target lies.
    """
    class AfterStartup(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            done = finished_trials(study)
            if len(done) < PRUNER_STARTUP_TRIALS or best_reached_s(study) is None:
                return False
            return inner.prune(study, trial)

    return AfterStartup()


def best_reached_s(study) -> float | None:
    times = [t.user_attrs.get("time_to_target_s") for t in finished_trials(study, ("COMPLETE",))]
    times = [t for t in times if t is not None]
    return min(times) if times else None


class SearchStopped(Exception):
    """The search was asked to stop mid-trial; that trial is failed and queued to run again on resume."""


def make_objective(config: TuneConfig, phase: str, runner, should_stop=None, studies: dict | None = None):
    """The Optuna objective of one phase: propose a recipe, train it (or refuse it untrained), score it."""
    optuna = optuna_module()
    base, space = config.base_recipe(), config.space(phase)
    refusals = studies["search"] if studies is not None and phase != "baseline" else None  # one list for both

    def objective(trial):
        trial.set_user_attr("worker", worker_id())
        name = f"{config.settings.study_name}-{phase}-t{trial.number:04d}"
        refused_in = refusals or trial.study
        refused = refused_methods(refused_in)
        try:
            recipe = suggest_recipe(trial, base, space, name=name, refused=refused)
        except (ValueError, TypeError) as e:
            _infeasible(trial, f"recipe refused: {e}")
        blocked = next((m for m in recipe.methods if m in refused), None)  # a queued point made before the refusal
        if blocked:
            _infeasible(trial, f"{blocked} found nothing to act on in an earlier trial: {refused[blocked]}")
        trial.set_user_attr("recipe", recipe.to_dict())
        trial.set_user_attr("change", describe_change(recipe, base))
        # the first trial runs whole (there is nothing to confirm without one); later ones leave the reserve be
        later = studies is not None and phase != "baseline" and finished_trials(studies[phase])
        kept_back = confirm_reserve_s(config, studies) if later else 0.0
        context = trial_context(config, phase, recipe, seed=trial.user_attrs.get("seed", SEARCH_SEED), run_name=name,
                                trial=trial, kept_back_s=kept_back)
        context.should_stop = should_stop
        return _run_and_score(config, trial, context, runner, refused_in)

    def _infeasible(trial, reason: str):
        trial.set_user_attr("infeasible", reason)
        raise optuna.TrialPruned(reason)  # pruned at once, untrained: the sampler learns to avoid it

    objective.infeasible = _infeasible
    return objective


def trial_context(config: TuneConfig, phase: str, recipe, seed: int, run_name: str, trial=None,
                  kept_back_s: float = 0.0) -> TrialContext:
    """One run's context; a search trial stops where it would eat into the time ``kept_back_s`` for the
    confirmation (or, for one that reached nothing, at the search's end)."""
    remaining = max(1.0, config.budget_s - config.spent_s() - kept_back_s)
    stop_after = min(config.limit_s, remaining)
    best = best_reached_s(trial.study) if trial is not None else None
    if best is not None:
        stop_after = min(stop_after, 1.5 * best)  # past 1.5x the best time a run can be neither winner nor runner-up
    return TrialContext(run=config.trial_run(recipe, seed, run_name, phase, trial), metric=config.metric,
                        target=config.target, limit_s=config.limit_s, stop_after_s=stop_after, trial=trial)


def _run_and_score(config: TuneConfig, trial, context: TrialContext, runner, refusals=None) -> float:
    """Train the trial's run and score it. ``refusals``: the study that keeps the methods found inapplicable."""
    optuna = optuna_module()
    from speedkit.core.method import NothingToChangeError

    try:
        record = train_and_store(trial, context, runner)
    except KeyboardInterrupt:  # Ctrl-C: this trial runs again when the search continues
        requeue(trial.study, trial)
        raise
    except NothingToChangeError as e:
        _mark_inapplicable(refusals or trial.study, context.run.recipe.methods, str(e))
        trial.set_user_attr("infeasible", f"NothingToChangeError: {e}")
        raise optuna.TrialPruned(str(e)) from None
    except Exception as e:  # a combination the code refused, or one that broke: recorded, and the search goes on
        trial.set_user_attr("infeasible", f"{type(e).__name__}: {e}")
        raise optuna.TrialPruned(f"{type(e).__name__}: {e}") from None
    if record is None:
        requeue(trial.study, trial)
        raise SearchStopped(f"trial {trial.number} stopped before it finished; it will run again on resume")
    if context.stop_reason == "pruned":
        raise optuna.TrialPruned(f"pruned at {record.timings.get('train_s', 0):.1f}s of training")
    return score_record(record, config.metric, context.target, context.limit_s)


# A run that reached its target after this share of its budget reached it near its own final: on another seed it
# may miss, and then it trains to the end (one that reached it at a third of its budget has room to spare)
NEAR_FINAL = 2 / 3


def confirm_wall_s(trial, fallback: float, baseline: bool = True) -> float:
    """What a confirmation run of this trial's recipe may take: the trial's own wall time (``fallback`` where it
    has none), and for a baseline's, its whole budget where it reached the target near its end. The target a user
    sets is often what the baseline reaches at the end, so on a seed where it misses, it trains its whole budget:
    the confirmation's reserve must hold that, not the seed-0 run that stopped at the target."""
    wall = trial.user_attrs.get("wall_s") or fallback
    done = trial.user_attrs.get("budget_done")
    reached = trial.user_attrs.get("time_to_target_s") is not None
    return wall / done if baseline and reached and done and NEAR_FINAL <= done < 1 else wall


def _mark_inapplicable(study, methods: dict, message: str) -> None:
    """Remember a method that found nothing to change in this model, so that it is never proposed again (its
    settings' ranges were narrowed to what acts on the model before the search, ``fit_hparams_to_model``,
    so a refusal is the model's doing, not the settings')."""
    culprit = next((m for m in methods if message.startswith(m)), None)
    if culprit is not None:
        study.set_user_attr(f"inapplicable:{culprit}", message)


def refused_methods(study) -> dict[str, str]:
    """{method: why} for the methods that found nothing to act on in an earlier trial of ``study``."""
    return {key.split(":", 1)[1]: why for key, why in study.user_attrs.items() if key.startswith("inapplicable:")}


def confirm_reserve_s(config: TuneConfig, studies: dict) -> float:
    """Time kept back for confirmation: the baselines' trial times over their whole budget and the likely
    winner's measured trial time, times the seeds (as many of those asked for as fit in half the budget, at
    least one: where a baseline run is long, a search of one trial confirmed on three seeds would find nothing)."""
    typical = [t.user_attrs.get("wall_s") for s in studies.values()
               for t in finished_trials(s, ("COMPLETE",))]
    typical = [t for t in typical if t]
    fallback = statistics.median(typical) if typical else config.limit_s
    # the runner-up is confirmed only where time is left
    walls = [confirm_wall_s(t, fallback) for t in confirmed_baselines(config, studies["baseline"])] or [fallback]
    best = ranked(studies["search"])[:1] if "search" in studies else []  # the likely winner
    best_wall = confirm_wall_s(best[0], fallback, baseline=False) if best else fallback
    walls += [best_wall] if "search" in studies else []
    reserve = seeds_that_fit(config, sum(walls), config.budget_s / 2) * sum(walls)
    if config.settings.leave_one_out and best:  # one run per method of the likely winner
        reserve += len(best[0].user_attrs.get("recipe", {}).get("methods", {})) * best_wall
    return reserve


def seeds_that_fit(config: TuneConfig, per_seed_s: float, within_s: float) -> int:
    """How many of the confirmation seeds asked for fit in ``within_s`` at ``per_seed_s`` each (at least one)."""
    return max(1, min(config.settings.seeds_to_confirm, int(within_s // max(per_seed_s, 1e-9))))


def phase_open(config: TuneConfig, phase: str, studies: dict) -> bool:
    """Whether a worker may start another trial in ``phase`` now."""
    finished = len(finished_trials(studies[phase]))
    most = config.max_trials()[phase]
    if most is not None and started_trials(studies[phase]) >= most:
        return False  # running trials count: another process's will finish
    if finished == 0:
        return True  # at least one measured trial per phase, or there is nothing to confirm
    spent = config.spent_s()
    if phase == "baseline":
        return spent < config.settings.baseline_share * config.budget_s
    return spent + confirm_reserve_s(config, studies) < config.budget_s


def run_phases(config: TuneConfig, worker_index: int = 0, runner=None, on_trial=None, should_stop=None) -> None:
    """Work on the baseline study, then the search study, until each phase closes (all workers run this)."""
    storage = open_storage(config.settings.storage)
    runner = runner or resolve_runner(config.settings.runner)
    studies = {phase: load_study(config, phase, worker_index, storage) for phase in PHASES}
    for phase in PHASES:
        objective = make_objective(config, phase, runner, should_stop, studies)
        callbacks = [on_trial] if on_trial is not None else []
        while phase_open(config, phase, studies) and not (should_stop and should_stop()):
            gate = FolderLock(config.settings.out_dir, START_LOCK)  # one process at a time starts a trial (storage.py)
            gate.acquire()
            try:
                if not phase_open(config, phase, studies) or answer_decided(config, studies["search"]):
                    break
                if phase == "baseline" and not queue_baseline_run(config, studies["baseline"]):
                    break
                if phase == "search":  # its starting points, once
                    _seed_once(studies["search"], starting_recipes(config, studies["baseline"]), config, "search")
                if phase != "baseline":
                    queue_next_move(config, studies, worker_index, phase)
                studies[phase].optimize(gate.releasing(objective), n_trials=1, callbacks=callbacks,
                                        gc_after_trial=False)
            except SearchStopped:
                return
            finally:
                gate.release()


def search_limits(config: TuneConfig) -> str:
    """The limits a search ran to (its budget, its trial counts): a rerun with other limits searches on."""
    return json.dumps({"budget_s": config.budget_s, "max_trials": config.max_trials()}, sort_keys=True)


def answer_decided(config: TuneConfig, search_study) -> bool:
    """Whether a process has closed the search at these limits to confirm its winner: then no process starts
    another search trial, so every process confirms and reports the same one (a rerun with a longer
    ``budget`` or more trials searches on)."""
    return read_plan(search_study).get("closed_for") == search_limits(config)


def queue_next_move(config: TuneConfig, studies: dict, worker_index: int = 0, phase: str = "search") -> None:
    """Queue a move from the best recipe of ``phase`` so far (``speedkit.experiments.tune.moves``), unless a
    point is queued already; with no move left, the next trial is the sampler's."""
    import random

    from speedkit.experiments.tune.moves import propose_move, recipe_key

    study = studies[phase]
    trials = study.get_trials(deepcopy=False)
    if any(t.state.name == "WAITING" for t in trials):
        return
    base, space = config.base_recipe(), config.space("search")
    leaders = [s for s in standings(study) if s.first.user_attrs.get("start_from") != BASE_START]
    if phase == "search" and leaders and leaders[0].needs_repeat(trials):
        # the leader again, on REPEAT_SEED: a lead on one seed is often that seed's luck (which evaluation first
        # passes the target moves with it), and every move after it would start from that luck
        first = leaders[0].first
        study.enqueue_trial(first.params, user_attrs={"repeat_of": first.number, "seed": REPEAT_SEED})
        return
    best = [s.first for s in leaders[:1]]
    from_phase = bool(best)
    best = best or confirmed_baselines(config, studies["baseline"])[:1]
    incumbent = recipe_from_trial(best[0], "incumbent") if best else base
    reached = bool(best) and best[0].user_attrs.get("time_to_target_s") is not None
    tried = {recipe_key(recipe_from_trial(t, "tried")) for t in trials if t.user_attrs.get("recipe")}
    tried |= {t.user_attrs["proposed"] for t in trials if t.user_attrs.get("proposed")}
    rng = random.Random(f"{config.settings.sampler_seed}:{len(trials)}:{worker_index}")  # a rerun proposes the same
    added = {m for t in trials for m in (t.user_attrs.get("recipe") or {}).get("methods", {})}
    move = propose_move(incumbent, reached, base, space, refused_methods(studies["search"]), tried, rng, added,
                        config.move_prior)
    if move is None:
        return
    origin = f"#{best[0].number}" if from_phase else "the tuned baseline"
    study.enqueue_trial(recipe_params(move.recipe, base, space),
                        user_attrs={"move": f"{move.what} (from {origin})", "proposed": recipe_key(move.recipe)})


def baseline_plan(config: TuneConfig) -> BaselinePlan:
    """How the search tunes its baseline (``speedkit.experiments.baseline_plan``, as ``speedkit bench --sweep
    --find-budgets`` does): the base's learning rate as given, halved and doubled (and on past the edge that wins,
    within ``lr_factor``), on the search's seed at the base's budget; then the pick's budget in steps of
    the least ``duration_scale_range`` allows, on that seed. All of it within ``baseline_share`` of the budget."""
    base, settings = config.base_recipe(), config.settings
    lr, factor = base.optimizer["lr"], settings.lr_factor or 1.0
    rates = (lr, lr / 2, lr * 2) if factor >= 2 else (lr,)
    scales = settings.duration_scale_range  # None: the budget is not searched
    step = scaled_duration(base.duration, scales[0]) if scales else None
    most = max(1, int(scales[1] / scales[0] + 1e-9)) if scales else None
    return BaselinePlan(metric=config.metric, rates=rates, schedules=(base.schedule,),
                        sweep_budget=scaled_duration(step, most) if step else base.duration, sweep_seed=SEARCH_SEED,
                        budget_step=step, seeds=(SEARCH_SEED,), start_steps=most, most_steps=most,
                        lr_range=(lr / factor, lr * factor))


def baseline_runs(config: TuneConfig, plan: BaselinePlan, study, states=("COMPLETE", "PRUNED")) -> list[tuple]:
    """[(trial, Outcome)]: the baseline study's trials in ``states`` as runs of the plan."""
    low = (config.settings.duration_scale_range or (1.0,))[0]
    runs = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state.name in states:
            scale = trial.params.get("duration_scale")
            budget = plan.budget(round(scale / low)) if scale is not None and plan.budget_step else plan.sweep_budget
            point = Point(trial.params.get("lr", plan.rates[0]), plan.schedules[0], budget,
                          trial.user_attrs.get("seed", SEARCH_SEED))
            runs.append((trial, Outcome(point, trial.user_attrs.get("batches_to_target"), trial.user_attrs.get("final"),
                                        trial.user_attrs.get("time_to_target_s"), str(trial.number))))
    return runs


def queue_baseline_run(config: TuneConfig, study) -> bool:
    """Queue the baseline plan's next run (``baseline_plan``); False where the plan is done, or where its next run
    is one another worker is running (this worker then goes on to the search)."""
    if any(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False)):
        return True
    plan = baseline_plan(config)
    runs = baseline_runs(config, plan, study, ("COMPLETE", "PRUNED", "RUNNING"))
    point = next_run(plan, [outcome for trial, outcome in runs if trial.state.name != "RUNNING"])
    if point is None or point in [outcome.point for trial, outcome in runs if trial.state.name == "RUNNING"]:
        return False
    params = {"lr": point.lr} if config.space("baseline").lr_factor else {}
    if plan.budget_step:
        steps = next(k for k in range(1, plan.most_steps + 1) if plan.budget(k) == point.budget)
        params["duration_scale"] = steps * config.settings.duration_scale_range[0]
    given = point.lr == plan.rates[0] and abs(params.get("duration_scale", 1.0) - 1.0) < 1e-9  # the base itself
    where = {"start_from": BASE_START} if given else {"plan": "learning rate" if point.stage == "sweep" else "budget"}
    study.enqueue_trial(params, user_attrs={"seed": point.seed, **where})
    return True


def _seed_once(study, starts: list, config: TuneConfig, phase: str) -> None:
    """Queue the recipes ``starts`` in order, once per study (each named for where it comes from), each restricted
    to the methods the search may try."""
    if study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    base, space = config.base_recipe(), config.space(phase)
    for recipe in starts:
        if space.methods:  # a preset restricted to the methods the search may try is still a good start
            recipe = recipe.with_changes(methods={m: p for m, p in recipe.methods.items() if m in space.methods})
        params = recipe_params(recipe, base, space)
        if params is not None:
            study.enqueue_trial(params, user_attrs={"start_from": recipe.name}, skip_if_exists=True)


def starting_recipes(config: TuneConfig, baseline_study) -> list:
    """The task's speed-up presets, the fastest measured first (those never measured, or that missed, last),
    then the shortest budget; without any, the tuned baseline (or the base as it is)."""
    from speedkit.core.devices import resolve_device, resolve_precision
    from speedkit.tasks import TASKS, is_baseline

    run = config.settings.run
    base, device, task = config.base_recipe(), resolve_device(run.device), TASKS.get(run.task)

    def order(preset) -> tuple:
        measured, scale = (preset.reached or {}).get("time_to_target_s"), budget_scale(preset, base)
        return math.inf if measured is None else float(measured), math.inf if scale is None else scale

    # a baseline (plain-bf16 for a folder task) is measured in the baseline study
    presets = [p for name, p in (task.recipes if task else {}).items() if not is_baseline(task, name)]
    recipes = [p.with_changes(precision=resolve_precision(p.precision, device)) for p in sorted(presets, key=order)]
    if not recipes:  # no preset: the tuned baseline (or the base as it is) is where the moves start from
        best = confirmed_baselines(config, baseline_study)[:1]
        recipes.append(recipe_from_trial(best[0], "tuned-baseline") if best else base)
    return recipes


def ranked(study) -> list:
    """Completed trials, best objective first."""
    return sorted(finished_trials(study, ("COMPLETE",)), key=lambda t: t.value)


def confirmed_baselines(config: TuneConfig, baseline_study) -> list:
    """The baseline study's trials the confirmation runs: the plan's answer (``baseline_plan.answer``), and the
    base recipe as given beside it where tuning changed it. The plan tunes on seed 0 alone, and a learning rate or
    budget that was fastest there can be slower on others; the speed-up is measured against whichever is faster
    on the fresh seeds."""
    plan = baseline_plan(config)
    runs = baseline_runs(config, plan, baseline_study, ("COMPLETE",))
    found = answer(plan, [outcome for _, outcome in runs])
    best = [trial for trial, outcome in runs if outcome is found]
    given = [t for t in finished_trials(baseline_study, ("COMPLETE",)) if t.user_attrs.get("start_from") == BASE_START]
    return best + [t for t in given[:1] if best and t.number != best[0].number]


@dataclasses.dataclass
class Standing:
    """One recipe of a study and every finished run of it: scored by its worst seed, so that a recipe whose
    first seed was lucky does not lead once its second seed ran."""

    first: object  # its first trial (the one its moves and the report name)
    runs: list  # its trials, completed or pruned
    score: float  # the worst objective over its seeds; a pruned run scores as a miss

    @property
    def seeds(self) -> int:
        return len(self.runs)

    @property
    def reached(self) -> bool:
        return all(t.user_attrs.get("time_to_target_s") is not None for t in self.runs)

    def needs_repeat(self, trials: list) -> bool:
        """Whether it reached the target on its one seed and no second run of it is queued or running yet."""
        return self.seeds == 1 and self.reached and not any(
            t.user_attrs.get("repeat_of") == self.first.number for t in trials)


def standings(study) -> list[Standing]:
    """The study's recipes, best first, by their worst seed (a recipe run on two seeds must reach the target
    on both to rank by time; a run pruned behind the others ranks it with the misses)."""
    from speedkit.experiments.tune.moves import recipe_key

    groups: dict[str, list] = {}
    for trial in sorted(finished_trials(study), key=lambda t: t.number):
        if trial.user_attrs.get("recipe") and (trial.state.name == "COMPLETE"
                                               or trial.user_attrs.get("repeat_of") is not None):
            groups.setdefault(recipe_key(recipe_from_trial(trial, "r")), []).append(trial)
    rows = [Standing(runs[0], runs, max(t.value if t.state.name == "COMPLETE" else float("inf") for t in runs))
            for runs in groups.values() if runs[0].state.name == "COMPLETE"]
    return sorted(rows, key=lambda s: (s.score, s.first.number))


def recipe_from_trial(trial, name: str):
    from speedkit.tasks.recipes import Recipe

    data = dict(trial.user_attrs["recipe"])
    data["name"] = name
    return Recipe(**data)


def start_workers(config_path: Path, n_extra: int) -> list[subprocess.Popen]:
    """Extra worker processes on the same studies (``python -m speedkit.experiments.tune.worker CONFIG INDEX``),
    each logging to ``worker-INDEX.log`` beside the config."""
    workers = []
    for index in range(1, n_extra + 1):
        with open(config_path.parent / f"worker-{index}.log", "ab") as log:
            workers.append(subprocess.Popen([sys.executable, "-m", "speedkit.experiments.tune.worker", str(config_path),
                                             str(index)], stdout=log, stderr=subprocess.STDOUT))
    return workers


def check_same_search(config: TuneConfig, study) -> None:
    """Refuse to continue a study that was started with other settings (its times would not compare)."""
    data = (config.task_source or {}).get("data")  # a folder task's name is one name for every folder
    identity = {"task": config.settings.run.task, "metric": config.metric, "target": config.target, "base": config.base,
                "spaces": config.spaces, "settings": config.run_settings(), "limit_s": config.limit_s,
                **({} if data is None else {"data": data_identity(data)})}
    identity = json.loads(json.dumps(identity))  # as stored: tuples become lists
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        return
    changed = sorted(k for k in identity if identity[k] != stored.get(k))
    if changed:
        details = "; ".join(f"{k}: was {stored.get(k)!r}, now {identity[k]!r}" for k in changed
                            if k not in ("spaces", "base"))
        raise TuneInputError(f"study {study.study_name!r} in {config.settings.storage} was started with other settings "
                             f"({', '.join(changed)} differ{': ' + details if details else ''}); continue it with "
                             f"the same arguments, or start a new search with another study_name or out_dir")
