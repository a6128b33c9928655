"""What the records say about one method on one task: the explorer's "measured here" beside the card's claim.

Two kinds of runs carry evidence. Tune trials (``config["tune"]``) split into runs with the method
and runs without it; their medians differ by the method and by everything else the search changed
at the same time, so the counts are shown with them. Leave-one-out runs (``config["ablation"]``)
differ from their full run by the method alone.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from speedkit.experiments.compare import common_target, final_metric, leave_one_out, other_settings, time_at
from speedkit.record.runs import RunRecord


def _side(records: list[RunRecord], target: dict | None) -> dict:
    times = [time_at(r, target) for r in records]
    reached = [t for t in times if t is not None]
    finals = [f for f in (final_metric(r, target and target["metric"]) for r in records) if f is not None]
    return {"runs": len(records), "reached": len(reached),
            "median_time_s": statistics.median(reached) if reached else None,
            "median_final": statistics.median(finals) if finals else None}


def method_evidence(records: Sequence[RunRecord], method: str, task: str | None = None) -> dict:
    """``{"with": side, "without": side, "leave_one_out": [slowdown, ...]}`` from the finished runs of ``task``:
    the trials made under the latest one's settings (``compare.other_settings``: data, fractions, device), each
    timed at one target (``compare.common_target``), so that searches made otherwise are not mixed."""
    runs = [r for r in records if r.status not in ("created", "running") and r.target
            and (task is None or r.config.get("task") == task)]
    trials = [r for r in runs if r.config.get("tune") and r.config["tune"].get("phase") == "search"]
    trials = [r for r in trials if not other_settings(r, trials[-1])]
    slowdowns = [parts[method]["slowdown"] for parts in leave_one_out(runs).values() if method in parts]
    target = common_target(trials)
    return {"with": _side([r for r in trials if method in r.method_names], target),
            "without": _side([r for r in trials if method not in r.method_names], target),
            "leave_one_out": slowdowns}


def measured_here(records: Sequence[RunRecord], method: str, task: str | None = None) -> str:
    """One line for the method's row: medians with/without it and how many runs they rest on."""
    evidence = method_evidence(records, method, task)
    parts = []
    with_, without = evidence["with"], evidence["without"]
    if with_["runs"] and without["runs"]:
        parts.append(f"tune trials: with it {_describe(with_)}; without it {_describe(without)}")
    elif with_["runs"]:  # nothing to compare with, but what it reached is still a measurement
        parts.append(f"tune trials, all with it: {_describe(with_)}")
    if evidence["leave_one_out"]:
        slowdowns = evidence["leave_one_out"]
        text = ", ".join("never reached" if s == float("inf") else f"{s:.2f}x" for s in slowdowns)
        parts.append(f"leave-one-out: time without it / with it {text} ({len(slowdowns)} run"
                     f"{'s' * (len(slowdowns) > 1)})")
    return "; ".join(parts) if parts else "not measured here"


def _describe(side: dict) -> str:
    time = "–" if side["median_time_s"] is None else f"{side['median_time_s']:.1f}s"
    final = "" if side["median_final"] is None else f", median final {side['median_final']:.4f}"
    return f"median {time} to target ({side['reached']}/{side['runs']} reached{final})"
