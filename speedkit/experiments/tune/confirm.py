"""Confirmation: the baselines, the search's winner and runner-up on fresh seeds, side by side, as trials of
the ``<name>-confirm`` study (a killed search does not repeat those that finished); what is confirmed and
judged how is in docs/guide.md ("Confirmed, within the budget").
"""
from __future__ import annotations

import statistics

from speedkit.experiments.ablation import leave_one_out_runs, leave_one_out_summary
from speedkit.experiments.compare import median_or_none
from speedkit.experiments.measure import Measurement, measure, shortest_budget
from speedkit.experiments.tune.objective import resolve_runner, score_record, train_and_store
from speedkit.experiments.tune.search import (TuneConfig, confirm_wall_s, confirmed_baselines, recipe_from_trial,
                                              seeds_that_fit, standings, trial_context)
from speedkit.experiments.tune.space import describe_change
from speedkit.experiments.tune.storage import finished_trials, optuna_module, worker_id
from speedkit.record.runs import json_safe

CONFIRM_SEED_START = 1  # the search runs seed 0; confirmation uses fresh seeds, so the winner's luck does not count twice
# (role, recipe name) of the baseline study's best trial and of the base as given (search.confirmed_baselines)
BASELINE_ROLES = (("baseline", "baseline"), ("baseline as given", "baseline-as-given"))
BASELINE_ROLE_NAMES = tuple(role for role, _ in BASELINE_ROLES)  # a confirmation row is a baseline's by its role
CONFIRM_SLACK = 0.1  # how far past the budget a planned confirmation seed may run
BUDGET_STEPS = (1.2, 1.44)  # the final budget search: a winner that missed a seed is rerun this much longer


def confirm_candidates(config: TuneConfig, studies: dict,
                       with_runner_up: bool | None = None) -> list[tuple[str, str, object]]:
    """[(role, key, recipe)]: the tuned baseline (and the base as given, where tuning changed it), the winner
    and (where the budget has room for it, or ``with_runner_up``) the runner-up of the search, then any longer
    budgets of the winner the final budget search tried."""
    from speedkit.tasks.recipes import Recipe

    candidates = [(role, f"baseline:{trial.number}", recipe_from_trial(trial, name)) for (role, name), trial in
                  zip(BASELINE_ROLES, confirmed_baselines(studies["baseline"]))]
    if not candidates:
        candidates.append(("baseline", "baseline:untuned", config.base_recipe()))
    if with_runner_up is None:
        with_runner_up = studies["confirm"].user_attrs.get("with_runner_up", True)
    count = 2 if with_runner_up else 1
    # ranked by their worst seed; a recipe that missed on a seed cannot win
    reached = [standing.first for standing in standings(studies["search"]) if standing.reached]
    for role, trial in list(zip(("winner", "runner-up"), reached))[:count]:
        candidates.append((role, f"search:{trial.number}", recipe_from_trial(trial, f"tune-{role}")))
    for stretched in studies["confirm"].user_attrs.get("stretched", []):
        candidates.append(("winner, longer", stretched["key"], Recipe(**stretched["recipe"])))
    return candidates


def plan_confirmation(config: TuneConfig, studies: dict, log=print) -> None:
    """Decide what the confirmation runs so that it ends within the search's budget (docs/guide.md, "Confirmed,
    within the budget"); a search continued with more budget may add the runner-up or seeds, never take back."""
    confirm = studies["confirm"]
    candidates = confirm_candidates(config, studies, with_runner_up=True)
    walls = [_trial_wall(config, studies, key) for _, key, _ in candidates]
    left = max(0.0, config.budget_s - config.spent_s())
    has_runner_up = any(role == "runner-up" for role, _, _ in candidates)
    with_runner_up = (not has_runner_up or config.settings.seeds_to_confirm * sum(walls) <= left
                      or bool(confirm.user_attrs.get("with_runner_up")))
    per_seed = sum(wall for (role, _, _), wall in zip(candidates, walls) if with_runner_up or role != "runner-up")
    # The search kept back whole seeds' time, but evaluation and set-up of its last trial eat a little of it:
    # a seed that fits within 10% still runs rather than leaving that reserve unspent.
    seeds = max(seeds_that_fit(config, per_seed, left * (1 + CONFIRM_SLACK)), int(confirm.user_attrs.get("seeds", 1)))
    confirm.set_user_attr("with_runner_up", with_runner_up)
    confirm.set_user_attr("seeds", seeds)
    if not with_runner_up:
        log(f"speedkit tune: confirming the baselines and the winner only: with the runner-up the "
            f"confirmation would take about {config.settings.seeds_to_confirm * sum(walls):.0f}s, and {left:.0f}s of the "
            f"budget is left")
    if seeds < config.settings.seeds_to_confirm:
        log(f"speedkit tune: confirming on {seeds} of the {config.settings.seeds_to_confirm} seeds asked for: each seed "
            f"takes about {per_seed:.0f}s and {left:.0f}s of the budget is left; a longer --budget confirms on more")


def confirm_seeds(config: TuneConfig, studies: dict) -> list[int]:
    """The fresh seeds of the confirmation: as many as ``plan_confirmation`` found room for."""
    count = int(studies["confirm"].user_attrs.get("seeds", config.settings.seeds_to_confirm))
    return list(range(CONFIRM_SEED_START, CONFIRM_SEED_START + count))


def _trial_wall(config: TuneConfig, studies: dict, key: str) -> float:
    """What one confirmation run of candidate ``key`` is expected to take (``search.confirm_wall_s``; the trial
    limit for a candidate no trial measured)."""
    phase, _, number = key.partition(":")
    if not number.isdigit():
        return config.limit_s
    return float(confirm_wall_s(studies[phase].trials[int(number)], config.limit_s, baseline=phase == "baseline"))


def run_confirmation(config: TuneConfig, studies: dict, runner=None, should_stop=None) -> list:
    """Each candidate on the confirmation's fresh seeds, interleaved (``speedkit.experiments.measure.measure``:
    the baselines, then the others, seed by seed); resumable: a run done before is not run again."""
    confirm = studies["confirm"]
    done = _done(confirm)
    runner = runner or resolve_runner(config.settings.runner)
    candidates = {key: (role, recipe) for role, key, recipe in confirm_candidates(config, studies)}

    def run(key: str, seed: int):
        if (key, seed) in done or (should_stop and should_stop()):
            return None
        role, recipe = candidates[key]
        return _confirm_run(config, confirm, runner, role, key, seed, recipe, should_stop)

    measure(list(candidates), [key for key, (role, _) in candidates.items() if role in BASELINE_ROLE_NAMES],
            confirm_seeds(config, studies), run)
    return finished_trials(confirm, ("COMPLETE",))


def _done(confirm) -> set:
    return {(t.user_attrs.get("candidate"), t.user_attrs.get("seed")) for t in finished_trials(confirm, ("COMPLETE",))}


def run_name_for(config: TuneConfig, key: str, seed: int) -> str:
    return f"{config.settings.study_name}-confirm-{key.replace(':', '-')}-s{seed}"


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
        # what speedkit.experiments.compare.leave_one_out and the run board read
        context.run = context.run.replace(extra_config={**context.run.extra_config, "ablation": ablation})
    try:
        record = train_and_store(trial, context, runner)
    except Exception as e:
        trial.set_user_attr("error", f"{type(e).__name__}: {e}")
        record = None
    if record is None:  # failed, or stopped by the user: not a measurement, run again when the search continues
        confirm.tell(trial, state=optuna.trial.TrialState.FAIL)
    else:
        confirm.tell(trial, score_record(record, config.metric, config.target, config.limit_s))
    return record


# -- the final budget search ------------------------------------------------------------------------
def run_budget_search(config: TuneConfig, studies: dict, runner=None, should_stop=None, log=print) -> None:
    """Where no candidate reached the target on every confirmation seed, rerun the fastest one that reached it
    on some with a longer budget (``BUDGET_STEPS``) on every seed, so that what is shipped reaches the target
    in each; resumable, and the longer budgets are candidates like the others."""
    from speedkit.experiments.measure import scaled_duration
    from speedkit.tasks.recipes import Recipe

    confirm = studies["confirm"]
    summary = summarize_confirmation(config, studies)
    if summary["winner"] is not None or (should_stop and should_stop()):
        return
    missed = [r for r in summary["candidates"] if r["role"] in ("winner", "runner-up") and r["seeds_reached"]]
    if not missed:
        return
    start = min(missed, key=lambda r: statistics.median([t for t in r["times_s"] if t is not None]))
    stretched = list(confirm.user_attrs.get("stretched", []))

    def all_reach(steps: int) -> bool:
        """Whether the winner, run ``BUDGET_STEPS[steps - 1]`` times longer, is confirmed (0: as it ran)."""
        if steps == 0:
            return False  # as it ran it missed a seed: that is why this search runs
        factor = BUDGET_STEPS[steps - 1]
        key = f"{start['key']}@x{factor:g}"
        if all(s["key"] != key for s in stretched):
            recipe = Recipe(**start["recipe"])
            recipe = recipe.with_changes(name=f"tune-winner-x{factor:g}",
                                         duration=scaled_duration(recipe.duration, factor))
            log(f"speedkit tune: {start['key']} reached the target on {start['seeds_reached']} of "
                f"{len(start['seeds'])} seeds; trying it with {factor:g}x its budget ({recipe.duration})")
            stretched.append({"key": key, "recipe": recipe.to_dict()})
            confirm.set_user_attr("stretched", stretched)
        run_confirmation(config, studies, runner=runner, should_stop=should_stop)
        return summarize_confirmation(config, studies)["winner"] is not None or bool(should_stop and should_stop())

    shortest_budget(all_reach, 0, len(BUDGET_STEPS), down=False)


# -- the winner's leave-one-out ---------------------------------------------------------------------
def run_leave_one_out(config: TuneConfig, studies: dict, runner=None, should_stop=None) -> None:
    """The confirmed winner without each of its methods, on the first confirmation seed (beside its own run
    there), so the report can say what each method adds; resumable like the confirmation."""
    from speedkit.tasks.recipes import Recipe

    summary = summarize_confirmation(config, studies)
    winner = next((c for c in summary["candidates"] if c["key"] == summary["winner"]), None)
    if winner is None:
        return
    confirm, seed = studies["confirm"], CONFIRM_SEED_START
    done, runner = _done(confirm), runner or resolve_runner(config.settings.runner)

    def run(method: str, ablated, marker: dict) -> None:  # its methods, each dropped
        key = f"loo:{winner['key']}:{method}"
        if (key, seed) not in done and not (should_stop and should_stop()):
            _confirm_run(config, confirm, runner, "leave-one-out", key, seed,
                         ablated.with_changes(name=f"tuned-without-{method}"), should_stop, ablation=marker)

    leave_one_out_runs(Recipe(**winner["recipe"]), run, of=run_name_for(config, winner["key"], seed))


def summarize_leave_one_out(config: TuneConfig, winner: dict | None, baseline: dict | None, runs: list) -> dict:
    """The winner without each of its methods on the first confirmation seed, as the benchmark's leave-one-out
    table (``ablation.leave_one_out_summary``; shares of its speed-up over ``baseline`` on that seed), held as
    summary.json holds it (a method without which the winner never reached the target: null, not infinity)."""
    if winner is None or winner["times_s"][0] is None:
        return {}
    rows = {str(t.user_attrs["candidate"]).rsplit(":", 1)[1]: {
        "run": run_name_for(config, t.user_attrs["candidate"], t.user_attrs["seed"]),
        "time_without_s": t.user_attrs.get("time_to_target_s"), "final_metric": t.user_attrs.get("final")}
        for t in runs if str(t.user_attrs.get("candidate", "")).startswith(f"loo:{winner['key']}:")}
    seed = winner["seeds"][0]
    return json_safe(leave_one_out_summary(
        run_name_for(config, winner["key"], seed), winner["times_s"][0], winner["finals"][0], rows,
        baseline["times_s"][0] if baseline else None, recipe=winner["recipe"]["name"], seed=seed,
        reference_rerun=False))


def summarize_confirmation(config: TuneConfig, studies: dict) -> dict:
    """Per candidate: seeds reached, times, median; the winner is the confirmed fastest, not the search's luckiest."""
    runs = finished_trials(studies["confirm"], ("COMPLETE",))
    seeds = confirm_seeds(config, studies)
    rows = []
    for role, key, recipe in confirm_candidates(config, studies):
        by_seed = {t.user_attrs["seed"]: t.user_attrs for t in runs if t.user_attrs.get("candidate") == key}
        times = [by_seed.get(s, {}).get("time_to_target_s") for s in seeds]
        finals = [by_seed.get(s, {}).get("final") for s in seeds]
        reached = sum(t is not None for t in times)
        rows.append({"role": role, "key": key, "recipe": recipe.to_dict(), "seeds": seeds, "times_s": times,
                     "finals": finals, "seeds_reached": reached,
                     "median_s": statistics.median(times) if reached == len(seeds) else None,
                     "median_final": median_or_none(finals),
                     "change": describe_change(recipe, config.base_recipe())})
    judged = _judge(rows, config.metric)
    winner, baseline = (next((r for r in rows if r["key"] == judged[role]), None) for role in ("winner", "baseline"))
    return {"seeds": seeds, "candidates": rows, **judged,
            "leave_one_out": summarize_leave_one_out(config, winner, baseline, runs)}


def _measured(rows: list[dict]) -> Measurement:
    """The confirmation's rows as the ``Measurement`` they record (keyed by candidate)."""
    return Measurement.read_back({r["key"]: r["times_s"] for r in rows}, {r["key"]: r["finals"] for r in rows},
                                 [r["key"] for r in rows if r["role"] in BASELINE_ROLE_NAMES], rows[0].get("seeds", ()))


def _judge(rows: list[dict], metric: str | None = None) -> dict:
    """The winner: the search candidate that reached the target on every seed with the lowest median time (the
    first given on a tie: no metric breaks it), and its speed-up over the stronger baseline, seed by seed."""
    measured = _measured(rows)
    baseline = measured.strongest_baseline(metric)
    winner = measured.fastest([r["key"] for r in rows if r["key"] in measured.recipes and r["median_s"] is not None])
    if winner is None:
        return {"winner": None, "baseline": baseline, "speedups": None, "speedup_median": None}
    return {"winner": winner, "baseline": baseline, "speedups": measured.ratios(winner, baseline),
            "speedup_median": measured.median_ratio(winner, baseline)}
