"""Confirmation: the tuned baseline, the search's winner and runner-up on fresh seeds, side by side.

A candidate is called the winner only after it reached the target on every confirmation seed; the
speed-up is the baseline's time over the winner's, seed by seed. Confirmation runs are trials of the
``<name>-confirm`` study, so a killed search does not repeat the ones that finished.
"""
from __future__ import annotations

import statistics

from speedkit.experiments.tune.objective import USER_STOP, resolve_runner, score_record
from speedkit.experiments.tune.search import TuneConfig, ranked, recipe_from_trial, store_outcome, trial_context
from speedkit.experiments.tune.space import describe_change
from speedkit.experiments.tune.storage import finished_trials, optuna_module, worker_id

CONFIRM_SEED_START = 1  # the search runs seed 0; confirmation uses fresh seeds, so the winner's luck does not count twice


def confirm_candidates(config: TuneConfig, studies: dict) -> list[tuple[str, str, object]]:
    """[(role, key, recipe)]: the tuned baseline, the winner and the runner-up of the search."""
    candidates = []
    baseline = ranked(studies["baseline"])[:1]
    if baseline:
        candidates.append(("baseline", f"baseline:{baseline[0].number}", recipe_from_trial(baseline[0], "baseline")))
    else:
        candidates.append(("baseline", "baseline:untuned", config.base_recipe()))
    reached = [t for t in _distinct_best(studies["search"], 2) if t.user_attrs.get("time_to_target_s") is not None]
    for role, trial in zip(("winner", "runner-up"), reached):  # a trial that missed the target cannot win
        candidates.append((role, f"search:{trial.number}", recipe_from_trial(trial, f"tune-{role}")))
    return candidates


def _distinct_best(study, count: int) -> list:
    """The best completed trials whose recipes differ (a re-run of the same settings is not a runner-up)."""
    chosen, seen = [], []
    for trial in ranked(study):
        recipe = {k: v for k, v in trial.user_attrs.get("recipe", {}).items() if k not in ("name", "summary")}
        if recipe and recipe not in seen:
            chosen.append(trial)
            seen.append(recipe)
        if len(chosen) == count:
            break
    return chosen


def run_confirmation(config: TuneConfig, studies: dict, runner=None, on_run=None, should_stop=None) -> list:
    """Each candidate on ``seeds_to_confirm`` fresh seeds, interleaved (A B C A B C ...); resumable."""
    confirm = studies["confirm"]
    done = _done(confirm)
    runner = runner or resolve_runner(config.runner)
    for seed in range(CONFIRM_SEED_START, CONFIRM_SEED_START + config.seeds_to_confirm):
        for role, key, recipe in confirm_candidates(config, studies):
            if (key, seed) in done or (should_stop and should_stop()):
                continue
            record = _confirm_run(config, confirm, runner, role, key, seed, recipe, should_stop)
            if record is not None and on_run is not None:
                on_run(record)
    return finished_trials(confirm, ("COMPLETE",))


def _done(confirm) -> set:
    return {(t.user_attrs.get("candidate"), t.user_attrs.get("seed")) for t in finished_trials(confirm, ("COMPLETE",))}


def run_name_for(config: TuneConfig, key: str, seed: int) -> str:
    return f"{config.study_name}-confirm-{key.replace(':', '-')}-s{seed}"


def _confirm_run(config: TuneConfig, confirm, runner, role: str, key: str, seed: int, recipe, should_stop,
                 ablation: dict | None = None):
    """One confirmation run as a trial of the confirm study; its RunRecord, or None if it failed or was stopped."""
    optuna = optuna_module()
    trial = confirm.ask()
    for attr, value in (("worker", worker_id()), ("candidate", key), ("role", role), ("seed", seed),
                        ("recipe", recipe.to_dict())):
        trial.set_user_attr(attr, value)
    context = trial_context(config, "confirm", recipe, seed, run_name_for(config, key, seed))
    context.stop_after_s = 2 * config.limit_s  # the recipe runs as shipped; this only bounds a runaway
    context.should_stop = should_stop
    if ablation is not None:
        context.extra_config["ablation"] = ablation  # what speedkit.experiments.compare.leave_one_out and the run board read
    try:
        record = runner(context)
    except Exception as e:
        trial.set_user_attr("error", f"{type(e).__name__}: {e}")
        confirm.tell(trial, state=optuna.trial.TrialState.FAIL)
        return None
    if context.stop_reason == USER_STOP:  # not a measurement: run again when the search continues
        confirm.tell(trial, state=optuna.trial.TrialState.FAIL)
        return None
    store_outcome(trial, record, config, record.timings.get("train_s", 0.0), context.stop_reason)
    confirm.tell(trial, score_record(record, config.metric, config.target, config.limit_s))
    return record


# -- the winner's leave-one-out ---------------------------------------------------------------------
def run_leave_one_out(config: TuneConfig, studies: dict, runner=None, should_stop=None) -> None:
    """The confirmed winner without each of its methods, on the first confirmation seed (beside its own run
    there), so the report can say what each method adds; resumable like the confirmation."""
    from speedkit.experiments.ablation import ablated_recipes, ablation_marker
    from speedkit.tasks.recipes import Recipe

    summary = summarize_confirmation(config, studies)
    winner = next((c for c in summary["candidates"] if c["key"] == summary["winner"]), None)
    if winner is None:
        return
    confirm, seed = studies["confirm"], CONFIRM_SEED_START
    done, runner = _done(confirm), runner or resolve_runner(config.runner)
    of = run_name_for(config, winner["key"], seed)
    for method, ablated in ablated_recipes(Recipe(**winner["recipe"])).items():  # its methods, each dropped
        key = f"loo:{winner['key']}:{method}"
        if (key, seed) in done or (should_stop and should_stop()):
            continue
        _confirm_run(config, confirm, runner, "leave-one-out", key, seed,
                     ablated.with_changes(name=f"tuned-without-{method}"), should_stop,
                     ablation=ablation_marker(of, method))


def summarize_leave_one_out(config: TuneConfig, studies: dict, winner: dict | None) -> dict:
    """{method: time without it, and time without / time with} on the first confirmation seed."""
    if winner is None or winner["times_s"][0] is None:
        return {}
    with_time = winner["times_s"][0]
    rows = {}
    for t in finished_trials(studies["confirm"], ("COMPLETE",)):
        key = str(t.user_attrs.get("candidate", ""))
        if key.startswith(f"loo:{winner['key']}:"):
            without = t.user_attrs.get("time_to_target_s")
            rows[key.rsplit(":", 1)[1]] = {"time_without_s": without,
                                           "slowdown": None if without is None else without / with_time}
    return rows


def summarize_confirmation(config: TuneConfig, studies: dict) -> dict:
    """Per candidate: seeds reached, times, median; the winner is the confirmed fastest, not the search's luckiest."""
    runs = finished_trials(studies["confirm"], ("COMPLETE",))
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
    judged = _judge(rows)
    winner = next((r for r in rows if r["key"] == judged["winner"]), None)
    return {"seeds": seeds, "candidates": rows, **judged,
            "leave_one_out": summarize_leave_one_out(config, studies, winner)}


def _judge(rows: list[dict]) -> dict:
    """The winner: the search candidate that reached the target on every seed with the lowest median time."""
    from speedkit.experiments.compare import paired_speedups

    baseline = next(r for r in rows if r["role"] == "baseline")
    contenders = [r for r in rows if r["role"] != "baseline" and r["median_s"] is not None]
    if not contenders:
        return {"winner": None, "speedups": None, "speedup_median": None}
    winner = min(contenders, key=lambda r: r["median_s"])
    pairs = paired_speedups(baseline["times_s"], winner["times_s"])
    present = [p for p in pairs if p is not None]
    return {"winner": winner["key"], "speedups": pairs,
            "speedup_median": statistics.median(present) if present else None}
