"""Confirmation: the baselines, the search's winner and runner-up on fresh seeds, side by side, as measured runs.

Optuna proposes and ranks on the search's seed; what a recipe is worth is measured here, as a benchmark measures
(``measure.measure``, interleaved by seed), and kept where a benchmark keeps its runs: each confirmation run is a
RunRecord in the search's run folder, marked with its candidate and the recipe it was asked to run. A killed or
continued search runs only what is not there yet (``measure.finished_runs``, the benchmark's resume). What the
confirmation decided (its seeds, whether the runner-up fits, the longer budgets it tried, and which runs finished
as measurements, by run id, with their spans) is kept with the search study (``storage.read_plan``). What is
confirmed and judged how is in docs/guide.md ("Confirmed, within the budget").
"""
from __future__ import annotations

import datetime
import time

from speedkit.core.time import scaled_duration
from speedkit.experiments.ablation import (ablated_recipes, as_run_on, leave_one_out_rows, leave_one_out_runs,
                                           leave_one_out_summary, seed_to_ablate)
from speedkit.experiments.measure import Measurement, finished_runs, measure, shortest_budget
from speedkit.experiments.summary import judge, recipe_entry, sittings
from speedkit.experiments.tune.objective import USER_STOP, resolve_runner
from speedkit.experiments.tune.search import (TuneConfig, baseline_runs, confirm_wall_s, confirmed_baselines,
                                              plan_recipe, recipe_from_trial, seeds_that_fit, standings,
                                              trial_context)
from speedkit.experiments.tune.space import describe_change
from speedkit.experiments.tune.storage import read_plan, update_plan
from speedkit.record.runs import RunRecord, json_safe
from speedkit.tasks.recipes import Recipe

CONFIRM_SEED_START = 1  # the search runs seed 0; confirmation uses fresh seeds, so the winner's luck does not count twice
# (role, recipe name) of the baseline plan's answer and of the base as given (search.confirmed_baselines)
BASELINE_ROLES = (("baseline", "baseline"), ("baseline as given", "baseline-as-given"))
BASELINE_ROLE_NAMES = tuple(role for role, _ in BASELINE_ROLES)  # a confirmation row is a baseline's by its role
UNRECORDED = "before sittings were recorded"  # a confirmation run of a search made before they were
CONFIRM_SLACK = 0.1  # how far past the budget a planned confirmation seed may run
BUDGET_STEPS = (1.2, 1.44)  # the final budget search: a winner that missed a seed is rerun this much longer


def confirm_candidates(config: TuneConfig, study, with_runner_up: bool | None = None) -> list[tuple[str, str, Recipe]]:
    """[(role, key, recipe)]: the tuned baseline (and the base as given, where tuning changed it), the winner
    and (where the budget has room for it, or ``with_runner_up``) the runner-up of the search, then any longer
    budgets of the winner the final budget search tried."""
    plan = read_plan(study)
    candidates = [(role, f"baseline:{run.number}", plan_recipe(config, run.point, name)) for (role, name), run in
                  zip(BASELINE_ROLES, confirmed_baselines(config, baseline_runs(config, study)))]
    if not candidates:
        candidates.append(("baseline", "baseline:untuned", config.base_recipe()))
    count = 2 if (plan.get("with_runner_up", True) if with_runner_up is None else with_runner_up) else 1
    # ranked by their worst seed; a recipe that missed on a seed cannot win
    reached = [standing.first for standing in standings(study) if standing.reached]
    for role, trial in list(zip(("winner", "runner-up"), reached))[:count]:
        candidates.append((role, f"search:{trial.number}", recipe_from_trial(trial, f"tune-{role}")))
    for stretched in plan.get("stretched", []):
        candidates.append(("winner, longer", stretched["key"], Recipe(**stretched["recipe"])))
    return candidates


def plan_confirmation(config: TuneConfig, study, log=print) -> None:
    """Decide what the confirmation runs so that it ends within the search's budget (docs/guide.md, "Confirmed,
    within the budget"); a search continued with more budget may add the runner-up or seeds, never take back."""
    plan = read_plan(study)
    candidates = confirm_candidates(config, study, with_runner_up=True)
    walls = [_trial_wall(config, study, key) for _, key, _ in candidates]
    left = max(0.0, config.budget_s - config.spent_s())
    has_runner_up = any(role == "runner-up" for role, _, _ in candidates)
    with_runner_up = (not has_runner_up or config.settings.seeds_to_confirm * sum(walls) <= left
                      or bool(plan.get("with_runner_up")))
    per_seed = sum(wall for (role, _, _), wall in zip(candidates, walls) if with_runner_up or role != "runner-up")
    # The search kept back whole seeds' time, but evaluation and set-up of its last trial eat a little of it:
    # a seed that fits within 10% still runs rather than leaving that reserve unspent.
    seeds = max(seeds_that_fit(config, per_seed, left * (1 + CONFIRM_SLACK)), int(plan.get("seeds", 1)))
    update_plan(study, with_runner_up=with_runner_up, seeds=seeds)
    if not with_runner_up:
        log(f"speedkit tune: confirming the baselines and the winner only: with the runner-up the "
            f"confirmation would take about {config.settings.seeds_to_confirm * sum(walls):.0f}s, and {left:.0f}s of the "
            f"budget is left")
    if seeds < config.settings.seeds_to_confirm:
        log(f"speedkit tune: confirming on {seeds} of the {config.settings.seeds_to_confirm} seeds asked for: each seed "
            f"takes about {per_seed:.0f}s and {left:.0f}s of the budget is left; a longer --budget confirms on more")


def confirm_seeds(config: TuneConfig, study) -> list[int]:
    """The fresh seeds of the confirmation: as many as ``plan_confirmation`` found room for."""
    count = int(read_plan(study).get("seeds", config.settings.seeds_to_confirm))
    return list(range(CONFIRM_SEED_START, CONFIRM_SEED_START + count))


def _trial_wall(config: TuneConfig, study, key: str) -> float:
    """What one confirmation run of candidate ``key`` is expected to take (``search.confirm_wall_s``; the trial
    limit for a candidate no trial measured)."""
    phase, _, number = key.partition(":")
    if not number.isdigit():
        return config.limit_s
    if phase == "baseline":
        run = next(run for run in baseline_runs(config, study) if run.number == int(number))
        return float(confirm_wall_s(run.attrs, config.limit_s))
    return float(confirm_wall_s(study.trials[int(number)].user_attrs, config.limit_s, baseline=False))


# -- the runs, in the run folder ----------------------------------------------------------------------------------
def confirmed_runs(run_dir, measured: set[str]) -> dict[tuple[str, int], RunRecord]:
    """``{(candidate key, seed): its finished confirmation run}`` in the run folder (``measure.finished_runs``),
    among the runs whose ids the search's plan lists as ``measured``: those are this search's, and a run stopped,
    failed or cut short by a kill is not listed, so it runs again."""
    def key(record: RunRecord) -> tuple | None:
        tune = record.config.get("tune") or {}
        if tune.get("phase") != "confirm" or record.run_id not in measured:
            return None
        return tune.get("candidate"), record.config.get("seed")

    return finished_runs(run_dir, key)


def _confirmed(config: TuneConfig, study, candidates=None) -> dict[tuple[str, int], RunRecord]:
    """This search's finished confirmation runs; with ``candidates`` ({key: recipe}), only those that ran that
    recipe (a candidate's key names a trial, and a study started anew numbers its trials anew)."""
    measured = {run["run"] for run in read_plan(study).get("measured", [])}
    runs = confirmed_runs(config.settings.run.run_dir, measured)
    if candidates is None:
        return runs
    return {(key, seed): run for (key, seed), run in runs.items()
            if key in candidates and _unnamed(run.config["tune"].get("recipe")) == _unnamed(candidates[key].to_dict())}


def _unnamed(recipe: dict | None) -> dict | None:
    """A recipe as compared between runs: a candidate's name says its role, which can change as the search goes on."""
    return None if recipe is None else {**recipe, "name": None}


def run_confirmation(config: TuneConfig, study, runner=None, should_stop=None, log=print) -> Measurement:
    """Each candidate on the confirmation's fresh seeds, interleaved (``speedkit.experiments.measure.measure``:
    the baselines, then the others, seed by seed); a run found finished in the run folder is taken as it is."""
    candidates = {key: (role, recipe) for role, key, recipe in confirm_candidates(config, study)}
    done = _confirmed(config, study, {key: recipe for key, (_, recipe) in candidates.items()})
    runner = runner or resolve_runner(config.settings.runner)

    def run(key: str, seed: int) -> RunRecord | None:
        if (key, seed) in done or (should_stop and should_stop()):
            return done.get((key, seed))
        role, recipe = candidates[key]
        return _confirm_run(config, study, runner, role, key, seed, recipe, should_stop, log)

    return measure(list(candidates), [key for key, (role, _) in candidates.items() if role in BASELINE_ROLE_NAMES],
                   confirm_seeds(config, study), run)


def run_name_for(config: TuneConfig, key: str, seed: int) -> str:
    return f"{config.settings.study_name}-confirm-{key.replace(':', '-')}-s{seed}"


def _confirm_run(config: TuneConfig, study, runner, role: str, key: str, seed: int, recipe, should_stop,
                 log=print, ablation: dict | None = None) -> RunRecord | None:
    """One confirmation run, its record marked with its candidate; None where it failed or was stopped (no
    measurement: it runs again when the search continues). The plan lists it, with its span (search time spent)."""
    context = trial_context(config, "confirm", recipe, seed, run_name_for(config, key, seed))
    context.stop_after_s = 2 * config.limit_s  # the recipe runs as shipped; this only bounds a runaway
    context.should_stop = should_stop
    extra = context.run.extra_config
    context.run = context.run.replace(extra_config={
        **extra, "tune": {**extra["tune"], "candidate": key, "role": role, "recipe": recipe.to_dict(),
                          "sitting": sitting_label(config.started_at)},
        # what speedkit.experiments.compare.leave_one_out and the run board read
        **({"ablation": ablation} if ablation is not None else {})})
    started = time.time()
    try:
        record = runner(context)
    except Exception as e:  # one candidate that cannot run must not cost the others
        log(f"speedkit tune: confirmation run {context.run.run_name} failed: {type(e).__name__}: {e}")
        return None
    if context.stop_reason == USER_STOP:
        return None
    measured = read_plan(study).get("measured", [])
    update_plan(study, measured=[*measured, {"run": record.run_id, "span": [started, time.time()]}])
    return record


# -- the final budget search ------------------------------------------------------------------------
def run_budget_search(config: TuneConfig, study, runner=None, should_stop=None, log=print) -> None:
    """Where no candidate reached the target on every confirmation seed, rerun the fastest one that reached it
    on some with a longer budget (``BUDGET_STEPS``) on every seed, so that what is shipped reaches the target
    in each; resumable, and the longer budgets are candidates like the others."""
    summary = summarize_confirmation(config, study)
    if summary["best_recipe"] is not None or (should_stop and should_stop()):
        return
    missed = {key: r for key, r in summary["recipes"].items() if r["role"] in ("winner", "runner-up") and r["reached"]}
    if not missed:
        return
    start_key = min(missed, key=lambda key: missed[key]["median_time_to_target_s"])
    start = missed[start_key]

    def all_reach(steps: int) -> bool:
        """Whether the winner, run ``BUDGET_STEPS[steps - 1]`` times longer, is confirmed (0: as it ran)."""
        if steps == 0:
            return False  # as it ran it missed a seed: that is why this search runs
        factor = BUDGET_STEPS[steps - 1]
        key, stretched = f"{start_key}@x{factor:g}", read_plan(study).get("stretched", [])
        if all(s["key"] != key for s in stretched):
            recipe = Recipe(**start["recipe"])
            recipe = recipe.with_changes(name=f"tune-winner-x{factor:g}",
                                         duration=scaled_duration(recipe.duration, factor))
            log(f"speedkit tune: {start_key} reached the target on {start['reached']} of "
                f"{len(summary['seeds'])} seeds; trying it with {factor:g}x its budget ({recipe.duration})")
            update_plan(study, stretched=[*stretched, {"key": key, "recipe": recipe.to_dict()}])
        run_confirmation(config, study, runner=runner, should_stop=should_stop, log=log)
        return (summarize_confirmation(config, study)["best_recipe"] is not None
                or bool(should_stop and should_stop()))

    shortest_budget(all_reach, 0, len(BUDGET_STEPS), down=False)


# -- the winner's leave-one-out ---------------------------------------------------------------------
def run_leave_one_out(config: TuneConfig, study, runner=None, should_stop=None, log=print) -> None:
    """The confirmed winner with each part of its difference from the strongest confirmed baseline given that
    baseline's value (``ablation.py``, as the benchmark's leave-one-out: a method dropped, or the budget, rate,
    batch size ... put back), on one confirmation seed (``_seed_to_ablate``), beside its own run there, so the
    report can say what each part adds to the speed-up over that baseline; resumable like the confirmation."""
    summary = summarize_confirmation(config, study)
    winner = summary["best_recipe"]
    if winner is None:
        return
    seed, runner = _seed_to_ablate(summary, winner), runner or resolve_runner(config.settings.runner)
    recipe, reference = _winner_and_reference(config, summary)
    ablated = _ablated(winner, recipe, reference)
    # one read of the run folder: the ablations already run, and the winner's own run they take apart
    done = _confirmed(config, study, {**ablated, winner: Recipe(**summary["recipes"][winner]["recipe"])})
    full = done.get((winner, seed))

    def run(part: str, _, marker: dict) -> None:
        key = f"loo:{winner}:{part}"
        if (key, seed) not in done and not (should_stop and should_stop()):
            _confirm_run(config, study, runner, "leave-one-out", key, seed, ablated[key], should_stop, log,
                         ablation=marker)

    leave_one_out_runs(recipe, run, of=run_name_for(config, winner, seed), reference=reference,
                       against=reference.name, of_run=full.run_id if full else None)


def _seed_to_ablate(confirmation: dict, winner_key: str) -> int:
    """The confirmation seed the winner's leave-one-out runs on (``ablation.seed_to_ablate``): the first where
    the winner and the strongest baseline both reached the target."""
    winner = confirmation["recipes"][winner_key]
    baseline = confirmation["baselines"][confirmation["strongest_baseline"]]
    return seed_to_ablate(confirmation["seeds"], winner["time_to_target_s"], baseline["time_to_target_s"])


def _winner_and_reference(config: TuneConfig, confirmation: dict) -> tuple[Recipe, Recipe]:
    """The confirmed winner's recipe and the strongest confirmed baseline's, each with "auto" precision as it runs
    on the search's device (``ablation.as_run_on``)."""
    winner = confirmation["recipes"][confirmation["best_recipe"]]["recipe"]
    baseline = confirmation["baselines"][confirmation["strongest_baseline"]]["recipe"]
    device = config.settings.run.device
    return as_run_on(Recipe(**winner), device), as_run_on(Recipe(**baseline), device)


def _ablated(winner: str, recipe: Recipe, reference: Recipe) -> dict[str, Recipe]:
    """``{candidate key: recipe}`` of the leave-one-out runs of the winner (its candidate key): each part of its
    difference from ``reference`` given the reference's value."""
    return {f"loo:{winner}:{part}": ablated.with_changes(name=f"tuned-without-{part}")
            for part, ablated in ablated_recipes(recipe, reference).items()}


def summarize_leave_one_out(config: TuneConfig, winner_key: str | None, confirmation: dict,
                            runs: dict[tuple[str, int], RunRecord]) -> dict:
    """The winner without each part of its difference from the strongest baseline on the seed it was taken apart
    on (``_seed_to_ablate``), as the benchmark's leave-one-out table (``ablation.leave_one_out_summary``; shares
    of its speed-up over that baseline on that seed), held as summary.json holds it (a part without which the
    winner never reached the target: null, not infinity)."""
    winner = confirmation["recipes"].get(winner_key)
    if winner is None:
        return {}
    seed = _seed_to_ablate(confirmation, winner_key)
    at = confirmation["seeds"].index(seed)
    if winner["time_to_target_s"][at] is None:
        return {}
    rows = leave_one_out_rows([record for (key, run_seed), record in runs.items()
                               if key.startswith(f"loo:{winner_key}:") and run_seed == seed], config.metric,
                              config.target)
    if not rows:  # no leave-one-out ran (not asked for, or stopped before its first run)
        return {}
    baseline = confirmation["baselines"][confirmation["strongest_baseline"]]
    return json_safe(leave_one_out_summary(
        run_name_for(config, winner_key, seed), winner["time_to_target_s"][at], winner["final_metric"][at], rows,
        baseline["time_to_target_s"][at], baseline["recipe"]["name"], recipe=winner["recipe"]["name"], seed=seed,
        reference_rerun=False))


def summarize_confirmation(config: TuneConfig, study) -> dict:
    """The confirmation's runs summarised as a benchmark's are (``speedkit.experiments.summary``): each candidate's
    entry, by its key, under ``baselines`` or ``recipes``, with its role, recipe and change from the base; the
    winner (``best_recipe``) is the confirmed fastest that held the target on every seed, not the search's
    luckiest."""
    candidates, seeds = confirm_candidates(config, study), confirm_seeds(config, study)
    runs = _confirmed(config, study, {key: recipe for _, key, recipe in candidates})
    baselines, recipes, roles = {}, {}, {key: role for role, key, _ in candidates}
    for role, key, recipe in candidates:
        side = baselines if role in BASELINE_ROLE_NAMES else recipes
        side[key] = {"role": role, "recipe": recipe.to_dict(), "change": describe_change(recipe, config.base_recipe()),
                     **recipe_entry([runs[key, seed] for seed in seeds if (key, seed) in runs], seeds,
                                    config.metric, config.target)}
    confirmation = {"seeds": seeds, "target": {"metric": config.metric, "value": config.target},
                    "baselines": baselines, "recipes": recipes,
                    **judge(baselines, recipes, seeds, config.metric, config.target),
                    # the tune calls that made these runs: more than one where a search was continued
                    "sessions": sittings(list(runs.values()), lambda r: r.config["tune"].get("sitting", UNRECORDED),
                                         lambda r: roles[r.config["tune"]["candidate"]])}
    winner = confirmation["best_recipe"]
    ablations = _confirmed(config, study, _ablated(winner, *_winner_and_reference(config, confirmation))) \
        if winner else {}
    confirmation["leave_one_out"] = summarize_leave_one_out(config, winner, confirmation, ablations)
    return confirmation


def sitting_label(started_at: float) -> str:
    """A tune call's sitting as a benchmark labels its sessions, by the time it started, to the millisecond (a
    search stopped and continued at once is two sittings too)."""
    return datetime.datetime.fromtimestamp(started_at).strftime("%Y%m%d-%H%M%S.%f")[:-3]


def confirmation_walls(study) -> list[float]:
    """Each finished confirmation run's wall time, set-up included: what the report's time table counts."""
    return [end - start for start, end in (run["span"] for run in read_plan(study).get("measured", []))]
