"""The one summary of measured runs: records in, the benchmark's numbers out.

A benchmark's main runs and a search's confirmation runs are summarised here alike: each recipe's runs become
an entry (``recipe_entry``: times, finals and costs in seed order), each entry gains its speed-ups paired by seed
against every baseline (``add_speedups``), and ``judge`` names the strongest baseline and the fastest recipe that
held the target in every seed (``pick_best``). A benchmark also judges every run at its strongest baseline's final
quality (``add_final_quality``), since its runs train their whole budgets; a search's runs stop at the target.
"""
from __future__ import annotations

from typing import Callable, Sequence

from speedkit.experiments.compare import (at_or_beyond, curve_time_to, final_metric, final_quality, late_gain,
                                          median_or_none, paired_speedups, stricter, time_to_level)
from speedkit.experiments.measure import Measurement
from speedkit.record.runs import RunRecord, lower_is_better


def seed_of(record: RunRecord) -> int:
    return record.config.get("seed", record.config.get("bench", {}).get("seed"))


def by_seed(records: Sequence[RunRecord], seeds: Sequence[int], value: Callable[[RunRecord], object]) -> list:
    """``value(record)`` for each seed in order; None for a seed without a run."""
    found = {seed_of(r): r for r in records}
    return [value(found[s]) if s in found else None for s in seeds]


def sittings(records: Sequence[RunRecord], sitting_of: Callable[[RunRecord], str],
             name_of: Callable[[RunRecord], str]) -> dict[str, list[str]]:
    """``{sitting: the names whose runs it made}``, in the order the sittings made their first runs (a sitting is
    named by ``sitting_of``: a benchmark's session, a tune call, each labelled by the time it started). One sitting
    when every run was made side by side; more when a benchmark ran a recipe later (``--only``) or a search was
    continued: a pair made in two sittings compares the sittings too."""
    found: dict[str, set] = {}
    first: dict[str, str] = {}
    for record in records:
        sitting = str(sitting_of(record))
        found.setdefault(sitting, set()).add(name_of(record))
        first[sitting] = min(first.get(sitting, record.created), record.created)
    return {sitting: sorted(found[sitting]) for sitting in sorted(found, key=lambda s: (first[s], s))}


WORK_UNITS = ("batch", "sample", "token")


def recipe_entry(records: Sequence[RunRecord], seeds: Sequence[int], metric: str, value: float,
                 targets: Sequence[float] = ()) -> dict:
    """One recipe's runs towards ``metric`` ``value``, every list in seed order (None where a seed has no run or
    never got there); ``targets``: more levels whose times ``time_to`` holds."""
    return {
        "runs": by_seed(records, seeds, lambda r: r.name),
        "methods": records[0].method_names if records else [],
        "time_to_target_s": by_seed(records, seeds, lambda r: r.time_to(metric, value)),
        "final_metric": by_seed(records, seeds, lambda r: final_metric(r, metric)),
        "late_gain": by_seed(records, seeds, late_gain),  # whether a baseline had converged (compare.late_gain)
        # data_s: the part of train_s taking batches
        **{key: by_seed(records, seeds, lambda r, k=key: r.timings.get(k))
           for key in ("train_s", "eval_s", "setup_s", "data_s", "compile_s")},
        "flops_fraction_of_peak": by_seed(records, seeds, lambda r: median_or_none(
            row.get("throughput/fraction_of_peak") for row in r.steps)),
        "time_to": {f"{t:g}": by_seed(records, seeds, lambda r, t=t: r.time_to(metric, t)) for t in targets},
        # counted work to the target, which a busy machine cannot change (a smoke test's speed check reads it)
        "work_to_target": {unit: by_seed(records, seeds, lambda r, u=unit: r.time_to(metric, value, x=u))
                           for unit in WORK_UNITS},
        "budget": records[0].config.get("recipe_spec", {}).get("duration") if records else None,
        # each evaluation's (training seconds, metric): the time to any other level, read from the summary alone
        "curve": by_seed(records, seeds, lambda r: [[row["wall_s"], row[metric]] for row in r.evals
                                                     if row.get("wall_s") is not None and row.get(metric) is not None]),
    }


def add_speedups(entry: dict, name: str, measured: Measurement, strongest: str) -> None:
    """Paired by seed against every baseline (``Measurement.ratios``); a seed where either side never reached
    the target has no speed-up. ``speedup`` and ``speedup_median`` are against the strongest baseline."""
    entry["median_time_to_target_s"] = median_or_none(entry["time_to_target_s"])
    entry["reached"] = sum(t is not None for t in entry["time_to_target_s"])
    entry["speedup_vs"] = {baseline: measured.ratios(name, baseline) for baseline in measured.baselines}
    entry["speedup_median_vs"] = {name: median_or_none(v) for name, v in entry["speedup_vs"].items()}
    entry["speedup"] = entry["speedup_vs"][strongest]
    entry["speedup_median"] = entry["speedup_median_vs"][strongest]


def holds_target(entry: dict, metric: str, target: float) -> bool:
    """Reached the target in every seed and still at or above it at the end of the budget."""
    def at_target(value):
        return value is not None and (value <= target if lower_is_better(metric) else value >= target)

    return (bool(entry["time_to_target_s"]) and all(t is not None for t in entry["time_to_target_s"])
            and all(at_target(v) for v in entry["final_metric"]))


def pick_best(recipes: dict[str, dict], metric: str, target: float | None = None) -> str | None:
    """The fastest recipe to the target (``compare.time_rank``). With ``target``, only recipes that hold it
    (``holds_target``) can be best, and there may be none."""
    held = [name for name, entry in recipes.items() if target is None or holds_target(entry, metric, target)]
    return as_measurement(recipes).fastest(held, metric)


def as_measurement(entries: dict[str, dict], baselines: Sequence[str] = (), seeds: Sequence[int] = ()) -> Measurement:
    """Summary entries (each's lists in seed order) as the ``Measurement`` they record."""
    return Measurement.read_back({name: e["time_to_target_s"] for name, e in entries.items()},
                                 {name: e["final_metric"] for name, e in entries.items()}, baselines, seeds)


def judge(baselines: dict[str, dict], recipes: dict[str, dict], seeds: Sequence, metric: str,
          target: float) -> dict:
    """Side by side, in place: every entry's speed-ups over each baseline (``add_speedups``); returns the strongest
    baseline (the fastest on these seeds), the best recipe (``pick_best``: it holds the target in every seed) and
    that recipe's median speed-up over the strongest baseline."""
    measured = as_measurement({**baselines, **recipes}, tuple(baselines), seeds)
    strongest = measured.strongest_baseline(metric)
    for name, entry in {**baselines, **recipes}.items():
        add_speedups(entry, name, measured, strongest)
    best = pick_best(recipes, metric, target)
    return {"strongest_baseline": strongest, "best_recipe": best,
            "speedup_median": recipes[best]["speedup_median"] if best else None}


FINAL_QUALITY_RULE = ("the strongest baseline's median final metric over its seeds, less one seed's spread (the "
                      "range of those finals, at least 0.5% of their median), towards the easier side; where the "
                      "target asks for more, the target; a seed that ends short of the final quality has not "
                      "reached it, whenever it passed it")


def add_final_quality(entry: dict, by_recipe: dict[str, Sequence[RunRecord]] | None = None) -> dict:
    """Judge a summary entry at its strongest baseline's final quality (``compare.final_quality``; where the
    target is stricter, at the target, a seed still counting where it ends at or beyond the final quality), in
    place: each baseline's and recipe's ``final_quality`` (seeds that
    reached it, each seed's time to it, paired speed-ups over the strongest baseline) and the entry's (the level,
    how it was set, the fastest recipe that reached it in every seed and its median speed-up).

    A seed that ends short of the level has not reached it, whenever it passed it. Times come from the runs'
    evaluations (``by_recipe``: records by recipe name); an entry read back without its runs has them only where
    the level is its target or where it holds each run's ``curve`` (summaries written since), and says
    ``times_recorded: false`` otherwise (who reached it is known from the finals alone)."""
    metric, target, seeds = entry["target"]["metric"], entry["target"]["value"], entry["seeds"]
    strongest = entry["strongest_baseline"]
    quality = final_quality(entry["baselines"][strongest]["final_metric"], metric)
    value = target if quality is None else stricter(metric, quality["level"], target)
    ends_at = value if quality is None else quality["level"]  # where a seed must end: the final quality
    runs = {**entry["baselines"], **entry["recipes"]}
    curves = all("curve" in r for r in runs.values())
    recorded = by_recipe is not None or curves or value == target
    for name, r in runs.items():
        ends_there = [at_or_beyond(f, ends_at, metric) for f in r["final_metric"]]
        if by_recipe is not None:
            times = by_seed(by_recipe[name], seeds, lambda record: time_to_level(record, value, metric, ends_at))
        elif curves:
            times = [curve_time_to(curve, value, metric) if there else None
                     for curve, there in zip(r["curve"], ends_there)]
        elif recorded:  # the level is the target: the times to it are in the entry
            times = [t if there else None for t, there in zip(r["time_to_target_s"], ends_there)]
        else:
            times = [None] * len(seeds)
        r["final_quality"] = {"reached": sum(t is not None for t in times) if recorded else sum(ends_there),
                              "time_s": times}
    strongest_times = runs[strongest]["final_quality"]["time_s"]
    for r in runs.values():
        ratios = paired_speedups(strongest_times, r["final_quality"]["time_s"])
        r["final_quality"].update(speedup=ratios, speedup_median=median_or_none(ratios))
    everywhere = {name: r for name, r in entry["recipes"].items()
                  if recorded and r["final_quality"]["reached"] == len(seeds)}
    best = Measurement.read_back({name: r["final_quality"]["time_s"] for name, r in everywhere.items()},
                                 {name: r["final_metric"] for name, r in everywhere.items()}, ()).fastest(
        list(everywhere), metric)
    entry["final_quality"] = {
        "baseline": strongest, "metric": metric, **(quality or {}), "value": value, "is_target": value == target,
        "rule": FINAL_QUALITY_RULE, "times_recorded": recorded, "best_recipe": best,
        "speedup_median": everywhere[best]["final_quality"]["speedup_median"] if best else None}
    return entry
