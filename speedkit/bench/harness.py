"""Run the time-to-accuracy benchmark: baseline and recipes interleaved by seed, then summarise.

Every run is built by ``speedkit.tasks.make_trainer`` and runs to its full budget, so a recipe's
final metric is what it reaches in its own budget; its time to a target is read afterwards from
the record's evaluations, whose ``wall_s`` is training wall clock with evaluation excluded.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from speedkit.bench.profiles import BenchProfile, TASK_KEYS, get_profile, task_key
from speedkit.compare import final_metric, leave_one_out as leave_one_out_table, median_or_none, paired_speedups
from speedkit.core.time import Time
from speedkit.devices import resolve_device
from speedkit.recipes import Recipe, get_recipe
from speedkit.runs import RunRecord, environment, load_records, lower_is_better
from speedkit.tasks import make_trainer

# Parts of a recipe besides its methods that a leave-one-out run can swap for the baseline's.
NON_METHOD_PARTS = ("precision", "loader", "augment")


@dataclasses.dataclass
class BenchResult:
    entry: dict  # this task's entry in summary.json
    summary: dict  # the whole summary.json after merging
    records: list[RunRecord]  # the main runs, in the order they ran
    ablations: list[RunRecord]
    paths: dict[str, Path]


# -- building the runs -------------------------------------------------------------------------
def apply_overrides(profile: BenchProfile, **overrides) -> BenchProfile:
    """The profile with every override that is not None."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(profile, **given) if given else profile


def scheduled_recipe(profile: BenchProfile, name: str) -> Recipe:
    """The recipe as the profile runs it, with the profile's budget applied."""
    recipe = profile.recipe(name)
    duration = profile.duration or recipe.duration
    if profile.duration_scale != 1.0:
        duration = str(Time.from_string(duration) * profile.duration_scale)
    return recipe.with_changes(duration=duration)


def trainer_factory(profile: BenchProfile, recipe: Recipe, seed: int, run_name: str, run_dir: str | Path,
                    bench_info: dict, extra_config: dict | None = None, **trainer_kwargs) -> Callable[..., object]:
    """``make_trainer`` with everything a benchmark run needs bound; call it (with any last overrides,
    such as a profile run's duration and callbacks) to build the Trainer."""
    return functools.partial(
        make_trainer, profile.task, recipe, seed=seed, device=profile.device, run_dir=str(run_dir),
        run_name=run_name, data_fraction=profile.data_fraction, eval_fraction=profile.eval_fraction,
        eval_interval=profile.eval_interval, target=profile.target,
        extra_config={"bench": bench_info, "seed": seed, **(extra_config or {})},
        **{"save_checkpoints": False, **trainer_kwargs})  # benchmark runs are not resumed


def run_one(profile: BenchProfile, recipe: Recipe, seed: int, run_name: str, run_dir: str | Path,
            bench_info: dict, extra_config: dict | None = None, **trainer_kwargs) -> RunRecord:
    """Build and fit one run; the time to build it (data into memory, model, INIT surgery) is ``setup_s``."""
    started = time.perf_counter()
    trainer = trainer_factory(profile, recipe, seed, run_name, run_dir, bench_info, extra_config, **trainer_kwargs)()
    trainer.record.timings["setup_s"] = round(time.perf_counter() - started, 4)
    return trainer.fit()


def _bench_info(profile: BenchProfile, session: str, seed: int) -> dict:
    return {"task": task_key(profile.task), "profile": profile.name, "session": session, "seed": seed}


def run_interleaved(profile: BenchProfile, seeds: Sequence[int], run_dir: str | Path, session: str,
                    log: Callable[[str], None] = print, on_record: Callable[[RunRecord], None] | None = None,
                    **trainer_kwargs) -> list[RunRecord]:
    """Every recipe once per seed, seed by seed (A B A B ...), so slow drifts of a shared machine
    hit baseline and recipes alike and each seed's pair ran side by side."""
    records, total = [], len(seeds) * len(profile.recipes)
    for seed in seeds:
        for name in profile.recipes:
            run_name = f"{profile.task}-{name}-s{seed}"
            record = run_one(profile, scheduled_recipe(profile, name), seed, run_name, run_dir,
                             _bench_info(profile, session, seed), **trainer_kwargs)
            records.append(record)
            log(f"[{len(records)}/{total}] {_describe_run(record)}")
            if on_record is not None:
                on_record(record)  # e.g. a notebook's run board, filling as runs finish
    return records


def _describe_run(record: RunRecord) -> str:
    reached = record.time_to_target
    target = record.target or {}
    when = f"reached {target.get('value')} at {reached:.1f}s" if reached is not None else "target not reached"
    final = final_metric(record)
    return (f"{record.name}: {record.timings.get('train_s', 0):.1f}s training, "
            f"{record.timings.get('eval_s', 0):.1f}s eval apart, {when}, final "
            f"{'-' if final is None else f'{final:.4f}'}")


# -- leave-one-out -----------------------------------------------------------------------------
def ablation_changes(profile: BenchProfile, recipe: Recipe) -> dict[str, dict]:
    """``{part left out: Recipe.with_changes(...)}`` for each method, and for each non-method part
    (precision, loader, augmentation) where the recipe differs from the baseline's."""
    changes = {method: {"methods": {m: p for m, p in recipe.methods.items() if m != method}}
               for method in recipe.methods}
    baseline = profile.recipe("baseline")
    for part in NON_METHOD_PARTS:
        if getattr(recipe, part) != getattr(baseline, part):
            changes[part] = {part: getattr(baseline, part)}
    return changes


def _without(recipe: Recipe, change: dict) -> Recipe:
    # Not Recipe.with_changes: it skips None values, and the baseline's part may be None (no augmentation).
    data = {**dataclasses.asdict(recipe), **change}
    return Recipe(**data)


def run_leave_one_out(profile: BenchProfile, records: Sequence[RunRecord], recipe_name: str, run_dir,
                      session: str, log: Callable[[str], None] = print, rerun_full: bool = False,
                      **trainer_kwargs) -> list[RunRecord]:
    """One run per part of ``recipe_name`` left out, on one seed (the first whose full run reached
    the target), marked ``config["ablation"]`` for ``speedkit.compare.leave_one_out``.

    ``rerun_full`` first runs the whole recipe again on that seed and compares the ablations with this
    reference (returned first), for main runs measured in another session: side by side or not at all.
    """
    full_runs = [r for r in records if r.config.get("recipe") == recipe_name]
    full = next((r for r in full_runs if r.time_to_target is not None), full_runs[0])
    seed = full.config["seed"]
    recipe = scheduled_recipe(profile, recipe_name)
    ablations = []
    if rerun_full:
        full = run_one(profile, recipe, seed, f"{full.name}-reference-{session}", run_dir,
                       _bench_info(profile, session, seed), extra_config={"ablation": {"reference_for": full.name}},
                       **trainer_kwargs)
        ablations.append(full)
        log(f"[leave-one-out] reference {_describe_run(full)}")
    for part, change in ablation_changes(profile, recipe).items():
        run_name = f"{full.name}-without-{part}"
        try:
            record = run_one(profile, _without(recipe, change), seed, run_name, run_dir,
                             _bench_info(profile, session, seed),
                             extra_config={"ablation": {"of": full.name, "left_out": part}}, **trainer_kwargs)
        except Exception as e:  # one ablation that cannot run must not cost the others
            log(f"leave-one-out {run_name} failed: {type(e).__name__}: {e}")
            record = RunRecord(name=run_name, status="failed", error=f"{type(e).__name__}: {e}",
                               config={"recipe": recipe_name, "ablation": {"of": full.name, "left_out": part}})
        ablations.append(record)
        log(f"[leave-one-out] {_describe_run(record)}")
    return ablations


# -- summarising -------------------------------------------------------------------------------
def _seed_of(record: RunRecord) -> int:
    return record.config.get("seed", record.config.get("bench", {}).get("seed"))


def _median_fraction_of_peak(record: RunRecord) -> float | None:
    return median_or_none(row.get("throughput/fraction_of_peak") for row in record.steps)


def _by_seed(records: Sequence[RunRecord], seeds: Sequence[int], value: Callable[[RunRecord], object]) -> list:
    """``value(record)`` for each seed in order; None for a seed without a run."""
    found = {_seed_of(r): r for r in records}
    return [value(found[s]) if s in found else None for s in seeds]


def target_key(value: float) -> str:
    return f"{value:g}"


def recipe_entry(records: Sequence[RunRecord], seeds: Sequence[int], targets: Sequence[float]) -> dict:
    """One recipe's results, every list in seed order (None where a seed never got there)."""
    metric = records[0].target["metric"]
    return {
        "runs": _by_seed(records, seeds, lambda r: r.name),
        "methods": records[0].method_names,
        "time_to_target_s": _by_seed(records, seeds, lambda r: r.time_to_target),
        "final_metric": _by_seed(records, seeds, final_metric),
        "train_s": _by_seed(records, seeds, lambda r: r.timings.get("train_s")),
        "eval_s": _by_seed(records, seeds, lambda r: r.timings.get("eval_s")),
        "setup_s": _by_seed(records, seeds, lambda r: r.timings.get("setup_s")),
        "compile_s": _by_seed(records, seeds, lambda r: r.timings.get("compile_s")),
        "flops_fraction_of_peak": _by_seed(records, seeds, _median_fraction_of_peak),
        "time_to": {target_key(t): _by_seed(records, seeds, lambda r, t=t: r.time_to(metric, t)) for t in targets},
    }


def _add_speedups(entry: dict, baseline: dict) -> None:
    """Paired by seed: a seed where either side never reached the target has no speed-up."""
    entry["median_time_to_target_s"] = median_or_none(entry["time_to_target_s"])
    entry["reached"] = sum(t is not None for t in entry["time_to_target_s"])
    entry["speedup"] = paired_speedups(baseline["time_to_target_s"], entry["time_to_target_s"])
    entry["speedup_median"] = median_or_none(entry["speedup"])


def pick_best(recipes: dict[str, dict], metric: str) -> str | None:
    """The recipe with the lowest median time to target, a seed that never got there counting as
    infinitely slow (so one lucky seed cannot make a recipe best); ties, such as nothing reaching the
    target, go to the best median final metric."""
    sign = 1.0 if lower_is_better(metric) else -1.0

    def rank(name):
        entry = recipes[name]
        times = [math.inf if t is None else t for t in entry["time_to_target_s"]]
        median_final = median_or_none(entry["final_metric"])
        return (statistics.median(times) if times else math.inf,
                sign * median_final if median_final is not None else math.inf)

    return min(recipes, key=rank) if recipes else None


def summarize(records: Sequence[RunRecord], profile: BenchProfile, ablations: Sequence[RunRecord] = (),
              time_breakdown: dict | None = None) -> dict:
    """This task's summary.json entry, from the main runs' records (and any leave-one-out runs)."""
    by_recipe: dict[str, list[RunRecord]] = {}
    for record in records:
        if "ablation" in record.config or record.config.get("bench", {}).get("profiling"):
            continue  # records loaded from a run folder may include these
        by_recipe.setdefault(record.config["recipe"], []).append(record)
    if "baseline" not in by_recipe:
        raise ValueError(f"a benchmark summary needs baseline runs; got runs of {sorted(by_recipe)}")
    seeds = sorted({_seed_of(r) for rs in by_recipe.values() for r in rs})
    target = dict(by_recipe["baseline"][0].target)
    entries = {name: recipe_entry(rs, seeds, profile.targets) for name, rs in by_recipe.items()}
    for entry in entries.values():
        _add_speedups(entry, entries["baseline"])
    baseline = entries.pop("baseline")
    best = pick_best(entries, target["metric"])
    best_entry = entries.get(best, {})
    summary = {
        "task": profile.task, "profile": profile.name, "device": profile.device, "seeds": seeds,
        "target": target, "report_targets": list(profile.targets),
        "baseline": baseline, "recipes": entries, "best_recipe": best,
        "speedup_median": best_entry.get("speedup_median"),
        "speedup_median_at": {key: median_or_none(paired_speedups(baseline["time_to"][key], times))
                              for key, times in best_entry.get("time_to", {}).items()},
        "flops_fraction_of_peak": median_or_none(best_entry.get("flops_fraction_of_peak", [])),
        "leave_one_out": summarize_leave_one_out(records, ablations) if ablations else None,
        "machine": machine(profile.device, records),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "profile_spec": dataclasses.asdict(profile),
    }
    if time_breakdown is not None:
        summary["time_breakdown"] = time_breakdown
    return summary


def summarize_leave_one_out(records: Sequence[RunRecord], ablations: Sequence[RunRecord]) -> dict:
    """The ablated runs with compare.leave_one_out's slowdown and share of the speed-up for each part."""
    left_out = [r for r in ablations if "left_out" in r.config["ablation"]]  # not a rerun reference
    full_name = left_out[0].config["ablation"]["of"]
    full = next(r for r in [*records, *ablations] if r.name == full_name)
    effects = leave_one_out_table([*records, *ablations]).get(full_name, {})
    parts = {}
    for record in left_out:
        part = record.config["ablation"]["left_out"]
        parts[part] = {"run": record.name, "time_without_s": record.time_to_target,
                       "final_metric": final_metric(record) if record.target else None,
                       "slowdown": None, "share": None, "pays_off": None,
                       **effects.get(part, {}), **({"error": record.error} if record.error else {})}
    return {"recipe": full.config["recipe"], "seed": _seed_of(full), "of": full_name,
            "reference_rerun": full not in records,
            "time_to_target_s": full.time_to_target, "final_metric": final_metric(full), "parts": parts}


def machine(device: str, records: Sequence[RunRecord] = ()) -> dict:
    """Where the numbers were measured: CPU model, threads, torch version, and the measured matmul peak."""
    used = [r.environment.get("device") for r in records if r.environment.get("device")]
    env = environment(used[0] if used else resolve_device(device))  # "auto" resolved as the runs resolved it
    peaks = [r.environment.get("matmul_peak_flops") for r in records if r.environment.get("matmul_peak_flops")]
    if peaks:
        env["matmul_peak_flops"] = max(peaks)
    return env


def profile_recipe(profile: BenchProfile, name: str, seed: int, steps: int, run_dir: str | Path, session: str,
                   **trainer_kwargs) -> dict:
    """Where ``steps`` batches of one recipe spend their time, by Trainer phase (see bench.profiling)."""
    from speedkit.bench.profiling import profile_steps

    info = {**_bench_info(profile, session, seed), "profiling": True}
    factory = trainer_factory(profile, scheduled_recipe(profile, name), seed, f"{profile.task}-{name}-profile",
                              run_dir, info, **trainer_kwargs)
    return {"recipe": name, **profile_steps(factory, steps)}


# -- the whole benchmark -----------------------------------------------------------------------
def resolve_profile(task: str, profile: str | BenchProfile = "cpu", seeds: int | Sequence[int] | None = None,
                    recipes: Sequence[str] | str | None = None, **overrides) -> tuple[BenchProfile, list[int]]:
    """The profile with command-line style overrides, and the seeds to run."""
    profile = get_profile(task, profile)
    if isinstance(recipes, str):
        recipes = [r.strip() for r in recipes.split(",") if r.strip()]
    if recipes is not None:
        for name in recipes:
            get_recipe(profile.task, name)  # a clear error for unknown names
        recipes = ("baseline", *[r for r in recipes if r != "baseline"])  # every speed-up is against it
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds) if seeds is not None else None
    if seed_list is not None and not seed_list:
        raise ValueError("seeds must be a positive count or a non-empty list of seeds")
    profile = apply_overrides(profile, recipes=tuple(recipes) if recipes else None,
                              seeds=len(seed_list) if seed_list else None, **overrides)
    return profile, seed_list or list(range(profile.seeds))


def reusable_runs(run_dir: str | Path, profile: BenchProfile, seeds: Sequence[int]) -> list[RunRecord]:
    """The newest finished main run of each (recipe, seed) of ``profile`` under ``run_dir``."""
    newest: dict[tuple, RunRecord] = {}
    for record in load_records(run_dir):  # oldest first, so later ones replace earlier ones
        bench = record.config.get("bench", {})
        if (bench.get("task") != task_key(profile.task) or bench.get("profile") != profile.name
                or bench.get("profiling") or "ablation" in record.config or record.status == "failed"):
            continue
        if record.config.get("recipe") in profile.recipes and _seed_of(record) in seeds:
            newest[(record.config["recipe"], _seed_of(record))] = record
    missing = [(r, s) for r in profile.recipes for s in seeds if (r, s) not in newest]
    if missing:
        raise ValueError(f"cannot reuse the runs in {run_dir}: no finished {profile.task} run for "
                         f"{', '.join(f'{r} seed {s}' for r, s in missing)}; run the benchmark without --reuse")
    return [newest[(r, s)] for s in seeds for r in profile.recipes]


def run_benchmark(task: str, profile: str | BenchProfile = "cpu", seeds: int | Sequence[int] | None = None,
                  recipes: Sequence[str] | str | None = None, out_dir: str | Path = "bench/results",
                  run_dir: str | Path = "runs/bench", leave_one_out: bool = False, profile_steps: int = 0,
                  figures: bool = True, log: Callable[[str], None] = print, *, reuse: bool = False,
                  device: str | None = None,
                  data_fraction: float | None = None, eval_fraction: float | None = None,
                  eval_interval: str | None = None, duration: str | None = None,
                  duration_scale: float | None = None, target: float | None = None,
                  trainer_kwargs: dict | None = None,
                  on_record: Callable[[RunRecord], None] | None = None) -> BenchResult:
    """Benchmark ``task`` ("vision"/"language") and merge its entry into ``out_dir/summary.json``.

    ``seeds`` is a count or a list; ``recipes`` names the speed-up recipes (the baseline always runs).
    Keyword overrides replace the profile's fields; ``trainer_kwargs`` go to every make_trainer call;
    ``on_record`` is called with each main run's record as it finishes. ``reuse`` takes the main runs
    from ``run_dir`` instead of running them (to add a leave-one-out or a profile later); the
    leave-one-out then reruns the full recipe beside its ablations.
    """
    from speedkit.bench.report import write_reports

    key = task_key(task)
    profile, seed_list = resolve_profile(
        key, profile, seeds, recipes, device=device, data_fraction=data_fraction, eval_fraction=eval_fraction,
        eval_interval=eval_interval, duration=duration, duration_scale=duration_scale, target=target)
    resolve_device(profile.device)  # a clear error now, not after the first runs
    trainer_kwargs = dict(trainer_kwargs or {})
    session = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log(f"benchmark {key} ({profile.task}), profile {profile.name}: recipes {', '.join(profile.recipes)}; "
        f"seeds {seed_list}; device {profile.device}")
    if reuse:
        records = reusable_runs(run_dir, profile, seed_list)
        log(f"reusing {len(records)} runs from {run_dir}")
    else:
        records = run_interleaved(profile, seed_list, run_dir, session, log, on_record, **trainer_kwargs)
    entry = summarize(records, profile)
    best = entry["best_recipe"]
    ablations = []
    if leave_one_out and best is not None:
        ablations = run_leave_one_out(profile, records, best, run_dir, session, log, rerun_full=reuse,
                                      **trainer_kwargs)
    breakdown = None
    if profile_steps and profile_steps > 0:
        breakdown = profile_recipe(profile, best or "baseline", seed_list[0], profile_steps, run_dir, session,
                                   **trainer_kwargs)
    entry = summarize(records, profile, ablations, breakdown)
    summary, paths = write_reports(out_dir, key, entry, records if figures else None)
    return BenchResult(entry=entry, summary=summary, records=records, ablations=ablations, paths=paths)


__all__ = ["BenchResult", "NON_METHOD_PARTS", "TASK_KEYS", "ablation_changes", "apply_overrides", "machine",
           "pick_best", "profile_recipe", "recipe_entry", "resolve_profile", "reusable_runs", "run_benchmark", "run_interleaved",
           "run_leave_one_out", "run_one", "scheduled_recipe", "summarize", "summarize_leave_one_out", "target_key",
           "trainer_factory"]
