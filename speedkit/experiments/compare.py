"""Comparing runs: speed-ups, the Pareto frontier and leave-one-out contributions, from RunRecords.

The run board, the benchmark and the notebooks all compare runs through these functions, so a
speed-up means the same thing in every table and figure.

Conventions:
- a run's *time* is its training wall clock until the target was first reached (evaluation excluded),
  ``None`` where it never got there; runs set side by side are timed at one target (``time_at``), read from
  their curves, whatever targets they were made with;
- a speed-up is ``baseline time / run time``; paired by seed when there are several seeds;
- a leave-one-out run carries ``config["ablation"] = {"of": <full run's name>, "left_out": <method>}``.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

from speedkit.record.runs import RunRecord, lower_is_better


def final_metric(record: RunRecord, metric: str | None = None) -> float | None:
    """The run's last evaluated value of ``metric`` (its target metric by default)."""
    metric = metric or (record.target or {}).get("metric")
    if metric is None:
        return None
    value = record.final_metrics.get(metric)
    if value is None and record.evals:
        value = record.evals[-1].get(metric)
    return value


def evaluation_at(record: RunRecord, metric: str, share: float) -> tuple[int, float] | None:
    """(batch, value) of the last evaluation of ``metric`` at or before ``share`` of the run (of its last
    evaluation's batch); None where there is none."""
    evals = [(row["batch"], row[metric]) for row in record.evals
             if row.get(metric) is not None and row.get("batch") is not None]
    if not evals:
        return None
    earlier = [(batch, value) for batch, value in evals if batch <= share * evals[-1][0]]
    return earlier[-1] if earlier else None


def late_gain(record: RunRecord, metric: str | None = None, share: float = 0.25) -> float | None:
    """How far ``metric`` (the run's target metric by default) still moved in the last ``share`` of the run: its
    last evaluation against ``evaluation_at(1 - share)``, signed so that an improvement is positive, for a loss
    too. None without an evaluation on both sides.

    A baseline still gaining at the end of its budget may not have converged: a recipe whose saving is a shorter
    budget is then measured where more epochs still buy accuracy (bench/results/2026-12-04-imagenet-rehearsal/
    README.md, "What a rehearsal's budget can show")."""
    metric = metric or (record.target or {}).get("metric")
    before = evaluation_at(record, metric, 1 - share) if metric is not None else None
    if before is None:
        return None
    last = evaluation_at(record, metric, 1.0)[1]
    return (before[1] - last) if lower_is_better(metric) else (last - before[1])


# The floor of the final-quality tolerance, as a share of the baseline's median final metric: with one seed, or
# seeds that agree closely, an evaluation's own noise still moves the last value by about this much.
FINAL_QUALITY_FLOOR = 0.005


def final_quality(finals: Sequence[float | None], metric: str) -> dict | None:
    """The baseline's final quality, the level every headline speed-up is measured at (bench/README.md, "The
    target rule"): the median of the baseline's final ``metric`` over its seeds, less a tolerance of one seed's
    spread (the range of those finals, max - min, at least ``FINAL_QUALITY_FLOOR`` of the median), towards the
    easier side. By construction every seed of that baseline ends at or beyond it.

    Returns ``{"median_final", "tolerance", "level"}``, or None without a final value."""
    present = [v for v in finals if v is not None]
    if not present:
        return None
    median = statistics.median(present)
    tolerance = max(max(present) - min(present), FINAL_QUALITY_FLOOR * abs(median))
    return {"median_final": median, "tolerance": tolerance,
            "level": median + tolerance if lower_is_better(metric) else median - tolerance}


def at_or_beyond(value: float | None, level: float, metric: str) -> bool:
    """Whether ``value`` of ``metric`` is at ``level`` or better (a rounding's worth short counts as at it)."""
    if value is None:
        return False
    slack = 1e-9 * max(1.0, abs(level))
    return value <= level + slack if lower_is_better(metric) else value >= level - slack


def stricter(metric: str, *levels: float) -> float:
    """The hardest of ``levels`` to reach for ``metric``."""
    return min(levels) if lower_is_better(metric) else max(levels)


def time_to_level(record: RunRecord, level: float, metric: str | None = None,
                  ends_at: float | None = None) -> float | None:
    """Training seconds until ``metric`` (the run's target metric by default) first reached ``level``; None where
    the run never got there, and where its last value is short of ``ends_at`` (default ``level``): a run that
    passes a level and falls back below it by its end has not reached it."""
    metric = metric or (record.target or {}).get("metric")
    ends_at = level if ends_at is None else ends_at
    if metric is None or not at_or_beyond(final_metric(record, metric), ends_at, metric):
        return None
    return next((row.get("wall_s") for row in record.evals if at_or_beyond(row.get(metric), level, metric)), None)


def curve_time_to(curve: Sequence | None, level: float, metric: str) -> float | None:
    """Training seconds until a summary's ``curve`` of one run (its evaluations as ``[wall_s, value]``) first
    reached ``level``; None where it never got there or there is no curve. A summary read back without its runs
    times any level this way."""
    return next((t for t, v in curve or () if at_or_beyond(v, level, metric)), None)


def speedup(baseline_time: float | None, run_time: float | None) -> float | None:
    """baseline / run, or None where either never reached the target."""
    if baseline_time is None or run_time is None or run_time <= 0:
        return None
    return baseline_time / run_time


def paired_speedups(baseline_times: Sequence[float | None], run_times: Sequence[float | None]) -> list[float | None]:
    """Speed-ups seed by seed: the i-th baseline against the i-th run (same seed, run side by side)."""
    if len(baseline_times) != len(run_times):
        raise ValueError(f"pairing needs the same seeds on both sides; got {len(baseline_times)} baseline "
                         f"times and {len(run_times)} run times")
    return [speedup(b, r) for b, r in zip(baseline_times, run_times)]


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that exist; None if none do."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def time_rank(times: Sequence[float | None], finals: Sequence[float | None] = (),
              metric: str | None = None) -> tuple[float, int, float]:
    """The one ranking of runs to a target (the benchmark's best recipe and strongest baseline, the search's
    confirmed baseline); lower ranks first. The rule: the lower median time to the target, a seed that never got
    there counting as infinitely slow (so one lucky seed cannot win); ties (as when nothing reached the target)
    go to the one that reached it on more seeds, then to the better median final ``metric`` (skipped without
    one); ``min`` keeps the first given where all of that is equal."""
    spans = [math.inf if t is None else t for t in times]
    final = median_or_none(finals)
    sign = 1.0 if metric is None or lower_is_better(metric) else -1.0
    return (statistics.median(spans) if spans else math.inf, -sum(t is not None for t in times),
            sign * final if final is not None and metric is not None else math.inf)


def fastest(runs: dict[str, tuple[Sequence, Sequence]], metric: str | None = None) -> str:
    """Of ``{name: (times to target, final metrics)}`` on the same seeds, the first by ``time_rank``: the
    benchmark's best recipe, and the strongest baseline every headline speed-up is measured against."""
    return min(runs, key=lambda name: time_rank(*runs[name], metric))


def machine_text(machine: dict, date: str | None = None) -> str:
    """A run environment (``speedkit.record.runs.environment``) in words: the GPU or else the CPU, torch's
    threads, the torch version and, where given, the date."""
    threads = machine.get("torch_threads", "?")
    return (f"{machine.get('gpu') or machine.get('cpu', 'unknown CPU')}, {threads} thread{'' if threads == 1 else 's'}, "
            f"torch {machine.get('torch', '?')}" + (f", {str(date)[:10]}" if date is not None else ""))


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """The lines of a markdown table: ``header``, its rule, and one line per row of cells (each shown with str)."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header),
            *(f"| {' | '.join(map(str, cells))} |" for cells in rows)]


def baseline_runs(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The runs of one of their task's baseline recipes (``speedkit.tasks.is_baseline``), leave-one-out runs
    left out."""
    from speedkit.tasks.task import is_baseline

    return [r for r in records if r.config.get("recipe") is not None and "ablation" not in r.config
            and is_baseline(r.config.get("task"), r.config["recipe"])]


def common_target(records: Sequence[RunRecord], baseline: RunRecord | None = None) -> dict | None:
    """The one target runs are compared at: ``baseline``'s (default: the latest baseline run's), else the first
    run's that has one; None where no run has a target."""
    baseline = baseline if baseline is not None else latest_baseline(records)
    if baseline is not None and baseline.target:
        return baseline.target
    return next((r.target for r in records if r.target), None)


def time_at(record: RunRecord, target: dict | None) -> float | None:
    """``record``'s training seconds to ``target`` (``{"metric", "value"}``, read from its evaluations, whatever
    target it ran with); None where it never got there or there is no target."""
    return None if not target else record.time_to(target["metric"], target["value"])


def baseline_times(records: Sequence[RunRecord], seed: int | None, target: dict) -> dict[str, float]:
    """Each baseline recipe among ``records`` -> its time to ``target`` on ``seed`` where it ran on that seed, else
    its median over its runs (baselines that never reached it left out)."""
    times: dict[str, list] = {}
    for r in baseline_runs(records):
        times.setdefault(r.config["recipe"], []).append(r)
    found = {}
    for name, runs in times.items():
        paired = [time_at(r, target) for r in runs if seed is not None and r.config.get("seed") == seed]
        found[name] = median_or_none(paired or [time_at(r, target) for r in runs])
    return {name: t for name, t in found.items() if t is not None}


def leave_one_out_baseline_time(records: Sequence[RunRecord], full: RunRecord,
                                baseline: str | None = None) -> float | None:
    """What a leave-one-out's shares split: the time to ``full``'s target of baseline ``baseline`` (None: the
    fastest) on ``full``'s seed, paired as every speed-up is (``baseline_times``: its median where it did not run on
    that seed, as on a run board whose runs carry none)."""
    times = baseline_times(records, full.config.get("seed"), full.target)
    return times.get(baseline) if baseline else min(times.values(), default=None)


def latest_baseline(records: Sequence[RunRecord]) -> RunRecord | None:
    """The last baseline run among ``records``: what speed-ups and dashed curves are drawn against."""
    return (baseline_runs(records) or [None])[-1]


def pareto_front(points: Sequence[tuple[float | None, float | None]], lower_metric_better: bool = False) -> list[int]:
    """Indices of the points no other point beats on both time (lower) and metric, fastest first.

    Points are (time, metric); points missing either are never on the frontier.
    """
    sign = 1.0 if lower_metric_better else -1.0  # turn the metric into something to minimise
    valid = [(t, sign * m, i) for i, (t, m) in enumerate(points) if t is not None and m is not None]
    front, best = [], math.inf
    for t, m, i in sorted(valid):
        if m < best:
            front.append(i)
            best = m
    return front


def slowdown(time_without: float | None, time_with: float) -> float:
    """The one leave-one-out ratio (the benchmark's, the search's, the run board's): time to the target without
    a part / with all of them, above 1 where the part pays off; infinite where the run without it never reached
    the target (the part is needed, by how much no run says). A summary written as JSON holds that infinity as
    null (``speedkit.record.runs.json_safe``)."""
    return math.inf if time_without is None else time_without / time_with


def leave_one_out(records: Sequence[RunRecord], baseline: str | None = None) -> dict[str, dict[str, dict]]:
    """For every full run that has ablations among ``records``: each left-out part's effect.

    Returns ``{full run name: {part: {"time_without_s", "slowdown", "share", "pays_off"}}}``.
    ``slowdown`` is time without the part / time with all of them (``slowdown``, inf if the ablated
    run never reached the target). ``share`` splits the full run's log speed-up over a baseline among the
    records (the recipe named ``baseline``, else the one the parts came from, the marker's ``against``, else the
    fastest), on the full run's seed (``leave_one_out_baseline_time``); None when there is none, or when the run
    without the part never reached the target.
    """
    by_name = {r.name: r for r in records}
    result: dict[str, dict[str, dict]] = {}
    for r in records:
        ablation = r.config.get("ablation")
        if not ablation or ablation.get("of") not in by_name:
            continue
        full = by_name[ablation["of"]]
        if full.time_to_target is not None:  # every run timed at the full run's target, whatever it was made with
            baseline_time = leave_one_out_baseline_time(records, full, baseline or ablation.get("against"))
            result.setdefault(full.name, {})[ablation["left_out"]] = part_effect(
                time_at(r, full.target), full.time_to_target, baseline_time)
    return result


def part_effect(time_without: float | None, time_with: float, baseline_time: float | None = None) -> dict:
    """One left-out part's effect (every leave-one-out table's row): ``slowdown`` (time without / with), and its
    ``share`` of the full run's log speed-up over ``baseline_time`` (None without one, or when the run without
    the part never reached the target)."""
    slower = slowdown(time_without, time_with)
    total = math.log(baseline_time / time_with) if baseline_time and baseline_time > time_with else None
    # A part without which the target is never reached has no finite share: the run says it is
    # needed, not how much of the speed-up it carries, so its share stays None rather than a made-up 1.
    share = math.log(slower) / total if total and not math.isinf(slower) else None
    return {"time_without_s": time_without, "slowdown": slower, "share": share, "pays_off": slower > 1.0}


# What two runs must share for a speed-up between them to mean anything, besides the kind of device: the task
# and its data, the shares of it trained and evaluated on (a run that records none of one is not held against it).
COMPARED_ON = ("task", "data", "data_fraction", "eval_fraction")


def _settings(record: RunRecord) -> dict:
    """The ``COMPARED_ON`` settings ``record`` recorded (a fraction of None, all of the data, is one), and its kind
    of device."""
    found = {key: record.config[key] for key in COMPARED_ON if key in record.config}
    device = record.environment.get("device") or record.config.get("device")
    return {**found, **({"device": str(device).split(":")[0]} if device else {})}


def _said(value) -> str:
    if value is None:
        return "all"  # a fraction of None
    return repr(value.get("path", value)) if isinstance(value, dict) else repr(value)  # a data folder by its path


def other_settings(record: RunRecord, baseline: RunRecord) -> list[str]:
    """What ``record`` was made under that ``baseline`` was not, in words; [] where nothing."""
    mine, theirs = _settings(record), _settings(baseline)
    return [f"{key} {_said(mine[key])}, the baseline's {_said(theirs[key])}" for key in mine
            if key in theirs and mine[key] != theirs[key]]


def compare_table(records: Sequence[RunRecord], baseline: RunRecord | None = None) -> list[dict]:
    """One row per run: methods, final metric, time to the target, speed-up over ``baseline`` (default: the
    latest baseline run). Every run is timed at one target (``common_target``), read from its curve: runs made
    with other targets (the explorer's target changed between runs, runs loaded from another folder) are
    compared at the same level, never a time to one level against a time to another. A run made under other
    settings than the baseline (``other_settings``: another data fraction, device ...) has no speed-up, and
    ``other_settings`` says why."""
    if baseline is None:
        baseline = latest_baseline(records)
    target = common_target(records, baseline)
    metric = target["metric"] if target else None
    base_time = time_at(baseline, target) if baseline is not None else None
    rows = []
    for r in records:
        mine, otherwise = time_at(r, target), other_settings(r, baseline) if baseline is not None else []
        rows.append({
            "name": r.name, "status": r.status, "recipe": r.config.get("recipe"),
            "methods": ", ".join(r.method_names) or "none",
            "params": changed_params(r.methods),
            "metric": metric, "final": final_metric(r, metric), "best": r.best(metric) if metric else None,
            "time_to_target_s": mine, "train_s": r.timings.get("train_s"),
            "speedup": None if otherwise else speedup(base_time, mine) if r is not baseline else (
                1.0 if base_time else None),
            "other_settings": otherwise,
        })
    return rows


def changed_params(methods: list[dict]) -> dict:
    """Each method's parameters that differ from its card's defaults (a record stores them all)."""
    from speedkit.methods import REGISTRY

    changed = {}
    for m in methods:
        card = REGISTRY[m["name"]].CARD if m["name"] in REGISTRY else None
        defaults = {hp.name: hp.default for hp in card.hparams} if card else {}
        diff = {k: v for k, v in m["params"].items() if k not in defaults or defaults[k] != v}
        if diff:
            changed[m["name"]] = diff
    return changed
