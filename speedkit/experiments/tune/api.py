"""``tune(TuneSettings(...))``: a measured search (Optuna) for the recipe that reaches a task's target soonest.

How it tunes the baseline, searches, confirms on fresh seeds, resumes and shares a study between processes is
in docs/guide.md ("Tune: search for the fastest recipe"). Every run also writes a RunRecord into ``run_dir``.
"""
from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path
from typing import Any

from speedkit.experiments.tune.confirm import (confirm_candidates, confirm_seeds, confirmation_walls,
                                               plan_confirmation, run_budget_search, run_confirmation,
                                               run_leave_one_out, summarize_confirmation)
from speedkit.experiments.tune.objective import resolve_runner, runner_path
from speedkit.experiments.tune.search import (PRUNERS, SEARCH_SEED, TuneConfig, TuneSettings, baseline_plan_state,
                                              baseline_runs, check_same_search, load_study, logged_metrics,
                                              parse_budget, refused_methods, resolve_target, run_phases, search_limits,
                                              standings, start_workers)
from speedkit.experiments.tune.space import (TuneInputError, candidate_methods, describe_limit,
                                             fit_hparams_to_model, full_space, probe_surgery, resolve_methods)
from speedkit.experiments.tune.storage import (ANSWER_LOCK, BASELINE_LOCK, FolderLock, fail_dead_trials, open_storage,
                                               optuna_module, spent_before_s, storage_url, update_plan,
                                               wait_for_running_trials)


@dataclasses.dataclass
class TuneResult:
    """What a search found; ``summary`` holds every trial and the confirmation, as in ``summary.json``."""

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


def tune(settings: TuneSettings | None = None, *, log=print, on_trial=None, on_run=None, should_stop=None,
         **keywords) -> TuneResult:
    """Search for the recipe that reaches the target on the task soonest, within the budget of wall clock
    (``TuneSettings`` says what; default: ``TuneSettings()``).

    ``on_trial(study, trial)`` is called after each search trial of this process, ``on_run(record)`` after each run
    it trains (the baseline plan's, the trials', the confirmation's) with its RunRecord; ``should_stop()`` ends the
    search early.
    Writes ``recipe.yaml`` (the confirmed winner, with ``reached``), ``report.md``, ``report.html`` and
    ``summary.json`` into ``out_dir``, and a RunRecord per run into ``run_dir``.
    """
    if keywords or not isinstance(settings, (TuneSettings, type(None))):
        got = [f"{k}=" for k in keywords] or type(settings).__name__
        raise TypeError(f"tune() takes one TuneSettings (from speedkit.experiments.tune), got {got}: write "
                        f"tune(TuneSettings(task=..., budget=..., ...))")
    settings = settings or TuneSettings()
    optuna_module()
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(settings, out, log)
    in_process = resolve_runner(settings.runner)  # a lambda in a notebook works here; workers import it by name
    if on_run is not None:
        in_process = _reporting(in_process, on_run)
    config_path = out / "tune_config.json"
    config.save(config_path)
    storage_obj = open_storage(config.settings.storage)
    study = load_study(config, 0, storage_obj)
    check_same_search(config, study)
    retried = fail_dead_trials(study, storage_obj, out)
    if retried:
        log(f"{study.study_name}: trials {retried} were cut short by a dead worker; marked failed, settings re-queued")
    log(f"speedkit tune: {config.settings.run.task}, target {config.metric} {config.target}, "
        f"budget {config.budget_s:.0f}s "
        f"({config.spent_before_s:.0f}s used before), storage {config.settings.storage}")
    workers = start_workers(config_path, settings.n_workers - 1) if settings.n_workers > 1 else []
    try:
        run_phases(config, 0, runner=in_process, on_trial=_logger(log, on_trial), should_stop=should_stop, log=log)
    finally:
        for process in workers:
            process.wait()
    with FolderLock(out, ANSWER_LOCK):  # one process decides, confirms and writes; the next reads the same
        return _confirm_and_report(config, study, storage_obj, out, in_process, log, should_stop)


def _confirm_and_report(config, study, storage_obj, out, in_process, log, should_stop) -> TuneResult:
    from speedkit.experiments.report import baseline_shortfall, write_outputs

    if not (should_stop and should_stop()):  # the search ended (not stopped): no process starts a trial of it now
        update_plan(study, closed_for=search_limits(config))
    with FolderLock(out, BASELINE_LOCK):  # a process still tuning the baseline (another command's) ends its run
        pass
    wait_for_running_trials(study, storage_obj, should_stop, out_dir=out)
    plan_confirmation(config, study, log=log)
    log(f"speedkit tune: confirming {', '.join(role for role, _, _ in confirm_candidates(config, study))} on "
        f"seeds {confirm_seeds(config, study)}")
    run_confirmation(config, study, runner=in_process, should_stop=should_stop, log=log)
    run_budget_search(config, study, runner=in_process, should_stop=should_stop, log=log)
    if config.settings.leave_one_out:
        log("speedkit tune: the winner's leave-one-out (each part of its lead over the reference baseline put back, "
            "on the first seed)")
        run_leave_one_out(config, study, runner=in_process, should_stop=should_stop, log=log)
    summary = build_summary(config, study)
    paths = write_outputs(config, summary)
    shortfall = baseline_shortfall(summary)
    if shortfall:
        log(f"speedkit tune: {shortfall}")
    log(f"speedkit tune: done; report {paths['report']}")
    return TuneResult(recipe=paths.get("recipe_obj"), recipe_path=paths.get("recipe"), report_path=paths["report"],
                      html_path=paths.get("html"), summary=summary, out_dir=out, storage=config.settings.storage,
                      study_name=config.settings.study_name)


def _reporting(runner, on_run):
    """``runner``, handing each finished run's record to ``on_run``."""
    def run(context):
        record = runner(context)
        if record is not None:
            on_run(record)
        return record
    return run


def _logger(log, on_trial):
    from speedkit.experiments.report import proposal

    def callback(study, trial):
        attrs = trial.user_attrs
        reached = attrs.get("time_to_target_s")
        what = (attrs.get("infeasible") or (f"reached at {reached:.1f}s" if reached is not None else
                                            f"missed (best {attrs.get('final')})"))
        origin = f" [{proposal({**attrs, 'seed': attrs.get('seed', SEARCH_SEED)})}]"
        log(f"  {study.study_name} #{trial.number} {trial.state.name.lower()}{origin}: {attrs.get('change', '')} "
            f"-> {what}")
        if on_trial is not None:
            on_trial(study, trial)
    return callback


def build_config(settings: TuneSettings, out: Path, log=print) -> TuneConfig:
    """Check every argument and read the search space from the cards; refusals name the argument."""
    from speedkit.core.devices import resolve_device, resolve_precision
    from speedkit.tasks import get_recipe, resolve_task
    from speedkit.tasks.ladder import reference_leave_one_out
    from speedkit.tasks.recipes import timing_eval_interval, without_flips
    from speedkit.tasks.task import BUILT_IN

    s, run = settings, settings.run  # run: the RunRequest every run starts from, checked when it was made
    # a name, a Task, "pkg.mod:attr" or a folder: registered, so that the trials find it by name
    spec = resolve_task(run.task, run.data, **(run.task_options or {}))
    task_source = _task_source(run.task, run.data, run.task_options)
    if s.n_workers > 1 and task_source is None and spec.name not in BUILT_IN:
        raise TuneInputError(f"n_workers={s.n_workers}: worker processes cannot build task {spec.name!r}, a Task "
                             f"object made in this process; give it as 'package.module:attr' (--task mod:attr) "
                             f"or as a folder task with data=, or tune it with n_workers=1")
    task = spec.name
    budget_s = parse_budget(s.budget)
    metric, value = resolve_target(spec, s.target)
    if s.n_workers < 1:
        raise TuneInputError(f"n_workers must be at least 1, got {s.n_workers}")
    if s.seeds_to_confirm < 1:
        raise TuneInputError(f"seeds_to_confirm must be at least 1, got {s.seeds_to_confirm}")
    for name, count in (("max_trials", s.max_trials), ("max_baseline_trials", s.max_baseline_trials)):
        if count is not None and count < 1:
            raise TuneInputError(f"{name} must be at least 1 (or None: until the budget is used), got {count}")
    if not 0 < s.baseline_share < 1:
        raise TuneInputError(f"baseline_share is the part of the budget that tunes the baseline, in (0, 1); "
                             f"got {s.baseline_share}")
    if s.pruner not in PRUNERS:
        raise TuneInputError(f"pruner must be one of {', '.join(PRUNERS)}, got {s.pruner!r}")
    runner = runner_path(s.runner)
    if s.n_workers > 1 and s.runner is not None and runner is None:
        raise TuneInputError("runner must be importable ('module:function', or a module-level function) when "
                             "n_workers > 1: worker processes import it")
    allowed = resolve_methods(s.searched_methods)
    # the search's recipes are its own: a method of theirs that finds nothing is refused, not quietly dropped
    base = dataclasses.replace(get_recipe(task, spec.baselines[-1] if s.base is None else s.base), adopted_from=None)
    if not spec.flips_keep_labels:  # the base as its runs train it, so the search never samples a flip back
        base, removed = without_flips(base)
        for what in removed:
            log(f"left out the base's {what}: a horizontal flip changes this task's labels")
    device = resolve_device(run.device)
    # "auto" precision made concrete, so the base is a point of the space (whose choices are fp32/bf16/fp16)
    base = base.with_changes(precision=resolve_precision(base.precision, device))
    # every run of the search (and the recipe it ships) evaluates at one cadence, fine enough to rank by
    base = base.with_changes(eval_interval=run.eval_interval or timing_eval_interval(base))
    probe = base.with_changes(loader="memory")  # the probes need the model and evaluators, not a DataLoader
    known = logged_metrics(task, probe, run.device, run.data_fraction, run.eval_fraction)
    if metric not in known:
        raise TuneInputError(f"target metric {metric!r} is not logged by any evaluator of task {task!r}; "
                             f"it logs {', '.join(known)}")
    candidates, left_out = candidate_methods(spec.domain, allowed, device.type, spec.flips_keep_labels)
    left_out.update(probe_surgery(task, probe, candidates, run.device))
    candidates = [m for m in candidates if m not in left_out]
    limits = fit_hparams_to_model(task, probe, candidates, run.device) if s.tune_hparams else {}
    search = full_space(base, candidates, device.type, s.tune_hparams, s.duration_scale_range, s.lr_factor, limits,
                        spec.flips_keep_labels)
    if allowed is not None and not candidates:
        reasons = "; ".join(f"{m}: {why}" for m, why in left_out.items())
        raise TuneInputError(f"methods: no method left to search ({reasons}); allow methods that fit the "
                             f"{spec.domain} task {task!r}, or pass searched_methods=None for all of them")
    for name, why in left_out.items():
        log(f"left out {name}: {why}")
    for key, limit in limits.items():
        log(f"searched {key} only {describe_limit(limit)}: elsewhere in its card's range it finds nothing in "
            f"this model")
    out_dir = out.resolve()
    storage = storage_url(s.storage, out_dir)
    # the settings as every worker reads them (JSON): objects by their names, folders and storage resolved
    concrete = s.replace(
        task=task, data=None if run.data is None else str(Path(run.data).resolve()), searched_methods=allowed,
        base=s.base if s.base is None or isinstance(s.base, str) else base.name, storage=storage,
        out_dir=str(out_dir), run_dir=str(Path(run.run_dir).resolve()) if run.run_dir else str(out_dir / "runs"),
        eval_interval=base.eval_interval, runner=runner,
        duration_scale_range=tuple(s.duration_scale_range))
    return TuneConfig(
        settings=concrete, metric=metric, target=value, base=base.to_dict(), space=search.to_dict(), budget_s=budget_s,
        limit_s=parse_budget(s.trial_limit, "trial_limit") if s.trial_limit is not None else budget_s / 5,
        started_at=time.time(), spent_before_s=spent_before_s(storage, s.study_name), left_out=left_out,
        task_source=task_source, move_prior=reference_leave_one_out(spec.domain))


def _task_source(task, data, task_options) -> dict | None:
    """How a worker process builds the task again (None: a built-in, or a Task object it cannot rebuild)."""
    if not isinstance(task, str) or (data is None and not task_options and ":" not in task):
        return None
    return {"task": task, "data": None if data is None else str(Path(data).resolve()),
            "options": dict(task_options or {})}


TRIAL_FIELDS = ("change", "time_to_target_s", "final", "train_s", "wall_s", "budget_done", "stop_reason", "record",
                "start_from", "plan", "move", "repeat_of")


def build_summary(config: TuneConfig, study) -> dict:
    """Everything the report shows, as data (summary.json): the baseline plan's runs and the search's trials
    alike, then the confirmation."""
    plan_runs = baseline_runs(config, study)
    trials = [{"phase": "baseline", "number": run.number, "state": "pruned" if run.attrs["failed"] else "complete",
               "value": run.attrs["score"],
               "params": {"lr": run.point.lr, "schedule": run.point.schedule, "duration": run.point.budget},
               **{k: run.attrs.get(k) for k in TRIAL_FIELDS}, "infeasible": run.attrs["failed"],
               "seed": run.point.seed, "worst_seed": None if run.attrs["failed"] else {
                   "value": run.attrs["score"], "runs": [run.number]},
               "started": datetime.datetime.fromtimestamp(run.attrs["started"]).isoformat()}
              for run in plan_runs]
    ranking = {s.first.number: s for s in standings(study)}
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "WAITING":
            continue  # a starting point queued but never run
        trials.append({"phase": "search", "number": t.number, "state": t.state.name.lower(), "value": t.value,
                       "params": t.params, **{k: t.user_attrs.get(k) for k in (*TRIAL_FIELDS, "infeasible")},
                       "seed": t.user_attrs.get("seed", SEARCH_SEED), "worst_seed": _worst_seed(ranking.get(t.number)),
                       "started": t.datetime_start.isoformat() if t.datetime_start else None})
    space = config.search_space()
    return {"task": config.settings.run.task, "target": {"metric": config.metric, "value": config.target},
            "base": config.base, "budget_s": config.budget_s, "spent_s": round(config.spent_s(), 1),
            "limit_s": config.limit_s,
            "settings": config.run_settings(), "storage": config.settings.storage, "study": config.settings.study_name,
            "methods_searched": list(space.methods), "hparam_limits": dict(space.hparam_limits),
            "left_out": {**config.left_out, **{m: f"found nothing to act on in a trial, so no longer tried: {why}"
                                               for m, why in refused_methods(study).items()}},
            "trials": trials, "baseline_plan": baseline_plan_state(config, plan_runs),
            "confirmation": summarize_confirmation(config, study),
            "time": where_the_time_went(config, study, trials)}


def _worst_seed(standing) -> dict | None:
    """How the search ranks a recipe, on its first trial: its worst objective over its seeds (None: a miss on a
    seed that was pruned) and the trials that ran it."""
    if standing is None:
        return None
    return {"value": None if standing.score == float("inf") else standing.score,
            "runs": [t.number for t in standing.runs]}


def where_the_time_went(config: TuneConfig, study, trials: list[dict]) -> dict:
    """Seconds of the search by what they bought: tuning the baseline,
    search trials that reached the target, missed it or were pruned, proposals refused untrained, the
    confirmation (with the final budget search and the leave-one-out), and the rest (building data and models,
    the probes, the storage, a worker waiting). With several workers they add up to the workers' seconds
    (``worker_s``), not to the wall clock."""
    def wall(rows) -> float:
        return round(sum(r.get("wall_s") or 0.0 for r in rows), 1)

    search = [t for t in trials if t["phase"] == "search"]
    kinds = {"reached": [t for t in search if t["state"] == "complete" and t["time_to_target_s"] is not None],
             "missed": [t for t in search if t["state"] == "complete" and t["time_to_target_s"] is None],
             "pruned": [t for t in search if t["state"] == "pruned" and not t["infeasible"]],
             "refused": [t for t in search if t["infeasible"]]}
    confirm = [{"wall_s": wall} for wall in confirmation_walls(study)]
    groups = {"baseline plan": [t for t in trials if t["phase"] == "baseline"],
              **{f"search: {kind}": rows for kind, rows in kinds.items()}, "confirmation": confirm}
    rows = {what: wall(group) for what, group in groups.items()}
    counts = {what: len(group) for what, group in groups.items()}
    # n workers spend n seconds of runs in each second of wall clock: the shares are of that
    spent, workers = config.spent_s(), config.settings.n_workers
    rows["set-up and the rest"] = round(max(0.0, spent * workers - sum(rows.values())), 1)
    return {"spent_s": round(spent, 1), "workers": workers, "worker_s": round(spent * workers, 1), "seconds": rows,
            "runs": counts}
