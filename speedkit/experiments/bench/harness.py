"""Run the time-to-accuracy benchmark: baseline and recipes interleaved by seed, then summarise.

Every run is built by ``speedkit.tasks.make_trainer`` and runs to its full budget, so a recipe's
final metric is what it reaches in its own budget; its time to a target is read afterwards from
the record's evaluations, whose ``wall_s`` is training wall clock with evaluation excluded.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Callable, Hashable, Sequence

from speedkit.core.devices import resolve_device
from speedkit.core.time import Time, scaled_duration
from speedkit.data.identity import data_identity
from speedkit.experiments.ablation import (as_run_on, leave_one_out_rows, leave_one_out_runs, leave_one_out_summary,
                                           seed_to_ablate)
from speedkit.experiments.bench.profiles import TASK_KEYS, BenchProfile, get_profile, task_key, with_default_sweeps
from speedkit.experiments.compare import final_metric, leave_one_out_baseline_time, median_or_none, paired_speedups
from speedkit.experiments.baseline_plan import (BaselinePlan, Outcome, Point, budget_found, default_step,
                                                run_plan, start_steps, sweep_found)
from speedkit.experiments.measure import MEASURED_RUN, finished_runs, fit, measure
from speedkit.experiments.summary import add_final_quality, judge, recipe_entry, seed_of, sittings
from speedkit.record.runs import AS_ASKED, RunRecord, environment
from speedkit.tasks import TASKS, Recipe, RunRequest, get_recipe, is_baseline, make_trainer, resolve_task

@dataclasses.dataclass
class BenchResult:
    key: str  # the task's key in summary.json ("vision", "language", or a user's task's name)
    entry: dict  # this task's entry in summary.json
    summary: dict  # the whole summary.json after merging
    records: list[RunRecord]  # the main runs, in the order they ran
    ablations: list[RunRecord]
    paths: dict[str, Path]


# -- building the runs -------------------------------------------------------------------------
def scheduled_recipe(profile: BenchProfile, name: str) -> Recipe:
    """The recipe as the profile runs it, with the profile's budget applied. A speed-up recipe evaluates as many
    times in a scaled budget as in its own (a baseline keeps its fine timing cadence, which is not clocked)."""
    recipe = profile.recipe(name)
    duration = profile.found_budgets.get(name)
    if duration is None:
        duration = profile.run.duration or recipe.duration
        if profile.duration_scale != 1.0:
            duration = scaled_duration(duration, profile.duration_scale)
    if profile.run.eval_interval or is_baseline(profile.task, name):
        return recipe.with_changes(duration=duration)
    return recipe.with_budget(duration)


def run_request(profile: BenchProfile, recipe: Recipe, seed: int, run_name: str, run_dir: str | Path,
                bench_info: dict, extra_config: dict | None = None, **trainer_kwargs) -> RunRequest:
    """The RunRequest of one benchmark run: the profile's ``run`` with ``recipe`` as the profile runs it
    (``scheduled_recipe``, which holds its budget and cadence), as a measured run (``measure.MEASURED_RUN``);
    ``trainer_kwargs`` are more request fields or Trainer keyword arguments."""
    return profile.run.replace(
        recipe=recipe, duration=None, eval_interval=None, seed=seed, run_dir=str(run_dir), run_name=run_name,
        extra_config={"bench": bench_info, "seed": seed, **(extra_config or {})},
        # A rebuilt rung is planned on the data as `speedkit train --recipe hot` plans it (never a handful of
        # steps), unless the profile gives every recipe one budget.
        step_floor=profile.run.duration is None, **{**MEASURED_RUN, **trainer_kwargs})


def run_one(profile: BenchProfile, recipe: Recipe, seed: int, run_name: str, run_dir: str | Path,
            bench_info: dict, extra_config: dict | None = None, **trainer_kwargs) -> RunRecord:
    """Build and fit one run (``speedkit.experiments.measure.fit``)."""
    return fit(run_request(profile, recipe, seed, run_name, run_dir, bench_info, extra_config, **trainer_kwargs))


def _bench_info(profile: BenchProfile, session: str, seed: int) -> dict:
    return {"task": task_key(profile.task), "profile": profile.name, "session": session, "seed": seed}


def plan_run_id(request: RunRequest) -> str:
    """What makes a run of a baseline's plan the same run when the benchmark is run again (on the same data:
    ``kept_runs``): its task, the recipe as it trains, its seed, device, fractions and target; not its name, folder
    or session."""
    recipe = request.recipe.to_dict() if isinstance(request.recipe, Recipe) else request.recipe
    what = {"task": str(request.task), "recipe": recipe,
            **{name: getattr(request, name) for name in ("task_options", "seed", "device", "data_fraction",
                                                         "eval_fraction", "target", "stop_at_target")}}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def main_run_key(profile: BenchProfile, recipe: Recipe, seed: int) -> str:
    """What makes a main run of ``profile`` the same run when it is taken again (``--reuse``, ``--only``): the
    ``plan_run_id`` of its request (the recipe as it trains, budget and cadence included, its seed, device and
    fractions), its target aside, at which a reused run is judged again (``retarget``)."""
    request = run_request(profile, recipe, seed, "key", "", {})
    return plan_run_id(dataclasses.replace(request, target=None))


def kept_runs(run_dir: str | Path, profile: BenchProfile, key: Callable[[RunRecord, dict], Hashable | None]) -> dict:
    """``measure.finished_runs`` of ``profile``'s benchmark alone, by ``key(record, its config["bench"])``: runs of
    its task and profile, on its task's data (``Task.data_identity``), that ended as asked (``AS_ASKED``: a run
    stopped, interrupted or killed is no measurement)."""
    task, data = task_key(profile.task), TASKS[profile.task].data_identity

    def of_this_benchmark(record: RunRecord) -> Hashable | None:
        bench = record.config.get("bench", {})
        if (record.status not in AS_ASKED or bench.get("task") != task or bench.get("profile") != profile.name
                or record.config.get("data") != data):
            return None
        return key(record, bench)

    return finished_runs(run_dir, of_this_benchmark)


def _plan_run(profile: BenchProfile, recipe: Recipe, seed: int, run_name: str, run_dir: str | Path, session: str,
              mark: str, log: Callable[[str], None], what: str, done: dict[str, RunRecord],
              **trainer_kwargs) -> RunRecord:
    """One run of a baseline's plan (its sweep, its budget search), marked ``config["bench"][mark]`` and stopped
    at the target, since past it a run says nothing more about whether (or how soon) it gets there; taken from
    ``done`` (``plan_run_id`` -> its run in ``kept_runs``) where it ran to its end before."""
    info, kwargs = {**_bench_info(profile, session, seed), mark: True}, {"stop_at_target": True, **trainer_kwargs}
    run_id = plan_run_id(run_request(profile, recipe, seed, run_name, run_dir, info, **kwargs))
    record = done.get(run_id) or run_one(profile, recipe, seed, run_name, run_dir, {**info, "plan_run": run_id},
                                         **kwargs)
    log(f"[{what}] {'kept from an earlier benchmark: ' if run_id in done else ''}{_describe_run(record)}")
    return record


def run_interleaved(profile: BenchProfile, seeds: Sequence[int], run_dir: str | Path, session: str,
                    log: Callable[[str], None] = print, on_record: Callable[[RunRecord], None] | None = None,
                    kept: dict[tuple[str, int], RunRecord] | None = None, **trainer_kwargs) -> list[RunRecord]:
    """Every recipe once per seed, seed by seed (``speedkit.experiments.measure.measure``), except those whose
    (recipe, seed) run is in ``kept`` (``--only``), taken as they are."""
    total, done, kept = len(seeds) * len(profile.recipes), [], kept or {}

    def run(name: str, seed: int) -> RunRecord:
        record = kept.get((name, seed))
        if record is None:
            recipe = scheduled_recipe(profile, name)
            info = {**_bench_info(profile, session, seed), "run_key": main_run_key(profile, recipe, seed)}
            record = run_one(profile, recipe, seed, f"{profile.task}-{name}-s{seed}", run_dir, info, **trainer_kwargs)
        done.append(record)
        log(f"[{len(done)}/{total}] {'kept ' if (name, seed) in kept else ''}{_describe_run(record)}")
        return record

    # the profile's order (baselines weakest first, then the speed-ups) is the order they run in
    measure(profile.recipes, [n for n in profile.recipes if n in profile.baselines], seeds, run,
            on_run=on_record)  # e.g. a notebook's run board, filling as runs finish
    return done


# -- each baseline tuned: its rate, then its budget (one plan, speedkit.experiments.baseline_plan) ----------------
def _budget_in_steps(duration: str, step: Time, what: str) -> int:
    """``duration`` as a whole number of ``step``s (a budget search moves a step at a time)."""
    time = Time.from_string(duration)
    steps = time.value / step.value
    if time.unit != step.unit or steps != int(steps):
        raise ValueError(f"a budget search in steps of {step} needs {what} in whole steps of it, got {duration!r}; "
                         f"set the profile's budget_step to the unit of the baseline's budget")
    return int(steps)


def baseline_plan(profile: BenchProfile, name: str, seeds: Sequence[int], sweep: bool, find_budget: bool,
                  earlier: dict | None = None) -> BaselinePlan:
    """How bench tunes baseline ``name``: with ``sweep``, the profile's grid (``profile.sweeps``) on the first seed at
    the grid's budget (where it names one: the recipe's own may be the shorter one a budget search found), else
    the pick of an ``earlier`` sweep or the recipe's own rate; with ``find_budget``, its budget in whole
    ``profile.budget_step``s (default ``baseline_plan.default_step``) on every seed, up to twice where the walk
    starts (the recipe's own budget where the pick gives no start)."""
    recipe = scheduled_recipe(profile, name)
    if sweep:
        grid = profile.sweeps.get(name)
        if not grid:
            raise ValueError(f"profile {profile.name!r} has no sweep for {name!r}; it sweeps {sorted(profile.sweeps)}")
        rates = tuple(grid.get("lr", (recipe.optimizer["lr"],)))
        schedules = tuple(grid.get("schedule", (recipe.schedule,)))
    else:
        chosen = (earlier or {}).get("pick") or {"lr": recipe.optimizer["lr"], "schedule": recipe.schedule}
        rates, schedules = (chosen["lr"],), (chosen["schedule"],)
    sweep_budget = profile.sweeps.get(name, {}).get("budget", recipe.duration) if sweep or earlier else recipe.duration
    step = (profile.budget_step or default_step(recipe.duration)) if find_budget else None
    return BaselinePlan(
        metric=TASKS[profile.task].target_metric, rates=rates, schedules=schedules, sweep_budget=sweep_budget,
        sweep_seed=seeds[0], budget_step=step, seeds=tuple(seeds),
        start_steps=_budget_in_steps(recipe.duration, Time.from_string(step), f"{name}'s budget") if step else None)


def tune_baseline(profile: BenchProfile, name: str, seeds: Sequence[int], run_dir: str | Path, session: str,
                  log: Callable[[str], None] = print, sweep: bool = True, find_budget: bool = False,
                  earlier: dict | None = None, **trainer_kwargs) -> dict:
    """Run ``baseline_plan``'s runs of baseline ``name`` in turn, each stopped at the target and marked
    ``config["bench"]["sweep"]`` or ``["budget_search"]`` (``_plan_run``; one that ran to its end in ``run_dir``
    before is taken as it is). Returns ``{"sweep": {"tried", "pick"}}`` with ``sweep`` and ``{"budget": {"budget",
    "tried": {budget: seeds that reached}}}`` with ``find_budget``: what ``--sweep`` and ``--find-budgets`` write."""
    plan, recipe = baseline_plan(profile, name, seeds, sweep, find_budget, earlier), scheduled_recipe(profile, name)
    done = kept_runs(run_dir, profile, lambda record, bench: bench.get("plan_run"))
    tried = [_earlier_outcome(plan, row) for row in (earlier or {}).get("tried", [])
             if (row["lr"], row["schedule"]) == (plan.rates[0], plan.schedules[0]) and not sweep]

    def run(point: Point) -> Outcome:
        if point.stage == "sweep" and point.lr not in plan.rates:
            log(f"[sweep {name}] the pick is the edge of the rates tried: trying lr {point.lr:g}")
        candidate = recipe.with_changes(optimizer={"lr": point.lr}, schedule=point.schedule, duration=point.budget)
        if point.stage == "sweep":
            shape = (point.schedule or {}).get("name", "constant")
            run_name, what = f"{profile.task}-{name}-lr{point.lr:g}-{shape}-s{point.seed}", "sweep"
        else:
            run_name, what = f"{profile.task}-{name}-{point.budget}-s{point.seed}", "budget_search"
        record = _plan_run(profile, candidate, point.seed, run_name, run_dir, session, what, log,
                           f"{what.replace('_search', '')} {name}", done, **trainer_kwargs)
        target = record.target or {}
        return Outcome(point, record.time_to(target.get("metric"), target.get("value"), x="batch")
                       if target else None, final_metric(record), record.time_to_target, record.name)

    tried = run_plan(plan, tried, run)
    found = {"sweep": sweep_found(plan, tried)} if sweep else {}
    if find_budget:
        found["budget"] = budget_found(plan, tried)
        if found["budget"]["budget"] is None:
            longest = max(2 * start_steps(plan, tried), plan.start_steps)
            raise ValueError(f"baseline {name} did not reach the target in every seed within {plan.budget(longest)}; "
                             f"lower the target or give the baseline a longer budget")
    return found


def _earlier_outcome(plan: BaselinePlan, row: dict) -> Outcome:
    """An earlier sweep's run (a row of its file) as the plan's run on its first seed."""
    return Outcome(Point(row["lr"], row["schedule"], plan.sweep_budget, plan.sweep_seed, "budget"),
                   row.get("batches_to_target"), row.get("final_metric"), row.get("time_to_target_s"), row.get("run"))


def _describe_run(record: RunRecord) -> str:
    reached = record.time_to_target
    target = record.target or {}
    when = f"reached {target.get('value')} at {reached:.1f}s" if reached is not None else "target not reached"
    final = final_metric(record)
    return (f"{record.name}: {record.timings.get('train_s', 0):.1f}s training, "
            f"{record.timings.get('eval_s', 0):.1f}s eval apart, {when}, final "
            f"{'-' if final is None else f'{final:.4f}'}")


# -- leave-one-out -----------------------------------------------------------------------------
def run_leave_one_out(profile: BenchProfile, records: Sequence[RunRecord], recipe_name: str, run_dir,
                      session: str, log: Callable[[str], None] = print, rerun_full: bool = False,
                      baseline: str = "baseline", **trainer_kwargs) -> list[RunRecord]:
    """One run per part of ``recipe_name`` left out (given ``baseline``'s value for that part), on one
    seed (``ablation.seed_to_ablate``: the first where its full run and ``baseline``'s reached the target), marked
    ``config["ablation"]`` for ``speedkit.experiments.compare.leave_one_out``.

    ``rerun_full`` first runs the whole recipe again on that seed and compares the ablations with this
    reference (returned first), for main runs measured in another session: side by side or not at all.
    """
    full_runs = [r for r in records if r.config.get("recipe") == recipe_name]
    reference_times = {seed_of(r): r.time_to_target for r in records if r.config.get("recipe") == baseline}
    seed = seed_to_ablate([seed_of(r) for r in full_runs], [r.time_to_target for r in full_runs],
                          [reference_times.get(seed_of(r)) for r in full_runs])
    full = next(r for r in full_runs if seed_of(r) == seed)
    recipe = scheduled_recipe(profile, recipe_name)
    ablations = []
    if rerun_full:
        marker = {"reference_for": full.name, "reference_for_run": full.run_id}
        full = run_one(profile, recipe, seed, f"{full.name}-reference-{session}", run_dir,
                       _bench_info(profile, session, seed), extra_config={"ablation": marker}, **trainer_kwargs)
        ablations.append(full)
        log(f"[leave-one-out] reference {_describe_run(full)}")
    recipe, reference = (as_run_on(r, profile.run.device) for r in (recipe, scheduled_recipe(profile, baseline)))

    def run(part: str, ablated: Recipe, marker: dict) -> None:
        run_name = f"{full.name}-without-{part}"
        try:
            record = run_one(profile, ablated, seed, run_name, run_dir, _bench_info(profile, session, seed),
                             extra_config={"ablation": marker}, **trainer_kwargs)
        except Exception as e:  # one ablation that cannot run must not cost the others
            log(f"leave-one-out {run_name} failed: {type(e).__name__}: {e}")
            record = RunRecord(name=run_name, status="failed", error=f"{type(e).__name__}: {e}",
                               config={"recipe": recipe_name, "ablation": marker})
        ablations.append(record)
        log(f"[leave-one-out] {_describe_run(record)}")

    leave_one_out_runs(recipe, run, of=full.name, reference=reference, against=baseline, of_run=full.run_id)
    return ablations


# -- summarising -------------------------------------------------------------------------------
def data_used(records: Sequence[RunRecord], profile: BenchProfile, data=None) -> dict:
    """What the main runs trained on: the data folder (``data_identity``: path, files, bytes, fingerprint; None
    for a built-in task's own data), and the fractions of its training and evaluation sets."""
    configs = [r.config for r in records]
    folder = next((c["data"] for c in configs if c.get("data")), None)
    if folder is None and data is not None:
        folder = data_identity(data)
    fraction = next((c["data_fraction"] for c in configs if c.get("data_fraction") is not None),
                    profile.run.data_fraction)
    evaluated = next((c["eval_fraction"] for c in configs if c.get("eval_fraction") is not None),
                     profile.run.eval_fraction)
    return {"folder": folder, "data_fraction": fraction, "eval_fraction": evaluated}


def summarize(records: Sequence[RunRecord], profile: BenchProfile, ablations: Sequence[RunRecord] = (),
              time_breakdown: dict | None = None, budget_search: dict | None = None,
              sweeps: dict | None = None, data=None) -> dict:
    """This task's summary.json entry, from the main runs' records (and any leave-one-out runs).

    ``baselines`` holds every baseline that ran (with its budget); ``baseline`` is the tutorial-style
    one where it ran (else the strongest), ``recipes`` the speed-up recipes. Speed-ups are paired by
    seed against each baseline (``speedup_vs``); the headline (``speedup_median``) is the best recipe's
    against the strongest baseline. The best recipe must hold the target in every seed. ``final_quality`` judges
    every run again at the strongest baseline's final quality (``add_final_quality``), where the headline is
    measured; ``data`` is what ``data_used`` records (the folder given as ``--data``, if any).
    """
    by_recipe: dict[str, list[RunRecord]] = {}
    for record in records:
        if "ablation" in record.config or record.config.get("bench", {}).get("profiling"):
            continue  # records loaded from a run folder may include these
        by_recipe.setdefault(record.config["recipe"], []).append(record)
    baseline_names = [name for name in TASKS[profile.task].baselines if name in by_recipe]
    if not baseline_names:
        raise ValueError(f"a benchmark summary needs runs of a baseline ({', '.join(TASKS[profile.task].baselines)}); "
                         f"got runs of {sorted(by_recipe)}")
    seeds = sorted({seed_of(r) for rs in by_recipe.values() for r in rs})
    target = dict(by_recipe[baseline_names[0]][0].target)
    order = {name: i for i, name in enumerate(profile.recipes)}  # the profile's order, whatever ran when
    entries = {name: recipe_entry(rs, seeds, target["metric"], target["value"], profile.targets)
               for name, rs in sorted(by_recipe.items(), key=lambda item: order.get(item[0], len(order)))}
    baselines = {name: entries.pop(name) for name in baseline_names}
    for name, found in (budget_search or {}).items():
        baselines[name]["budget_search"] = found
    for name, swept in (sweeps or {}).items():
        baselines[name]["sweep"] = swept
    judged = judge(baselines, entries, seeds, target["metric"], target["value"])
    strongest, best_entry = judged["strongest_baseline"], entries.get(judged["best_recipe"], {})
    strongest_times = baselines[strongest]["time_to"]
    summary = {
        "task": profile.task, "profile": profile.name, "device": profile.run.device, "seeds": seeds,
        "target": target, "report_targets": list(profile.targets),
        "baseline": baselines.get("baseline", baselines[strongest]), "baselines": baselines, "recipes": entries,
        **judged, "speedup_vs": dict(best_entry.get("speedup_median_vs", {})),
        "speedup_median_at": {key: median_or_none(paired_speedups(strongest_times[key], times))
                              for key, times in best_entry.get("time_to", {}).items()},
        "flops_fraction_of_peak": median_or_none(best_entry.get("flops_fraction_of_peak", [])),
        "leave_one_out": summarize_leave_one_out(records, ablations) if ablations else None,
        "machine": machine(profile.run.device, records),
        # the sittings the main runs come from (one when all ran interleaved; more when a baseline or
        # a recipe was run later, e.g. after a sweep, and paired by seed with the earlier runs)
        "sessions": sittings([r for r in records if "ablation" not in r.config],
                             lambda r: r.config.get("bench", {}).get("session"), lambda r: r.config["recipe"]),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "profile_spec": dataclasses.asdict(profile),
    }
    summary["profile_spec"]["run"]["data"] = None if data is None else str(data)
    summary["data"] = data_used(records, profile, data)
    add_final_quality(summary, by_recipe)
    if time_breakdown is not None:
        summary["time_breakdown"] = time_breakdown
    return summary


def summarize_leave_one_out(records: Sequence[RunRecord], ablations: Sequence[RunRecord]) -> dict:
    """The ablated runs with each part's slowdown and share of the speed-up over the baseline the parts came from,
    on the full run's seed (``compare.leave_one_out_baseline_time``, as the search's table and the run board)."""
    left_out = [r for r in ablations if "left_out" in r.config["ablation"]]  # not a rerun reference
    full_name = left_out[0].config["ablation"]["of"]
    full = next(r for r in [*records, *ablations] if r.name == full_name)
    against = left_out[0].config["ablation"].get("against", "baseline")
    rows = leave_one_out_rows(left_out, full.target["metric"], full.target["value"])
    return leave_one_out_summary(full_name, full.time_to_target, final_metric(full), rows,
                                 leave_one_out_baseline_time([*records, *ablations], full, against), against,
                                 recipe=full.config["recipe"], seed=seed_of(full), reference_rerun=full not in records)


def machine(device: str, records: Sequence[RunRecord] = ()) -> dict:
    """Where the numbers were measured: CPU model, threads, torch version, and the measured matmul peak.

    The runs' own environment where they recorded one (a summary may be written by another process,
    with other threads), else this process's."""
    used = [r.environment for r in records if r.environment.get("device")]
    env = {**environment(used[0]["device"] if used else resolve_device(device)), **(used[0] if used else {})}
    peaks = [r.environment.get("matmul_peak_flops") for r in records if r.environment.get("matmul_peak_flops")]
    if peaks:
        env["matmul_peak_flops"] = max(peaks)
    return env


def profile_recipe(profile: BenchProfile, name: str, seed: int, steps: int, run_dir: str | Path, session: str,
                   **trainer_kwargs) -> dict:
    """Where ``steps`` batches of one recipe spend their time, by Trainer phase (``speedkit.callbacks.phase_timer``)."""
    from speedkit.callbacks.phase_timer import profile_steps

    info = {**_bench_info(profile, session, seed), "profiling": True}
    request = run_request(profile, scheduled_recipe(profile, name), seed, f"{profile.task}-{name}-profile", run_dir,
                          info, **trainer_kwargs)
    return {"recipe": name, **profile_steps(lambda **changes: make_trainer(request.replace(**changes)), steps)}


# -- the whole benchmark -----------------------------------------------------------------------
def _write_json(path: Path, data: dict, log: Callable[[str], None], what: str, flag: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    log(f"{what} written to {path} (reuse them with {flag} {path})")


def plan_conditions(profile: BenchProfile) -> dict:
    """What a baseline's plan ran under, kept in the files ``--sweep`` and ``--find-budgets`` write: the task, its
    data, the fraction trained on, the target and the budget's scale. A budget found under others (another folder,
    another ``--duration-scale``) is not this benchmark's to run."""
    return json.loads(json.dumps({
        "task": task_key(profile.task), "data": TASKS[profile.task].data_identity,
        "data_fraction": profile.run.data_fraction, "target": profile.target_value, "duration": profile.run.duration,
        "duration_scale": profile.duration_scale}, default=str))


def _check_earlier(found: dict, known, what: str, profile: BenchProfile) -> None:
    """Refuse ``found`` (baseline -> what the ``what`` file holds for it) for a baseline not among ``known``, or
    found under other ``plan_conditions`` (a file written before they were kept is taken as it is)."""
    unknown = sorted(set(found) - set(known))
    if unknown:
        raise ValueError(f"{what} for {unknown}, which this profile has no {what} for (it has them for "
                         f"{', '.join(sorted(known))}); pass the <task>_{what}.json written for this task and profile")
    now = plan_conditions(profile)
    for name, entry in found.items():
        then = entry.get("conditions", now)
        changed = [f"{key} {then.get(key)!r} there, {value!r} here" for key, value in now.items()
                   if then.get(key) != value]
        if changed:
            raise ValueError(f"the {what} of {name} were found under other conditions ({'; '.join(changed)}); find "
                             f"them here (--sweep, --find-budgets), or pass the file written for this data and scale")


def _with_sweeps(profile: BenchProfile, sweeps: dict) -> BenchProfile:
    """The profile with each swept baseline's pick (learning rate and schedule) on top of its own changes."""
    _check_earlier(sweeps, profile.sweeps, "sweeps", profile)
    picks = {name: {**profile.recipe_changes.get(name, {}), "optimizer": {"lr": s["pick"]["lr"]},
                    "schedule": dict(s["pick"]["schedule"])} for name, s in sweeps.items()}
    return dataclasses.replace(profile, recipe_changes={**profile.recipe_changes, **picks})


def _names(value: Sequence[str] | str | None) -> list[str] | None:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return None if value is None else list(value)


def resolve_profile(task: str, profile: str | BenchProfile = "cpu", seeds: int | Sequence[int] | None = None,
                    recipes: Sequence[str] | str | None = None, baselines: Sequence[str] | str | None = None,
                    **overrides) -> tuple[BenchProfile, list[int]]:
    """The profile with command-line style overrides, and the seeds to run.

    ``recipes`` names the speed-up recipes and ``baselines`` the baselines to run them against (default:
    every baseline of the task); each list replaces the profile's.
    """
    profile = get_profile(task, profile)
    recipes, baselines = _names(recipes), _names(baselines)
    task_baselines = TASKS[profile.task].baselines
    for name in [*(recipes or []), *(baselines or [])]:
        get_recipe(profile.task, name)  # a clear error for unknown names
    if baselines is not None:
        wrong = [b for b in baselines if b not in task_baselines]
        if wrong or not baselines:
            raise ValueError(f"baselines {wrong or baselines} are not baselines of {profile.task}; "
                             f"choose from {list(task_baselines)}")
    if recipes is not None or baselines is not None:
        baselines = baselines or list(task_baselines)
        speedups = [r for r in (recipes if recipes is not None else profile.recipes) if r not in task_baselines]
        recipes = (*baselines, *speedups)  # every speed-up is measured against each baseline
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds) if seeds is not None else None
    if seed_list is not None and not seed_list:
        raise ValueError("seeds must be a positive count or a non-empty list of seeds")
    given = {k: v for k, v in overrides.items() if v is not None}
    profile = profile.replace(**given, **({"recipes": tuple(recipes)} if recipes else {}),
                              **({"seeds": len(seed_list)} if seed_list else {}))
    return profile, seed_list or list(range(profile.seeds))


def reusable_runs(run_dir: str | Path, profile: BenchProfile, seeds: Sequence[int],
                  fix: str = "run the benchmark without --reuse") -> list[RunRecord]:
    """The newest main run of each (recipe, seed) of ``profile`` under ``run_dir`` (``kept_runs``) made as the
    profile would make it now (``main_run_key``: a run with another budget, cadence, device or fraction, or of a
    recipe changed since, is another measurement); where the profile names a target (``--target``) other than the
    one the runs had, judged at it (``retarget``)."""
    expected = {(name, seed): main_run_key(profile, scheduled_recipe(profile, name), seed)
                for name in profile.recipes for seed in seeds}
    made_otherwise = set()

    def main_run(record: RunRecord, bench: dict) -> tuple | None:
        if any(bench.get(mark) for mark in ("profiling", "budget_search", "sweep")) or "ablation" in record.config:
            return None
        key = record.config.get("recipe"), seed_of(record)
        if bench.get("run_key", expected.get(key)) != expected.get(key):  # a run made before keys were kept is taken
            made_otherwise.add(key)
            return None
        return key

    newest = kept_runs(run_dir, profile, main_run)
    missing = [(r, s) for r in profile.recipes for s in seeds if (r, s) not in newest]
    if missing:
        absent = ", ".join(f"{r} seed {s}" for r, s in missing if (r, s) not in made_otherwise)
        otherwise = ", ".join(f"{r} seed {s}" for r, s in missing if (r, s) in made_otherwise)
        why = ([f"no finished {profile.task} run for {absent} (runs on other data, and runs that ended early: "
                f"stopped, interrupted or killed, are not measurements)"] if absent else []) + \
              ([f"the runs of {otherwise} there were made with other settings (another budget, cadence, device or "
                f"data fraction, or the recipe as it was before a change): another measurement"] if otherwise else [])
        raise ValueError(f"cannot reuse the runs in {run_dir}: {'; '.join(why)}; {fix}")
    return [retarget(newest[(r, s)], profile.run.target) for s in seeds for r in profile.recipes]


def runs_kept(run_dir: str | Path, profile: BenchProfile, seeds: Sequence[int],
              only: Sequence[str]) -> dict[tuple[str, int], RunRecord]:
    """With ``--only``: the other recipes' runs, taken from ``run_dir`` as ``--reuse`` takes them, by (recipe,
    seed), judged at the target the new runs are made with (``retarget``). Found before anything runs, so a
    missing one is named before minutes are spent."""
    unknown = [name for name in only if name not in profile.recipes]
    if unknown or not only:
        raise ValueError(f"--only {','.join(only)}: {unknown or 'nothing'} is not among this benchmark's recipes "
                         f"{list(profile.recipes)}; name some of them (--recipes and --baselines choose them)")
    others = tuple(name for name in profile.recipes if name not in only)
    if not others:
        return {}
    records = reusable_runs(run_dir, profile.replace(recipes=others), seeds,
                            fix="run them too (leave out --only or name them in it)")
    return {(record.config["recipe"], seed_of(record)): retarget(record, profile.target_value) for record in records}


def retarget(record: RunRecord, value: float | None) -> RunRecord:
    """``record`` judged at the target ``value`` (None: its own), read from its curve; the file is not changed.
    So `--reuse --target` measures runs made with another target at the one asked for, headline included."""
    if value is not None and record.target and record.target.get("value") != value:
        record.target = {**record.target, "value": value}
    return record


def reusable_ablations(run_dir: str | Path, profile: BenchProfile, recipe: str,
                       records: Sequence[RunRecord]) -> list[RunRecord]:
    """The newest leave-one-out of ``recipe`` under ``run_dir`` (``kept_runs``: its reference rerun and its
    ablations, from one session) that takes apart one of ``records`` or a rerun of one, or [] when there is none:
    a leave-one-out of an earlier run of the same name, made with other settings, is not this benchmark's."""
    def ablation(record: RunRecord, bench: dict) -> tuple | None:
        if "ablation" not in record.config or record.config.get("recipe") != recipe:
            return None
        return bench.get("session", ""), record.name

    sessions: dict[str, list[RunRecord]] = {}
    for (session, _), record in kept_runs(run_dir, profile, ablation).items():
        sessions.setdefault(session, []).append(record)
    ids = {record.run_id for record in records}
    ours = [session for session, runs in sessions.items() if _takes_apart(runs, ids)]
    return sessions[max(ours)] if ours else []


def _takes_apart(ablations: Sequence[RunRecord], ids: set[str]) -> bool:
    """Whether one session's leave-one-out runs left parts out of a run among ``ids`` (or of a reference rerun of
    one), by run id; a leave-one-out made before the markers held run ids is taken as it is."""
    marks = [record.config["ablation"] for record in ablations]
    if not any("of_run" in mark or "reference_for_run" in mark for mark in marks):
        return True
    full = ids | {record.run_id for record, mark in zip(ablations, marks) if mark.get("reference_for_run") in ids}
    return all(mark.get("of_run") in full for mark in marks if "left_out" in mark)


def run_benchmark(task, profile: str | BenchProfile = "cpu", seeds: int | Sequence[int] | None = None,
                  recipes: Sequence[str] | str | None = None, out_dir: str | Path = "bench/results",
                  run_dir: str | Path = "runs/bench", leave_one_out: bool = False, profile_steps: int = 0,
                  figures: bool = True, log: Callable[[str], None] = print, *, reuse: bool = False,
                  device: str | None = None,
                  data_fraction: float | None = None, eval_fraction: float | None = None,
                  eval_interval: str | None = None, duration: str | None = None,
                  duration_scale: float | None = None, target: float | None = None,
                  trainer_kwargs: dict | None = None, baselines: Sequence[str] | str | None = None,
                  find_budgets: bool = False, budgets: dict | None = None, sweep: bool = False,
                  sweeps: dict | None = None, on_record: Callable[[RunRecord], None] | None = None,
                  data: str | None = None, task_options: dict | None = None,
                  only: Sequence[str] | str | None = None) -> BenchResult:
    """Benchmark ``task`` and merge its entry into ``out_dir/summary.json``; the options are the flags of
    ``speedkit bench``, described in bench/README.md.

    ``task`` is ``"vision"``/``"language"`` (the built-in tasks), or any task ``speedkit.tasks.resolve_task``
    accepts (with ``data`` and ``task_options`` for a folder task), run under ``default_profiles`` and keyed by
    its name. ``budgets`` and ``sweeps`` are an earlier ``find_budgets`` or ``sweep``'s results; keyword
    overrides replace the profile's fields; ``trainer_kwargs`` go to every run's request; ``on_record`` sees
    each main run's record as it finishes. ``only`` runs those recipes and takes the others' runs from
    ``run_dir`` (to measure one changed recipe against the runs already made).
    """
    from speedkit.experiments.report import write_reports

    named = isinstance(task, str) and (task in TASK_KEYS or task in TASKS) and data is None and not task_options
    key = task_key(task if named else resolve_task(task, data, **(task_options or {})).name)
    profile, seed_list = resolve_profile(
        key, profile, seeds, recipes, baselines, device=device, data_fraction=data_fraction, eval_fraction=eval_fraction,
        eval_interval=eval_interval, duration=duration, duration_scale=duration_scale, target=target)
    resolve_device(profile.run.device)  # a clear error now, not after the first runs
    only = _names(only)
    if only is not None and reuse:
        raise ValueError("--only runs the recipes it names and reuses the rest; --reuse reuses them all: give one")
    if sweep or sweeps:
        profile = with_default_sweeps(profile)
    trainer_kwargs = dict(trainer_kwargs or {})
    session = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log(f"benchmark {key} ({profile.task}), profile {profile.name}: recipes {', '.join(profile.recipes)}; "
        f"seeds {seed_list}; device {profile.run.device}")
    searched = [b for b in profile.baselines if profile.budget_searched is None or b in profile.budget_searched]
    swept = [b for b in profile.baselines if b in profile.sweeps] if sweep else []
    if (sweep or find_budgets) and not reuse:
        found = {name: tune_baseline(profile, name, seed_list, run_dir, session, log, sweep=name in swept,
                                     find_budget=find_budgets and name in searched, earlier=(sweeps or {}).get(name),
                                     **trainer_kwargs)
                 for name in dict.fromkeys([*swept, *(searched if find_budgets else [])])}
        conditions = {"conditions": plan_conditions(profile)}
        if sweep:
            sweeps = {name: {**f["sweep"], **conditions} for name, f in found.items() if "sweep" in f}
            _write_json(Path(out_dir) / f"{key}_sweeps.json", sweeps, log, "sweeps", "--sweeps")
        if find_budgets:
            budgets = {name: {**f["budget"], **conditions} for name, f in found.items() if "budget" in f}
            _write_json(Path(out_dir) / f"{key}_budgets.json", budgets, log, "baseline budgets", "--budgets")
    if sweeps:
        profile = _with_sweeps(profile, sweeps)
        log("sweep picks: " + ", ".join(f"{n} {s['pick']}" for n, s in sweeps.items()))
    if budgets:
        _check_earlier(budgets, profile.baselines, "budgets", profile)
        profile = profile.replace(found_budgets={**profile.found_budgets,
                                                 **{n: b["budget"] for n, b in budgets.items()}})
        log("baseline budgets: " + ", ".join(f"{n} {b['budget']}" for n, b in budgets.items()))
    if reuse:
        records = reusable_runs(run_dir, profile, seed_list)
        log(f"reusing {len(records)} runs from {run_dir}")
    else:
        kept = runs_kept(run_dir, profile, seed_list, only) if only is not None else None
        records = run_interleaved(profile, seed_list, run_dir, session, log, on_record, kept, **trainer_kwargs)
    entry = summarize(records, profile)
    best = entry["best_recipe"]
    ablations = []
    if leave_one_out and best is not None:
        ablations = run_leave_one_out(profile, records, best, run_dir, session, log, rerun_full=reuse,
                                      baseline=entry["strongest_baseline"], **trainer_kwargs)
    elif reuse and best is not None:
        ablations = reusable_ablations(run_dir, profile, best, records)
    breakdown = None
    if profile_steps and profile_steps > 0:
        breakdown = profile_recipe(profile, best or "baseline", seed_list[0], profile_steps, run_dir, session,
                                   **trainer_kwargs)
    entry = summarize(records, profile, ablations, breakdown, budgets, sweeps, data=data)
    summary, paths = write_reports(out_dir, key, entry, records if figures else None)
    return BenchResult(key=key, entry=entry, summary=summary, records=records, ablations=ablations, paths=paths)

