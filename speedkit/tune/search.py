"""``speedkit.tune``: a measured search (Optuna) for the recipe that reaches a task's target soonest.

Three studies share one Optuna storage (a journal file in the output folder by default, or any
SQLite/database URL): ``<name>-baseline`` tunes the baseline recipe's learning rate and budget,
``<name>`` searches methods and recipe fields, ``<name>-confirm`` holds the confirmation runs
(the tuned baseline, the winner and the runner-up on fresh seeds). A killed search loses no
finished trial: a rerun with the same storage and study name continues, re-running only the trial
that was cut short. Several processes may work on one study (``n_workers``, or more ``tune`` calls on
the same storage elsewhere). Every run also writes a RunRecord into ``run_dir``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from speedkit.tune.objective import USER_STOP, TrialContext, resolve_runner, runner_path, score_record
from speedkit.tune.space import (SearchSpace, TuneInputError, baseline_space, candidate_methods, describe_change,
                                 full_space, probe_surgery, recipe_params, resolve_methods, suggest_recipe)

PHASES = ("baseline", "search")
STALE_LOCK_S = 5
CONFIRM_SEED_START = 1  # the search runs seed 0; confirmation uses fresh seeds, so the winner's luck does not count twice


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ImportError("speedkit tune needs Optuna: pip install 'speedkit[tune]' (or pip install 'optuna>=4')") from None
    return optuna


# -- arguments ---------------------------------------------------------------------------------------
def parse_budget(budget: str | float | int) -> float:
    """Seconds from ``"30m"``, ``"90s"``, ``"1.5h"`` or a number of seconds."""
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        seconds = float(budget)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", str(budget))
        if not match:
            raise TuneInputError(f"budget must be a wall-clock time such as '30m', '90s' or '1h', got {budget!r}")
        seconds = float(match.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[match.group(2)]
    if not seconds > 0:
        raise TuneInputError(f"budget must be longer than zero, got {budget!r}")
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


# -- storage -------------------------------------------------------------------------------------------
def storage_url(storage: str | os.PathLike | None, out_dir: Path) -> str:
    """A database URL as given, ``sqlite:///`` for ``*.db``/``*.sqlite`` paths, else a journal file path."""
    if storage is None:
        return str((out_dir / "study.journal").resolve())
    text = str(storage)
    if "://" in text:
        return text
    path = Path(text).resolve()
    return f"sqlite:///{path}" if path.suffix in (".db", ".sqlite", ".sqlite3") else str(path)


def open_storage(url: str):
    optuna = _optuna()
    if "://" in url:
        return optuna.storages.RDBStorage(url)
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    # A write holds the lock for milliseconds; one left by a killed process is taken over after 5 s (Optuna's
    # default waits 30 s, which a resumed search would spend doing nothing).
    lock = JournalFileSymlinkLock(url, grace_period=STALE_LOCK_S)
    return optuna.storages.JournalStorage(JournalFileBackend(url, lock_obj=lock))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_dead_trials(study, storage) -> list[int]:
    """Mark RUNNING trials whose worker process on this machine is gone as FAIL; re-queue their settings.

    A killed search leaves its in-flight trial RUNNING for ever; its finished trials are untouched.
    Trials of live processes (another worker on the same study) and of other machines are left alone.
    """
    optuna = _optuna()
    host, study_id = socket.gethostname(), storage.get_study_id_from_name(study.study_name)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = str(trial.user_attrs.get("worker", ""))
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_system_attr(trial_id, "failed_because", "its worker process died")
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        failed.append(trial.number)
    return failed


# -- the configuration every worker shares ------------------------------------------------------------
@dataclasses.dataclass
class TuneConfig:
    task: str
    metric: str
    target: float
    base: dict  # the base recipe (Recipe.to_dict)
    spaces: dict  # phase -> SearchSpace.to_dict
    storage: str
    study_name: str
    out_dir: str
    run_dir: str
    settings: dict  # device, data_fraction, eval_fraction, eval_interval
    budget_s: float
    limit_s: float  # per-trial training limit, and the penalty's reference
    baseline_share: float
    seeds_to_confirm: int
    max_trials: dict  # phase -> most finished trials (None: until the time is used)
    pruner: str
    sampler_seed: int
    runner: str | None
    started_at: float  # time.time() when this tune call started
    spent_before_s: float  # search time used by earlier calls on the same studies
    n_workers: int = 1
    left_out: dict = dataclasses.field(default_factory=dict)  # method -> why the search does not try it

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, path) -> "TuneConfig":
        return cls(**json.loads(Path(path).read_text()))

    def study(self, phase: str) -> str:
        return self.study_name if phase == "search" else f"{self.study_name}-{phase}"

    def base_recipe(self):
        from speedkit.recipes import Recipe

        return Recipe(**self.base)

    def space(self, phase: str) -> SearchSpace:
        data = dict(self.spaces[phase])
        return SearchSpace(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def spent_s(self) -> float:
        return self.spent_before_s + (time.time() - self.started_at)


def load_study(config: TuneConfig, phase: str, worker_index: int = 0, storage=None):
    optuna = _optuna()
    with warnings.catch_warnings():  # `group` (conditional spaces: a method's settings only when it is on) is experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=config.sampler_seed + worker_index, n_startup_trials=5,
                                             multivariate=True, group=True, constant_liar=config.n_workers > 1)
    return optuna.create_study(study_name=config.study(phase), storage=storage or open_storage(config.storage),
                               direction="minimize", sampler=sampler, pruner=make_pruner(config),
                               load_if_exists=True)


def make_pruner(config: TuneConfig):
    """Successive halving (default) or Hyperband over training milliseconds, the trials' resource."""
    optuna = _optuna()
    limit_ms = max(3, int(config.limit_s * 1000))
    if config.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, limit_ms // 9), reduction_factor=3)
    if config.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, limit_ms // 27), max_resource=limit_ms,
                                              reduction_factor=3)
    if config.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3)
    if config.pruner == "none":
        return optuna.pruners.NopPruner()
    raise TuneInputError(f"pruner must be 'halving', 'hyperband', 'median' or 'none', got {config.pruner!r}")


# -- one trial -------------------------------------------------------------------------------------------
def _finished(study, states=("COMPLETE", "PRUNED")) -> list:
    optuna = _optuna()
    return study.get_trials(deepcopy=False, states=tuple(getattr(optuna.trial.TrialState, s) for s in states))


def best_reached_s(study) -> float | None:
    times = [t.user_attrs.get("time_to_target_s") for t in _finished(study, ("COMPLETE",))]
    times = [t for t in times if t is not None]
    return min(times) if times else None


class SearchStopped(Exception):
    """The search was asked to stop mid-trial; that trial is failed and queued to run again on resume."""


def make_objective(config: TuneConfig, phase: str, runner, should_stop=None):
    """The Optuna objective of one phase: propose a recipe, train it (or refuse it untrained), score it."""
    optuna = _optuna()
    base, space = config.base_recipe(), config.space(phase)

    def objective(trial):
        trial.set_user_attr("worker", worker_id())
        name = f"{config.study_name}-{phase}-t{trial.number:04d}"
        try:
            recipe = suggest_recipe(trial, base, space, name=name)
        except (ValueError, TypeError) as e:
            _infeasible(trial, f"recipe refused: {e}")
        blocked = _known_inapplicable(trial.study, recipe.methods)
        if blocked:
            _infeasible(trial, blocked)
        trial.set_user_attr("recipe", recipe.to_dict())
        trial.set_user_attr("change", describe_change(recipe, base))
        context = _context(config, phase, recipe, seed=0, run_name=name, trial=trial)
        context.should_stop = should_stop
        return _run_and_score(config, trial, context, runner)

    def _infeasible(trial, reason: str):
        trial.set_user_attr("infeasible", reason)
        raise optuna.TrialPruned(reason)  # pruned at once, untrained: the sampler learns to avoid it

    objective.infeasible = _infeasible
    return objective


def _context(config: TuneConfig, phase: str, recipe, seed: int, run_name: str, trial=None) -> TrialContext:
    remaining = max(1.0, config.budget_s - config.spent_s())
    stop_after = min(config.limit_s, remaining)
    best = best_reached_s(trial.study) if trial is not None else None
    if best is not None:
        stop_after = min(stop_after, 1.5 * best)  # past 1.5x the best time a run can be neither winner nor runner-up
    return TrialContext(task=config.task, recipe=recipe, seed=seed, run_dir=config.run_dir, run_name=run_name,
                        metric=config.metric, target=config.target, limit_s=config.limit_s, stop_after_s=stop_after,
                        settings=dict(config.settings), trial=trial,
                        extra_config={"seed": seed, "tune": {"study": config.study_name, "phase": phase,
                                                             "trial": trial.number if trial else None}})


def _run_and_score(config: TuneConfig, trial, context: TrialContext, runner) -> float:
    optuna = _optuna()
    from speedkit.core.algorithm import NothingToChangeError

    started = time.perf_counter()
    try:
        record = runner(context)
    except NothingToChangeError as e:
        _mark_inapplicable(trial.study, context.recipe.methods, str(e))
        trial.set_user_attr("infeasible", f"NothingToChangeError: {e}")
        raise optuna.TrialPruned(str(e)) from None
    except (ValueError, TypeError, RuntimeError, ArithmeticError) as e:  # a combination the code refused or that broke
        trial.set_user_attr("infeasible", f"{type(e).__name__}: {e}")
        trial.set_user_attr("wall_s", round(time.perf_counter() - started, 3))
        raise optuna.TrialPruned(f"{type(e).__name__}: {e}") from None
    if context.stop_reason == USER_STOP:
        trial.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        raise SearchStopped(f"trial {trial.number} stopped before it finished; it will run again on resume")
    value = score_record(record, config.metric, config.target, config.limit_s)
    _store_outcome(trial, record, config, time.perf_counter() - started, context.stop_reason)
    if context.stop_reason == "pruned":
        raise optuna.TrialPruned(f"pruned at {record.timings.get('train_s', 0):.1f}s of training")
    return value


def _store_outcome(trial, record, config: TuneConfig, wall_s: float, stop_reason: str | None) -> None:
    trial.set_user_attr("record", str(record.path))
    trial.set_user_attr("time_to_target_s", record.time_to(config.metric, config.target))
    trial.set_user_attr("final", record.best(config.metric))
    trial.set_user_attr("train_s", record.timings.get("train_s"))
    trial.set_user_attr("wall_s", round(wall_s, 3))
    trial.set_user_attr("stop_reason", stop_reason)


def _mark_inapplicable(study, methods: dict, message: str) -> None:
    """Remember which method found nothing to change, so later trials with it are refused untrained."""
    culprit = next((m for m in methods if message.startswith(m)), None)
    if culprit is not None:
        study.set_user_attr(f"inapplicable:{culprit}", message)


def _known_inapplicable(study, methods: dict) -> str | None:
    for name in methods:
        reason = study.user_attrs.get(f"inapplicable:{name}")
        if reason:
            return f"{name} found nothing to act on in an earlier trial: {reason}"
    return None


# -- phases ----------------------------------------------------------------------------------------------
def confirm_reserve_s(config: TuneConfig, studies: dict) -> float:
    """Time kept back for confirmation: each candidate's measured trial time, times the seeds."""
    typical = [t.user_attrs.get("wall_s") for s in studies.values() for t in _finished(s, ("COMPLETE",))]
    typical = [t for t in typical if t]
    fallback = statistics.median(typical) if typical else config.limit_s
    walls = []
    for phase, count in (("baseline", 1), ("search", 2)):
        if phase in studies:
            ranked = _ranked(studies[phase])[:count]
            walls += [t.user_attrs.get("wall_s") or fallback for t in ranked]
            walls += [fallback] * (count - len(ranked))
    return config.seeds_to_confirm * sum(walls)


def phase_open(config: TuneConfig, phase: str, studies: dict) -> bool:
    """Whether a worker may start another trial in ``phase`` now."""
    finished = len(_finished(studies[phase]))
    if config.max_trials.get(phase) is not None and finished >= config.max_trials[phase]:
        return False
    if finished == 0:
        return True  # at least one measured trial per phase, or there is nothing to confirm
    spent = config.spent_s()
    if phase == "baseline":
        return spent < config.baseline_share * config.budget_s
    return spent + confirm_reserve_s(config, studies) < config.budget_s


def run_phases(config: TuneConfig, worker_index: int = 0, runner=None, on_trial=None, should_stop=None) -> None:
    """Work on the baseline study, then the search study, until each phase closes (all workers run this)."""
    storage = open_storage(config.storage)
    runner = runner or resolve_runner(config.runner)
    studies = {phase: load_study(config, phase, worker_index, storage) for phase in PHASES}
    for phase in PHASES:
        objective = make_objective(config, phase, runner, should_stop)
        callbacks = [on_trial] if on_trial is not None else []
        while phase_open(config, phase, studies) and not (should_stop and should_stop()):
            if worker_index == 0 and phase == "search":
                seed_search_study(config, studies)
            try:
                studies[phase].optimize(objective, n_trials=1, callbacks=callbacks, gc_after_trial=False)
            except SearchStopped:
                return


def seed_search_study(config: TuneConfig, studies: dict) -> None:
    """Start the search from known points: the baseline, the tuned baseline, the task's presets (once)."""
    search = studies["search"]
    if search.user_attrs.get("seeded"):
        return
    search.set_user_attr("seeded", True)
    base, space = config.base_recipe(), config.space("search")
    for recipe in starting_recipes(config, studies["baseline"]):  # presets first: the fast ones set the bar early
        params = recipe_params(recipe, base, space)
        if params is not None:
            search.enqueue_trial(params, user_attrs={"start_from": recipe.name}, skip_if_exists=True)


def starting_recipes(config: TuneConfig, baseline_study) -> list:
    from speedkit.devices import resolve_device, resolve_precision
    from speedkit.recipes import RECIPES

    recipes = []
    device = resolve_device(config.settings.get("device", "auto"))
    presets = [p for name, p in RECIPES.get(config.task, {}).items() if name != "baseline"]
    for preset in sorted(presets, key=_measured_time):
        recipes.append(preset.with_changes(precision=resolve_precision(preset.precision, device)))
    # The tuned baseline, or the base as it is; the baseline study measured these already, but the search's
    # sampler learns from its own trials only.
    best = _ranked(baseline_study)[:1]
    recipes.append(recipe_from_trial(best[0], "tuned-baseline") if best else config.base_recipe())
    return recipes


def _measured_time(recipe) -> float:
    """A preset's benchmarked time to its target (those never measured, or that missed, come last)."""
    time_s = (recipe.reached or {}).get("time_to_target_s")
    return float("inf") if time_s is None else float(time_s)


def _ranked(study) -> list:
    """Completed trials, best objective first."""
    return sorted(_finished(study, ("COMPLETE",)), key=lambda t: t.value)


def recipe_from_trial(trial, name: str):
    from speedkit.recipes import Recipe

    data = dict(trial.user_attrs["recipe"])
    data["name"] = name
    return Recipe(**data)


def start_workers(config_path: Path, n_extra: int) -> list[subprocess.Popen]:
    """Extra worker processes on the same studies (``python -m speedkit.tune.worker CONFIG INDEX``),
    each logging to ``worker-INDEX.log`` beside the config."""
    workers = []
    for index in range(1, n_extra + 1):
        with open(config_path.parent / f"worker-{index}.log", "ab") as log:
            workers.append(subprocess.Popen([sys.executable, "-m", "speedkit.tune.worker", str(config_path),
                                             str(index)], stdout=log, stderr=subprocess.STDOUT))
    return workers


# -- confirmation ------------------------------------------------------------------------------------
def confirm_candidates(config: TuneConfig, studies: dict) -> list[tuple[str, str, object]]:
    """[(role, key, recipe)]: the tuned baseline, the winner and the runner-up of the search."""
    candidates = []
    baseline = _ranked(studies["baseline"])[:1]
    if baseline:
        candidates.append(("baseline", f"baseline:{baseline[0].number}", recipe_from_trial(baseline[0], "baseline")))
    else:
        candidates.append(("baseline", "baseline:untuned", config.base_recipe()))
    reached = [t for t in _distinct_best(studies["search"], 2) if t.user_attrs.get("time_to_target_s") is not None]
    for role, trial in zip(("winner", "runner-up"), reached):  # a trial that missed the target cannot win
        candidates.append((role, f"search:{trial.number}", recipe_from_trial(trial, "tuned")))
    return candidates


def _distinct_best(study, count: int) -> list:
    """The best completed trials whose recipes differ (a re-run of the same settings is not a runner-up)."""
    chosen, seen = [], []
    for trial in _ranked(study):
        recipe = {k: v for k, v in trial.user_attrs.get("recipe", {}).items() if k not in ("name", "summary")}
        if recipe and recipe not in seen:
            chosen.append(trial)
            seen.append(recipe)
        if len(chosen) == count:
            break
    return chosen


def run_confirmation(config: TuneConfig, studies: dict, runner=None, on_run=None, should_stop=None) -> list:
    """Each candidate on ``seeds_to_confirm`` fresh seeds, interleaved (A B C A B C ...); resumable."""
    optuna = _optuna()
    confirm = studies["confirm"]
    done = {(t.user_attrs.get("candidate"), t.user_attrs.get("seed")) for t in _finished(confirm, ("COMPLETE",))}
    runner = runner or resolve_runner(config.runner)
    for seed in range(CONFIRM_SEED_START, CONFIRM_SEED_START + config.seeds_to_confirm):
        for role, key, recipe in confirm_candidates(config, studies):
            if (key, seed) in done or (should_stop and should_stop()):
                continue
            trial = confirm.ask()
            for attr, value in (("worker", worker_id()), ("candidate", key), ("role", role), ("seed", seed),
                                ("recipe", recipe.to_dict())):
                trial.set_user_attr(attr, value)
            run_name = f"{config.study_name}-confirm-{key.replace(':', '-')}-s{seed}"
            context = _context(config, "confirm", recipe, seed, run_name)
            context.stop_after_s = 2 * config.limit_s  # the recipe runs as shipped; this only bounds a runaway
            context.should_stop = should_stop
            try:
                record = runner(context)
            except Exception as e:
                trial.set_user_attr("error", f"{type(e).__name__}: {e}")
                confirm.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if context.stop_reason == USER_STOP:  # not a measurement: run again when the search continues
                confirm.tell(trial, state=optuna.trial.TrialState.FAIL)
                break
            _store_outcome(trial, record, config, record.timings.get("train_s", 0.0), context.stop_reason)
            confirm.tell(trial, score_record(record, config.metric, config.target, config.limit_s))
            if on_run is not None:
                on_run(record)
    return _finished(confirm, ("COMPLETE",))


def summarize_confirmation(config: TuneConfig, studies: dict) -> dict:
    """Per candidate: seeds reached, times, median; the winner is the confirmed fastest, not the search's luckiest."""
    runs = _finished(studies["confirm"], ("COMPLETE",))
    seeds = list(range(CONFIRM_SEED_START, CONFIRM_SEED_START + config.seeds_to_confirm))
    rows = []
    for role, key, recipe in confirm_candidates(config, studies):
        by_seed = {t.user_attrs["seed"]: t.user_attrs for t in runs if t.user_attrs.get("candidate") == key}
        times = [by_seed.get(s, {}).get("time_to_target_s") for s in seeds]
        finals = [by_seed.get(s, {}).get("final") for s in seeds]
        reached = sum(t is not None for t in times)
        rows.append({"role": role, "key": key, "recipe": recipe.to_dict(), "seeds": seeds, "times_s": times,
                     "finals": finals, "seeds_reached": reached,
                     "median_s": statistics.median(times) if reached == len(seeds) else None,
                     "median_final": statistics.median([f for f in finals if f is not None]) if any(
                         f is not None for f in finals) else None,
                     "change": describe_change(recipe, config.base_recipe())})
    return {"seeds": seeds, "candidates": rows, **_judge(rows)}


def _judge(rows: list[dict]) -> dict:
    """The winner: the search candidate that reached the target on every seed with the lowest median time."""
    from speedkit.compare import paired_speedups

    baseline = next(r for r in rows if r["role"] == "baseline")
    contenders = [r for r in rows if r["role"] != "baseline" and r["median_s"] is not None]
    if not contenders:
        return {"winner": None, "speedups": None, "speedup_median": None}
    winner = min(contenders, key=lambda r: r["median_s"])
    pairs = paired_speedups(baseline["times_s"], winner["times_s"])
    present = [p for p in pairs if p is not None]
    return {"winner": winner["key"], "speedups": pairs,
            "speedup_median": statistics.median(present) if present else None}


# -- the entry point ---------------------------------------------------------------------------------
@dataclasses.dataclass
class TuneResult:
    recipe: Any  # the confirmed winner (Recipe), or None when no candidate reached the target on every seed
    recipe_path: Path | None
    report_path: Path
    html_path: Path | None
    summary: dict  # also in summary.json
    out_dir: Path
    storage: str
    study_name: str

    @property
    def speedup(self) -> float | None:
        return self.summary["confirmation"].get("speedup_median")


def tune(task: str = "fashion-mnist", target=None, budget: str | float = "30m", methods: Sequence[str] | str | None = None,
         storage: str | os.PathLike | None = None, study_name: str = "tune", seeds_to_confirm: int = 3,
         out_dir: str | os.PathLike = "runs/tune", run_dir: str | os.PathLike | None = None,
         data_fraction: float = 1.0, eval_fraction: float | None = None, eval_interval: str | None = None,
         device: str = "auto", n_workers: int = 1, base="baseline", tune_hparams: bool = True,
         trial_limit: str | float | None = None, baseline_share: float = 0.25, max_trials: int | None = None,
         max_baseline_trials: int | None = None, pruner: str = "halving", sampler_seed: int = 0,
         duration_scale: tuple[float, float] = (0.1, 1.0), lr_factor: float = 10.0, runner=None,
         log=print, on_trial=None, should_stop=None) -> TuneResult:
    """Search for the recipe that reaches ``target`` on ``task`` soonest, within ``budget`` of wall clock.

    ``target``: None (the task's), a value of the task's metric, ``"metric=value"`` or (metric, value).
    ``methods``: the methods the search may turn on (default: all that fit the task's domain and model).
    ``storage``: a journal file (default ``out_dir/study.journal``), ``*.db`` SQLite file or database URL;
    a rerun with the same storage and ``study_name`` continues the search. ``trial_limit``: most training
    time of one trial (default a fifth of the budget). ``runner``: a function ``(TrialContext) -> RunRecord``
    or ``"module:function"`` replacing the real training (tests plant known answers this way).
    ``on_trial(study, trial)`` is called after each trial of this process; ``should_stop()`` ends the search early.
    Writes ``recipe.yaml`` (the confirmed winner, with ``reached``), ``report.md``, ``report.html`` and
    ``summary.json`` into ``out_dir``, and a RunRecord per run into ``run_dir`` (default ``out_dir/runs``).
    """
    from speedkit.tune.report import write_outputs

    _optuna()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(task, target, budget, methods, storage, study_name, seeds_to_confirm, out, run_dir,
                          data_fraction, eval_fraction, eval_interval, device, n_workers, base, tune_hparams,
                          trial_limit, baseline_share, max_trials, max_baseline_trials, pruner, sampler_seed,
                          duration_scale, lr_factor, runner, log)
    in_process = resolve_runner(runner)  # a lambda in a notebook works here; worker processes import config.runner
    config_path = out / "tune_config.json"
    config.save(config_path)
    storage_obj = open_storage(config.storage)
    studies = {phase: load_study(config, phase, 0, storage_obj) for phase in (*PHASES, "confirm")}
    check_same_search(config, studies["search"])
    for phase, study in studies.items():
        retried = fail_dead_trials(study, storage_obj)
        if retried:
            log(f"{study.study_name}: trials {retried} were cut short by a dead worker; marked failed, settings re-queued")
    _seed_baseline_study(config, studies["baseline"])
    log(f"speedkit tune: {config.task}, target {config.metric} {config.target}, budget {config.budget_s:.0f}s "
        f"({config.spent_before_s:.0f}s used before), storage {config.storage}")
    workers = start_workers(config_path, n_workers - 1) if n_workers > 1 else []
    try:
        run_phases(config, 0, runner=in_process, on_trial=_logger(log, on_trial), should_stop=should_stop)
    finally:
        for process in workers:
            process.wait()
    log(f"speedkit tune: confirming the tuned baseline, the winner and the runner-up on {seeds_to_confirm} seeds")
    run_confirmation(config, studies, runner=in_process, should_stop=should_stop)
    summary = build_summary(config, studies)
    paths = write_outputs(config, studies, summary)
    log(f"speedkit tune: done; report {paths['report']}")
    return TuneResult(recipe=paths.get("recipe_obj"), recipe_path=paths.get("recipe"), report_path=paths["report"],
                      html_path=paths.get("html"), summary=summary, out_dir=out, storage=config.storage,
                      study_name=config.study_name)


def search_identity(config: TuneConfig) -> dict:
    """What must not change when a search continues: its trials are only comparable under the same settings."""
    return {"task": config.task, "metric": config.metric, "target": config.target, "base": config.base,
            "spaces": config.spaces, "settings": config.settings, "limit_s": config.limit_s}


def check_same_search(config: TuneConfig, study) -> None:
    """Refuse to continue a study that was started with other settings (its times would not compare)."""
    identity = json.loads(json.dumps(search_identity(config)))  # as stored: tuples become lists
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        return
    changed = sorted(k for k in identity if identity[k] != stored.get(k))
    if changed:
        details = "; ".join(f"{k}: was {stored.get(k)!r}, now {identity[k]!r}" for k in changed
                            if k not in ("spaces", "base"))
        raise TuneInputError(f"study {study.study_name!r} in {config.storage} was started with other settings "
                             f"({', '.join(changed)} differ{': ' + details if details else ''}); continue it with "
                             f"the same arguments, or start a new search with another study_name or out_dir")


def _logger(log, on_trial):
    def callback(study, trial):
        attrs = trial.user_attrs
        reached = attrs.get("time_to_target_s")
        what = (attrs.get("infeasible") or (f"reached at {reached:.1f}s" if reached is not None else
                                            f"missed (best {attrs.get('final')})"))
        log(f"  {study.study_name} #{trial.number} {trial.state.name.lower()}: {attrs.get('change', '')} -> {what}")
        if on_trial is not None:
            on_trial(study, trial)
    return callback


def _seed_baseline_study(config: TuneConfig, study) -> None:
    """The baseline recipe as it is is the baseline study's first point."""
    if study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    params = recipe_params(config.base_recipe(), config.base_recipe(), config.space("baseline"))
    if params is not None:
        study.enqueue_trial(params, user_attrs={"start_from": "baseline"}, skip_if_exists=True)


def build_config(task, target, budget, methods, storage, study_name, seeds_to_confirm, out: Path, run_dir,
                 data_fraction, eval_fraction, eval_interval, device, n_workers, base, tune_hparams, trial_limit,
                 baseline_share, max_trials, max_baseline_trials, pruner, sampler_seed, duration_scale,
                 lr_factor, runner, log) -> TuneConfig:
    """Check every argument and read the search space from the cards; refusals name the argument."""
    from speedkit.devices import resolve_device, resolve_precision
    from speedkit.recipes import get_recipe
    from speedkit.tasks import get_task

    spec = get_task(task)
    budget_s = parse_budget(budget)
    metric, value = resolve_target(spec, target)
    if n_workers < 1:
        raise TuneInputError(f"n_workers must be at least 1, got {n_workers}")
    if seeds_to_confirm < 1:
        raise TuneInputError(f"seeds_to_confirm must be at least 1, got {seeds_to_confirm}")
    if n_workers > 1 and runner is not None and runner_path(runner) is None:
        raise TuneInputError("runner must be importable ('module:function', or a module-level function) when "
                             "n_workers > 1: worker processes import it")
    allowed = resolve_methods(methods)
    base_recipe = get_recipe(task, base)
    device_type = resolve_device(device).type
    # "auto" precision made concrete, so the base is a point of the space (whose choices are fp32/bf16/fp16)
    base_recipe = base_recipe.with_changes(precision=resolve_precision(base_recipe.precision, resolve_device(device)))
    if eval_interval:
        base_recipe = base_recipe.with_changes(eval_interval=eval_interval)
    probe_recipe = base_recipe.with_changes(loader="memory")  # the probes need the model and evaluators, not a DataLoader
    known = logged_metrics(task, probe_recipe, device, data_fraction, eval_fraction)
    if metric not in known:
        raise TuneInputError(f"target metric {metric!r} is not logged by any evaluator of task {task!r}; "
                             f"it logs {', '.join(known)}")
    candidates, left_out = candidate_methods(spec.domain, allowed, device_type)
    left_out.update(probe_surgery(task, probe_recipe, candidates, device, data_fraction))
    candidates = [m for m in candidates if m not in left_out]
    search = full_space(base_recipe, candidates, device_type, tune_hparams, duration_scale, lr_factor)
    if allowed is not None and not candidates:
        reasons = "; ".join(f"{m}: {why}" for m, why in left_out.items())
        raise TuneInputError(f"methods: no method left to search ({reasons}); allow methods that fit the "
                             f"{spec.domain} task {task!r}, or pass methods=None for all of them")
    for name, why in left_out.items():
        log(f"left out {name}: {why}")
    out_dir = out.resolve()
    storage_text = storage_url(storage, out_dir)
    studies_spent = _spent_before(storage_text, study_name, n_workers)
    limit_s = parse_budget(trial_limit) if trial_limit is not None else budget_s / 5
    settings = {"device": device, "data_fraction": data_fraction, "eval_fraction": eval_fraction,
                "eval_interval": base_recipe.eval_interval}
    return TuneConfig(
        task=task, metric=metric, target=value, base=base_recipe.to_dict(),
        spaces={"baseline": baseline_space(duration_scale, lr_factor).to_dict(), "search": search.to_dict()},
        storage=storage_text, study_name=study_name, out_dir=str(out_dir),
        run_dir=str(Path(run_dir).resolve()) if run_dir else str(out_dir / "runs"), settings=settings,
        budget_s=budget_s, limit_s=limit_s, baseline_share=baseline_share, seeds_to_confirm=seeds_to_confirm,
        max_trials={"baseline": max_baseline_trials, "search": max_trials}, pruner=pruner,
        sampler_seed=sampler_seed, runner=runner_path(runner) if runner is not None else None,
        started_at=time.time(), spent_before_s=studies_spent, n_workers=n_workers, left_out=left_out)


def _spent_before(storage_text: str, study_name: str, n_workers: int) -> float:
    """Search time earlier calls used: the finished trials' durations over the workers that ran them."""
    optuna = _optuna()
    storage = open_storage(storage_text)
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)} if _has_studies(storage_text) else set()
    total = 0.0
    for name in (study_name, f"{study_name}-baseline", f"{study_name}-confirm"):
        if name not in names:
            continue
        for trial in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False):
            if trial.datetime_start and trial.datetime_complete:
                total += (trial.datetime_complete - trial.datetime_start).total_seconds()
    return total / max(1, n_workers)


def _has_studies(storage_text: str) -> bool:
    if "://" in storage_text and storage_text.startswith("sqlite:///"):
        return Path(storage_text[len("sqlite:///"):]).exists()
    return "://" in storage_text or Path(storage_text).exists()


def build_summary(config: TuneConfig, studies: dict) -> dict:
    """Everything the report shows, as data (summary.json)."""
    trials = []
    for phase in PHASES:
        for t in studies[phase].get_trials(deepcopy=False):
            if t.state.name == "WAITING":
                continue  # a starting point queued but never run
            trials.append({"phase": phase, "number": t.number, "state": t.state.name.lower(), "value": t.value,
                           "params": t.params, **{k: t.user_attrs.get(k) for k in (
                               "change", "time_to_target_s", "final", "train_s", "wall_s", "infeasible",
                               "stop_reason", "record", "start_from")},
                           "started": t.datetime_start.isoformat() if t.datetime_start else None})
    space = config.space("search")
    return {"task": config.task, "target": {"metric": config.metric, "value": config.target},
            "budget_s": config.budget_s, "spent_s": round(config.spent_s(), 1), "limit_s": config.limit_s,
            "settings": config.settings, "storage": config.storage, "study": config.study_name,
            "methods_searched": list(space.methods), "left_out": config.left_out,
            "trials": trials, "confirmation": summarize_confirmation(config, studies)}
