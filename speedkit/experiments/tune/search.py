"""The search: what it is asked (``TuneSettings``) and its configuration (``TuneConfig``, shared by every worker
process), the Optuna study, the objective, and the two phases each worker runs until they close: the baseline tuned
by the benchmark's plan (``speedkit.experiments.baseline_plan.run_plan``, its runs RunRecords in the run folder, run
by one process at a time), then the search, where Optuna proposes and ranks on the search's seed. The confirmation on
fresh seeds is measured runs in the run folder too (``confirm.py``); Optuna keeps only what it proposed. What it
proposes in what order, and why, is in docs/guide.md ("Tune: search for the fastest recipe").
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
from speedkit.experiments.baseline_plan import (BaselinePlan, Outcome, Point, answer, default_sweep, next_run,
                                                run_plan)
from speedkit.experiments.measure import budget_scale, refuse_planned
from speedkit.experiments.tune.objective import (USER_STOP, TrialContext, resolve_runner, score_record,
                                                 train_and_store)
from speedkit.experiments.tune.space import SearchSpace, TuneInputError, describe_change, recipe_params, suggest_recipe
from speedkit.experiments.tune.storage import (BASELINE_LOCK, BASELINE_RUNS, START_LOCK, FolderLock, finished_trials,
                                               open_storage, optuna_module, read_plan, requeue, started_trials,
                                               worker_id)
from speedkit.record.runs import RunRecord

BASE_START = "baseline"  # where the base recipe's own run came from: the baseline plan's first run
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
    # what the baseline plan's runs may take: on the held-out glyphs a 20-minute search's plan needed 36% to walk
    # its budget down, and at 15% the baseline kept its shipped budget, which made the pick look 1.6x faster
    baseline_share: float = 0.3
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
    space: dict  # what the search may change (SearchSpace.to_dict)
    budget_s: float
    limit_s: float  # per-trial training limit, and the penalty's reference
    started_at: float  # time.time() when this tune call started
    spent_before_s: float  # search time used by earlier calls on the same study
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

    def base_recipe(self):
        from speedkit.tasks.recipes import Recipe

        return Recipe(**self.base)

    def search_space(self) -> SearchSpace:
        return SearchSpace(**{k: tuple(v) if isinstance(v, list) else v for k, v in self.space.items()})

    def spent_s(self) -> float:
        return self.spent_before_s + (time.time() - self.started_at)


def load_study(config: TuneConfig, worker_index: int = 0, storage=None):
    """The search's study (created on first use), with this worker's sampler and the search's pruner."""
    optuna = optuna_module()
    with warnings.catch_warnings():  # `group` (conditional spaces: a method's settings only when it is on) is experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # worker 0 keeps sampler_seed (a one-process search samples as it always did); numpy's RandomState takes 32 bits
        seed = process_seed(config.settings.sampler_seed, worker_index, bits=32)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5,
                                             multivariate=True, group=True, constant_liar=config.settings.n_workers > 1)
    return optuna.create_study(study_name=config.settings.study_name, load_if_exists=True, direction="minimize",
                               storage=storage or open_storage(config.settings.storage), sampler=sampler,
                               pruner=make_pruner(config))


PRUNER_STARTUP_TRIALS = 6  # finished trials a study needs before any trial is pruned


def make_pruner(config: TuneConfig):
    """Successive halving (default) or Hyperband over training milliseconds, the trials' resource; any of
    them only once the study has a few finished trials and one that reached the target."""
    optuna = optuna_module()
    limit_ms, pruner = max(3, int(config.limit_s * 1000)), config.settings.pruner
    if pruner == "none":
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


def make_objective(config: TuneConfig, runner, should_stop=None, baselines=()):
    """The search's Optuna objective: propose a recipe, train it (or refuse it untrained), score it.
    ``baselines``: the baseline plan's runs (``baseline_runs``), whose walls the confirmation's reserve counts."""
    optuna = optuna_module()
    base, space = config.base_recipe(), config.search_space()

    def objective(trial):
        trial.set_user_attr("worker", worker_id())
        name = f"{config.settings.study_name}-search-t{trial.number:04d}"
        refused = refused_methods(trial.study)
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
        later = finished_trials(trial.study)
        kept_back = confirm_reserve_s(config, trial.study, baselines) if later else 0.0
        context = trial_context(config, "search", recipe, seed=trial.user_attrs.get("seed", SEARCH_SEED),
                                run_name=name, trial=trial, kept_back_s=kept_back, best_s=best_reached_s(trial.study))
        context.should_stop = should_stop
        return _run_and_score(config, trial, context, runner)

    def _infeasible(trial, reason: str):
        trial.set_user_attr("infeasible", reason)
        raise optuna.TrialPruned(reason)  # pruned at once, untrained: the sampler learns to avoid it

    objective.infeasible = _infeasible
    return objective


def trial_context(config: TuneConfig, phase: str, recipe, seed: int, run_name: str, trial=None,
                  kept_back_s: float = 0.0, best_s: float | None = None) -> TrialContext:
    """One run's context; a search trial stops where it would eat into the time ``kept_back_s`` for the
    confirmation (or, for one that reached nothing, at the search's end), and at 1.5x ``best_s``, the best time
    of its phase so far: past it a run can be neither winner nor runner-up. A run of the baseline plan is not
    bound by the search's end: the plan keeps to its share by its own runs' time (``baseline_open``), and a budget
    walk's run cut short by the deadline would read as a budget with which the baseline misses the target."""
    stop_after = config.limit_s
    if phase != "baseline":
        stop_after = min(stop_after, max(1.0, config.budget_s - config.spent_s() - kept_back_s))
    if best_s is not None:
        stop_after = min(stop_after, 1.5 * best_s)
    return TrialContext(run=config.trial_run(recipe, seed, run_name, phase, trial), metric=config.metric,
                        target=config.target, limit_s=config.limit_s, stop_after_s=stop_after, trial=trial)


def _run_and_score(config: TuneConfig, trial, context: TrialContext, runner) -> float:
    """Train the trial's run and score it."""
    optuna = optuna_module()
    from speedkit.core.method import NothingToChangeError

    try:
        record = train_and_store(trial, context, runner)
    except KeyboardInterrupt:  # Ctrl-C: this trial runs again when the search continues
        requeue(trial.study, trial)
        raise
    except NothingToChangeError as e:
        _mark_inapplicable(trial.study, context.run.recipe.methods, str(e))
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


def confirm_wall_s(attrs: dict, fallback: float, baseline: bool = True) -> float:
    """What a confirmation run of a recipe may take, from what its run on the search's seed left (a trial's
    ``user_attrs``, a baseline run's ``attrs``): that run's wall time (``fallback`` where it has none), and for a
    baseline's, its whole budget where it reached the target near its end. The target a user sets is often what
    the baseline reaches at the end, so on a seed where it misses, it trains its whole budget: the confirmation's
    reserve must hold that, not the seed-0 run that stopped at the target."""
    wall = attrs.get("wall_s") or fallback
    done = attrs.get("budget_done")
    reached = attrs.get("time_to_target_s") is not None
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


def confirm_reserve_s(config: TuneConfig, study, baselines: Sequence["BaselineRun"]) -> float:
    """Time kept back for confirmation: the baselines' run times over their whole budget and the likely
    winner's measured trial time, times the seeds (as many of those asked for as fit in half the budget, at
    least one: where a baseline run is long, a search of one trial confirmed on three seeds would find nothing)."""
    typical = [t.user_attrs.get("wall_s") for t in finished_trials(study, ("COMPLETE",))]
    typical = [t for t in typical + [run.attrs["wall_s"] for run in baselines if not run.attrs["failed"]] if t]
    fallback = statistics.median(typical) if typical else config.limit_s
    # the runner-up is confirmed only where time is left
    walls = [confirm_wall_s(run.attrs, fallback) for run in confirmed_baselines(config, baselines)] or [fallback]
    best = ranked(study)[:1]  # the likely winner
    best_wall = confirm_wall_s(best[0].user_attrs, fallback, baseline=False) if best else fallback
    walls.append(best_wall)
    reserve = seeds_that_fit(config, sum(walls), config.budget_s / 2) * sum(walls)
    if config.settings.leave_one_out and best:  # one run per method of the likely winner
        reserve += len(best[0].user_attrs.get("recipe", {}).get("methods", {})) * best_wall
    return reserve


def seeds_that_fit(config: TuneConfig, per_seed_s: float, within_s: float) -> int:
    """How many of the confirmation seeds asked for fit in ``within_s`` at ``per_seed_s`` each (at least one)."""
    return max(1, min(config.settings.seeds_to_confirm, int(within_s // max(per_seed_s, 1e-9))))


def search_open(config: TuneConfig, study, baselines: Sequence["BaselineRun"]) -> bool:
    """Whether a worker may start another search trial now."""
    most = config.settings.max_trials
    if most is not None and started_trials(study) >= most:
        return False  # running trials count: another process's will finish
    if not finished_trials(study):
        return True  # at least one measured trial, or there is nothing to confirm
    return config.spent_s() + confirm_reserve_s(config, study, baselines) < config.budget_s


def run_phases(config: TuneConfig, worker_index: int = 0, runner=None, on_trial=None, should_stop=None,
               log=print) -> None:
    """Tune the baseline (``run_baseline_plan``: one process at a time), then search until the search closes (all
    workers run this)."""
    runner = runner or resolve_runner(config.settings.runner)
    study = load_study(config, worker_index, open_storage(config.settings.storage))
    run_baseline_plan(config, study, runner, should_stop, log)
    callbacks = [on_trial] if on_trial is not None else []
    while not (should_stop and should_stop()) and search_open(config, study, baseline_runs(config, study)):
        gate = FolderLock(config.settings.out_dir, START_LOCK)  # one process at a time starts a trial (storage.py)
        gate.acquire()
        try:
            baselines = baseline_runs(config, study)
            if not search_open(config, study, baselines) or answer_decided(config, study):
                break
            _seed_once(study, starting_recipes(config, baselines), config)  # its starting points, once
            queue_next_move(config, study, baselines, worker_index)
            study.optimize(gate.releasing(make_objective(config, runner, should_stop, baselines)), n_trials=1,
                           callbacks=callbacks, gc_after_trial=False)
        except SearchStopped:
            return
        finally:
            gate.release()


def search_limits(config: TuneConfig) -> str:
    """The limits a search ran to (its budget, its trial counts, the baseline plan's share): a rerun with other
    limits searches on (with a larger share, the baseline plan first)."""
    settings = config.settings
    return json.dumps({"budget_s": config.budget_s, "max_trials": settings.max_trials,
                       "max_baseline_trials": settings.max_baseline_trials,
                       "baseline_share": settings.baseline_share}, sort_keys=True)


def answer_decided(config: TuneConfig, search_study) -> bool:
    """Whether a process has closed the search at these limits to confirm its winner: then no process starts
    another search trial, so every process confirms and reports the same one (a rerun with a longer
    ``budget`` or more trials searches on)."""
    return read_plan(search_study).get("closed_for") == search_limits(config)


def queue_next_move(config: TuneConfig, study, baselines: Sequence["BaselineRun"], worker_index: int = 0) -> None:
    """Queue a move from the best recipe so far (``speedkit.experiments.tune.moves``; the tuned baseline before
    any), unless a point is queued already; with no move left, the next trial is the sampler's."""
    import random

    from speedkit.experiments.tune.moves import propose_move, recipe_key

    trials = study.get_trials(deepcopy=False)
    if any(t.state.name == "WAITING" for t in trials):
        return
    base, space = config.base_recipe(), config.search_space()
    leaders = [s for s in standings(study) if s.first.user_attrs.get("start_from") != BASE_START]
    if leaders and leaders[0].needs_repeat(trials):
        # the leader again, on REPEAT_SEED: a lead on one seed is often that seed's luck (which evaluation first
        # passes the target moves with it), and every move after it would start from that luck
        first = leaders[0].first
        study.enqueue_trial(first.params, user_attrs={"repeat_of": first.number, "seed": REPEAT_SEED})
        return
    if leaders:
        best = leaders[0].first
        incumbent, reached, origin = (recipe_from_trial(best, "incumbent"),
                                      best.user_attrs.get("time_to_target_s") is not None, f"#{best.number}")
    else:
        tuned = confirmed_baselines(config, baselines)[:1]
        incumbent = plan_recipe(config, tuned[0].point, "incumbent") if tuned else base
        reached, origin = bool(tuned) and tuned[0].outcome.time_to_target_s is not None, "the tuned baseline"
    tried = {recipe_key(recipe_from_trial(t, "tried")) for t in trials if t.user_attrs.get("recipe")}
    tried |= {t.user_attrs["proposed"] for t in trials if t.user_attrs.get("proposed")}
    rng = random.Random(f"{config.settings.sampler_seed}:{len(trials)}:{worker_index}")  # a rerun proposes the same
    added = {m for t in trials for m in (t.user_attrs.get("recipe") or {}).get("methods", {})}
    move = propose_move(incumbent, reached, base, space, refused_methods(study), tried, rng, added, config.move_prior)
    if move is None:
        return
    study.enqueue_trial(recipe_params(move.recipe, base, space),
                        user_attrs={"move": f"{move.what} (from {origin})", "proposed": recipe_key(move.recipe)})


# -- the baseline, tuned by the benchmark's plan --------------------------------------------------------------------
def baseline_plan(config: TuneConfig) -> BaselinePlan:
    """How the search tunes its baseline (``speedkit.experiments.baseline_plan``, as ``speedkit bench --sweep
    --find-budgets`` does, on the same grid, ``default_sweep``): the base's learning rate as given, halved and
    doubled, with its own schedule and then with a linear decay after the same warmup (and on past the edge that
    wins, within ``lr_factor``), on the search's seed at the base's budget; then the pick's budget in steps of the
    least ``duration_scale_range`` allows, on that seed. All of it within ``baseline_share`` of the budget."""
    base, settings = config.base_recipe(), config.settings
    lr, factor = base.optimizer["lr"], settings.lr_factor or 1.0
    grid = default_sweep(base)
    scales = settings.duration_scale_range  # None: the budget is not searched
    step = scaled_duration(base.duration, scales[0]) if scales else None
    most = max(1, int(scales[1] / scales[0] + 1e-9)) if scales else None
    return BaselinePlan(metric=config.metric, rates=grid["lr"] if factor >= 2 else (lr,), schedules=grid["schedule"],
                        sweep_budget=scaled_duration(step, most) if step else base.duration, sweep_seed=SEARCH_SEED,
                        budget_step=step, seeds=(SEARCH_SEED,), start_steps=most, most_steps=most,
                        lr_range=(lr / factor, lr * factor))


@dataclasses.dataclass(frozen=True)
class BaselineRun:
    """A finished run of the baseline plan: its point, its outcome (read from its RunRecord; a run that failed
    missed) and ``attrs``, what the report and the confirmation's reserve read: its wall time, the share of its
    budget it trained, time to target, final metric, objective, where it came from."""

    number: int
    point: Point
    outcome: Outcome
    attrs: dict


def plan_recipe(config: TuneConfig, point: Point, name: str):
    """The base recipe at a point of the baseline plan: its learning rate, schedule and budget."""
    return config.base_recipe().with_changes(name=name, optimizer={"lr": point.lr}, schedule=point.schedule,
                                             duration=point.budget)


def baseline_runs(config: TuneConfig, study) -> list[BaselineRun]:
    """The baseline plan's runs the search study lists, in order, each with its RunRecord from the run folder
    (one whose record is gone is left out, and runs again). Read at every search trial, so each record is read
    from where it was written, not found among every run of the folder."""
    runs = []
    for entry in study.user_attrs.get(BASELINE_RUNS, []):
        record = None if entry["failed"] else _listed_record(config, entry)
        if entry["failed"] or record is not None:
            runs.append(_baseline_run(config, entry, record))
    return runs


def _listed_record(config: TuneConfig, entry: dict) -> RunRecord | None:
    """A listed run's RunRecord as it finished; None where it is gone, or a later run of its name replaced it."""
    try:
        record = RunRecord.load(Path(config.settings.run.run_dir) / entry["name"] / "record.json")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.run_id == entry["run"] and record.status != "failed" else None


def _baseline_run(config: TuneConfig, entry: dict, record) -> BaselineRun:
    point = Point(entry["lr"], entry["schedule"], entry["budget"], entry["seed"], entry["stage"])
    metric, target = config.metric, config.target
    if record is None:  # it failed: a miss
        outcome, score, train_s, path = Outcome(point, None, None, None, entry["name"]), None, None, None
    else:
        outcome = Outcome(point, record.time_to(metric, target, x="batch"), record.best(metric),
                          record.time_to(metric, target), record.name)
        score, train_s, path = score_record(record, metric, target, config.limit_s), record.timings.get("train_s"), \
            str(record.path)
    attrs = {key: entry.get(key) for key in ("failed", "budget_done", "stop_reason", "start_from", "plan", "seed")}
    return BaselineRun(entry["number"], point, outcome, {
        **attrs, "wall_s": round(entry["span"][1] - entry["span"][0], 3), "started": entry["span"][0],
        "time_to_target_s": outcome.time_to_target_s, "final": outcome.final, "train_s": train_s, "score": score,
        "record": path, "change": describe_change(plan_recipe(config, point, "r"), config.base_recipe())})


def baseline_open(config: TuneConfig, runs: Sequence[BaselineRun]) -> bool:
    """Whether the plan may start another run: at least one, at most ``max_baseline_trials``, and only while its
    runs have taken less than ``baseline_share`` of the budget (their own time, so that a search continued with a
    larger share goes on with the plan, whatever the search spent since)."""
    most = config.settings.max_baseline_trials
    if most is not None and len(runs) >= most:
        return False
    return not runs or _plan_seconds(runs) < config.settings.baseline_share * config.budget_s


def _plan_seconds(runs: Sequence[BaselineRun]) -> float:
    return sum(run.attrs["wall_s"] for run in runs)


def baseline_plan_state(config: TuneConfig, runs: Sequence[BaselineRun]) -> dict:
    """Whether the baseline plan ran to its end (``finished``) and, where it did not, what it left out (``left``:
    the rest of its rate and schedule sweep, its budget walk, or the rest of that walk) and why (``stopped_by``):
    the baseline measured is then less tuned than the plan would have made it, which the report says beside the
    speed-up."""
    upcoming = next_run(baseline_plan(config), [run.outcome for run in runs])
    state = {"runs": len(runs), "finished": upcoming is None}
    if upcoming is not None:
        most, share = config.settings.max_baseline_trials, config.settings.baseline_share
        walked = any(run.point.stage == "budget" for run in runs)
        state["left"] = ("the rest of its rate and schedule sweep" if upcoming.stage != "budget" else
                         "the rest of its budget walk" if walked else "its budget walk")
        state["stopped_by"] = (
            f"max_baseline_trials={most}" if most is not None and len(runs) >= most else
            f"its share of the budget ({share:.0%}, {share * config.budget_s:.0f}s)"
            if _plan_seconds(runs) >= share * config.budget_s else "a stop before its end")
    return state


def run_baseline_plan(config: TuneConfig, study, runner, should_stop=None, log=print) -> None:
    """Tune the baseline by the benchmark's plan (``baseline_plan.run_plan``) while ``baseline_open``, listing
    each finished run with the search study; a killed plan goes on from the runs listed. One process at a time
    runs it (its next run depends on the last): another that finds it running goes on to the search."""
    gate = FolderLock(config.settings.out_dir, BASELINE_LOCK)
    if answer_decided(config, study) or not gate.try_acquire():
        return
    try:
        runs, plan = baseline_runs(config, study), baseline_plan(config)

        def run(point: Point) -> Outcome | None:
            if not baseline_open(config, runs) or (should_stop and should_stop()):
                return None
            done = _run_baseline_point(config, study, runner, plan, point, runs, should_stop)
            if done is None:
                return None
            runs.append(done)
            attrs, reached = done.attrs, done.outcome.time_to_target_s
            what = attrs["failed"] or (f"reached at {reached:.1f}s" if reached is not None
                                       else f"missed (best {attrs['final']})")
            shape = (point.schedule or {}).get("name", "constant")
            log(f"  baseline plan #{done.number}: lr {point.lr:g} {shape}, {point.budget} on seed {point.seed} -> "
                f"{what}")
            return done.outcome

        run_plan(plan, [r.outcome for r in runs], run)
        state = baseline_plan_state(config, runs)
        if not state["finished"] and not (should_stop and should_stop()):
            log(f"speedkit tune: the baseline plan stopped after {state['runs']} runs, at {state['stopped_by']}, "
                f"before {state['left']}; the report says what that means for the speed-up")
    finally:
        gate.release()


def _run_baseline_point(config: TuneConfig, study, runner, plan: BaselinePlan, point: Point,
                        runs: Sequence[BaselineRun], should_stop) -> BaselineRun | None:
    """One run of the plan, listed with the study once it ends; None where the user stopped it (it runs again
    when the search continues). A run that raised is listed as failed, a miss."""
    entries = study.user_attrs.get(BASELINE_RUNS, [])
    name = f"{config.settings.study_name}-baseline-{len(entries):02d}"
    best = [r.outcome.time_to_target_s for r in runs if r.outcome.time_to_target_s is not None]
    context = trial_context(config, "baseline", plan_recipe(config, point, name), point.seed, name,
                            best_s=min(best, default=None))
    context.should_stop = should_stop
    started, record, failed = time.time(), None, None
    try:
        record = runner(context)
    except Exception as e:  # a baseline that cannot run at this point missed there; the plan goes on
        failed = f"{type(e).__name__}: {e}"
    if context.stop_reason == USER_STOP:
        return None
    origin = ({"start_from": BASE_START} if point == plan.grid()[0]  # the base as given: the plan's first run
              else {"plan": "learning rate and schedule" if point.stage == "sweep" else "budget"})
    entry = {"number": len(entries), "name": name, "run": None if record is None else record.run_id,
             "lr": point.lr, "schedule": point.schedule, "budget": point.budget, "seed": point.seed,
             "stage": point.stage, "span": [started, time.time()], "budget_done": context.budget_done,
             "stop_reason": context.stop_reason, "failed": failed, **origin}
    study.set_user_attr(BASELINE_RUNS, [*entries, entry])
    return _baseline_run(config, entry, record)


def _seed_once(study, starts: list, config: TuneConfig) -> None:
    """Queue the recipes ``starts`` in order, once per study (each named for where it comes from), each restricted
    to the methods the search may try."""
    if study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    base, space = config.base_recipe(), config.search_space()
    for recipe in starts:
        if space.methods:  # a preset restricted to the methods the search may try is still a good start
            recipe = recipe.with_changes(methods={m: p for m, p in recipe.methods.items() if m in space.methods})
        params = recipe_params(recipe, base, space)
        if params is not None:
            study.enqueue_trial(params, user_attrs={"start_from": recipe.name}, skip_if_exists=True)


def starting_recipes(config: TuneConfig, baselines: Sequence[BaselineRun]) -> list:
    """The task's speed-up presets, the fastest measured first (those never measured, or that missed, last),
    then the shortest budget; without any, the tuned baseline (or the base as it is)."""
    from speedkit.core.devices import resolve_device, resolve_precision
    from speedkit.tasks import TASKS, is_baseline

    run = config.settings.run
    base, device, task = config.base_recipe(), resolve_device(run.device), TASKS.get(run.task)

    def order(preset) -> tuple:
        measured, scale = (preset.reached or {}).get("time_to_target_s"), budget_scale(preset, base)
        return math.inf if measured is None else float(measured), math.inf if scale is None else scale

    # a baseline (plain-bf16 for a folder task) is measured by the baseline plan
    presets = [p for name, p in (task.recipes if task else {}).items() if not is_baseline(task, name)]
    recipes = [p.with_changes(precision=resolve_precision(p.precision, device)) for p in sorted(presets, key=order)]
    if not recipes:  # no preset: the tuned baseline (or the base as it is) is where the moves start from
        best = confirmed_baselines(config, baselines)[:1]
        recipes.append(plan_recipe(config, best[0].point, "tuned-baseline") if best else base)
    return recipes


def ranked(study) -> list:
    """Completed trials, best objective first."""
    return sorted(finished_trials(study, ("COMPLETE",)), key=lambda t: t.value)


def confirmed_baselines(config: TuneConfig, baselines: Sequence[BaselineRun]) -> list[BaselineRun]:
    """The baseline runs the confirmation runs again: the plan's answer (``baseline_plan.answer``), and the base
    recipe as given beside it where tuning changed it. The plan tunes on seed 0 alone, and a learning rate or
    budget that was fastest there can be slower on others; the speed-up is measured against whichever is faster
    on the fresh seeds."""
    ran = [run for run in baselines if not run.attrs["failed"]]
    found = answer(baseline_plan(config), [run.outcome for run in ran])
    best = [run for run in ran if run.outcome is found]
    given = [run for run in ran if run.attrs.get("start_from") == BASE_START]
    return best + [run for run in given[:1] if best and run.number != best[0].number]


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
    """Extra worker processes on the same study (``python -m speedkit.experiments.tune.worker CONFIG INDEX``),
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
                "space": config.space, "settings": config.run_settings(), "limit_s": config.limit_s,
                **({} if data is None else {"data": data_identity(data)})}
    identity = json.loads(json.dumps(identity))  # as stored: tuples become lists
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        return
    changed = sorted(k for k in identity if identity[k] != stored.get(k))
    if changed:
        details = "; ".join(f"{k}: was {stored.get(k)!r}, now {identity[k]!r}" for k in changed
                            if k not in ("space", "base"))
        raise TuneInputError(f"study {study.study_name!r} in {config.settings.storage} was started with other settings "
                             f"({', '.join(changed)} differ{': ' + details if details else ''}); continue it with "
                             f"the same arguments, or start a new search with another study_name or out_dir")
