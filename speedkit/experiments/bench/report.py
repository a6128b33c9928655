"""The benchmark's outputs: summary.json (merged across tasks), summary.md, the README's table, figures, and
what each preset reached (``speedkit/tasks/presets/reached.json``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from speedkit.experiments.compare import machine_text, markdown_table, median_or_none
from speedkit.record.runs import RunRecord, atomic_write_bytes, lower_is_better
from speedkit.record.runs import json_safe as _json_safe

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


# -- summary.json ------------------------------------------------------------------------------
def merge_summary(path: str | Path, key: str, entry: dict) -> dict:
    """Put ``entry`` under ``key`` in the summary at ``path``, keeping the other tasks' entries."""
    path = Path(path)
    summary = {}
    if path.exists():
        try:
            summary = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} exists but is not valid JSON ({e}); move it away before benchmarking "
                             f"so the other task's results are not lost") from e
        if not isinstance(summary, dict):
            raise ValueError(f"{path} is not a benchmark summary (expected a JSON object keyed by task)")
    summary[key] = entry
    summary = _json_safe(summary)  # inf/nan (a never-reached slowdown) become null
    atomic_write_bytes(path, json.dumps(summary, indent=1).encode())
    return summary


def write_reports(out_dir: str | Path, key: str, entry: dict,
                  records: Sequence[RunRecord] | None = None) -> tuple[dict, dict[str, Path]]:
    """Merge ``entry`` into summary.json, rewrite summary.md, and draw this task's figures from ``records``."""
    out_dir = Path(out_dir)
    paths = {"summary_json": out_dir / SUMMARY_JSON, "summary_md": out_dir / SUMMARY_MD}
    summary = merge_summary(paths["summary_json"], key, entry)
    atomic_write_bytes(paths["summary_md"], summary_markdown(summary).encode())
    if records:
        paths.update(write_figures(out_dir, key, entry, records))
    return summary, paths


# -- what each preset reached ---------------------------------------------------------------------
def preset_reached(summary: dict, fresh_seeds: dict | None = None) -> dict[str, dict[str, dict]]:
    """task -> recipe -> what it reached in the benchmark: medians over the entry's seeds, the target, the
    budget it ran with, the profile, machine and date; ``fresh_seeds`` (task -> recipe -> ``{"budget",
    "result"}``) adds how a preset did under ``speedkit train`` on seeds the benchmark never used. The recipe
    the entry's leave-one-out ablated gets ``leave_one_out``: each part's time without it over the time with
    it (None: the target was not reached without it), which the search reads as a prior for its moves.

    ``scripts/update_readme.py`` writes this as ``speedkit/tasks/presets/reached.json``, which the presets read.
    """
    fresh_seeds = fresh_seeds or {}
    figures: dict[str, dict[str, dict]] = {}
    for entry in summary.values():
        common = {"metric": entry["target"]["metric"], "target": entry["target"]["value"], "profile": entry["profile"],
                  "machine": machine_text(entry["machine"]), "date": entry["date"][:10]}
        for name, runs in {**entry["baselines"], **entry["recipes"]}.items():
            median_s = median_or_none(runs["time_to_target_s"])  # over the seeds that reached the target
            reached = {**common, "seeds_reached": f"{runs['reached']}/{len(entry['seeds'])}",
                       "time_to_target_s": None if median_s is None else round(median_s, 1),
                       "final": round(median_or_none(runs["final_metric"]), 4), "budget": runs["budget"]}
            if "final_quality" in entry:
                reached["final_quality"] = _preset_final_quality(entry, runs)
            fresh = fresh_seeds.get(entry["task"], {}).get(name)
            if fresh is not None:
                if fresh["budget"] != runs["budget"]:
                    raise ValueError(f"fresh seeds of {entry['task']}:{name} ran {fresh['budget']}, but the benchmark "
                                     f"ran {runs['budget']}; run the fresh seeds again or remove them")
                reached["fresh_seeds"] = fresh["result"]
            ablation = entry.get("leave_one_out") or {}
            if ablation.get("recipe") == name:
                reached["leave_one_out"] = {part: None if row["slowdown"] is None else round(row["slowdown"], 3)
                                            for part, row in ablation["parts"].items()}
            figures.setdefault(entry["task"], {})[name] = reached
    unmeasured = [f"{task}:{name}" for task, runs in fresh_seeds.items() for name in runs
                  if name not in figures.get(task, {})]
    if unmeasured:
        raise ValueError(f"fresh seeds of {unmeasured}, which the benchmark summary has no runs of")
    return figures


def _preset_final_quality(entry: dict, runs: dict) -> dict:
    """What a preset reached at its benchmark's final-quality level: the level and whose it is, the seeds that
    reached it, the median time (None where not timed or not reached) and paired speed-up over that baseline."""
    fq, q, n = entry["final_quality"], runs["final_quality"], len(entry["seeds"])
    median_s = median_or_none(q["time_s"])
    return {"level": round(fq["value"], 4), "baseline": fq["baseline"], "is_target": fq["is_target"],
            "seeds_reached": f"{q['reached']}/{n}", "times_recorded": fq["times_recorded"],
            "time_s": None if median_s is None else round(median_s, 1),
            "speedup": None if q["speedup_median"] is None else round(q["speedup_median"], 3)}


# -- markdown ----------------------------------------------------------------------------------
def _num(value, digits: int = 1, missing: str = "—") -> str:
    return missing if value is None else f"{value:.{digits}f}"


def _spread(values: Sequence[float | None], digits: int = 1) -> str:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return ""
    return f" ({min(present):.{digits}f}–{max(present):.{digits}f})"


def _median_sum(values) -> str:
    return _num(median_or_none(values))


def _speedup_cells(entry: dict, r: dict) -> list[str]:
    """The median paired speed-up (min–max) against each baseline."""
    cells = []
    for name in entry["baselines"]:
        values = r["speedup_vs"][name]
        median = median_or_none(values)
        cells.append(_num(median, 2) + "x" * (median is not None) + _spread(values, 2))
    return cells


def _label(entry: dict, name: str) -> str:
    """A recipe's name in the tables: bold for the headline's recipe (the fastest to the baseline's final quality,
    else, in a summary that predates it, to the target)."""
    best = entry["final_quality"]["best_recipe"] if "final_quality" in entry else entry.get("best_recipe")
    if name == best:
        return f"**{name}**"
    return f"{name} (strongest baseline)" if name == entry.get("strongest_baseline") else name


def quality_text(entry: dict) -> str:
    """What the headline's level is, in words: the strongest baseline's final quality (its median final less the
    tolerance), or the target where that asks for more."""
    fq = entry["final_quality"]
    if "median_final" not in fq:
        return f"the target, {fq['baseline']} having no final value"
    towards = "plus" if lower_is_better(fq["metric"]) else "less"  # towards the easier side
    ended = (f"{fq['baseline']}'s final quality: its median final {fq['median_final']:.4g} {towards} a tolerance "
             f"of {fq['tolerance']:.2g}")
    return f"the target, at or beyond {ended}" if fq["is_target"] else ended


def _level(entry: dict) -> str:
    return f"{entry['target']['metric']} {entry['final_quality']['value']:.4g}"


def _reached_text(entry: dict, name: str) -> str:
    r = {**entry["baselines"], **entry["recipes"]}[name]
    return f"{r['final_quality']['reached']}/{len(entry['seeds'])}"


def quality_headline(key: str, entry: dict) -> str:
    """The headline: the fastest recipe to the strongest baseline's final quality and its median speed-up there;
    where none reached it in every seed, which recipes did on how many seeds."""
    fq, n = entry["final_quality"], len(entry["seeds"])
    if fq["best_recipe"] is not None:
        return (f"{key}: **{fq['best_recipe']}** reaches {_level(entry)} {_num(fq['speedup_median'], 2)}x faster "
                f"(median of paired seeds, {_reached_text(entry, fq['best_recipe'])} seeds) than {fq['baseline']}; "
                f"that level is {quality_text(entry)}.")
    level = f"{_level(entry)} ({quality_text(entry)})"
    everywhere = [name for name, r in entry["recipes"].items() if r["final_quality"]["reached"] == n]
    if everywhere and not fq["times_recorded"]:
        return (f"{key}: {', '.join(everywhere)} ended at or beyond {level} on every seed; the time to it is not in "
                f"this summary (its runs were not kept beside it).")
    reached = ", ".join(f"{name} {_reached_text(entry, name)}" for name in entry["recipes"])
    return f"{key}: no speed-up recipe reached {level} on every seed (seeds that did: {reached}), so no headline."


def target_headline(entry: dict, lower: bool) -> str:
    """The speed-up at the benchmark's target; ``lower``: the target is below the baseline's final quality, said
    as such, with how many seeds of that recipe reached the final quality."""
    target = entry["target"]
    best, strongest = entry.get("best_recipe"), entry.get("strongest_baseline")
    at = f"{'the lower target, ' if lower else ''}{target['metric']} {target['value']:g}"
    if best is None:
        return (f"no speed-up recipe reached {at} in every seed and ended at or above it, so there is no speed-up "
                f"to the target.")
    others = ", ".join(f"{_num(v, 2)}x against {name}" for name, v in entry.get("speedup_vs", {}).items()
                       if name != strongest and v is not None)
    text = (f"**{best}** reaches {at} {_num(entry.get('speedup_median'), 2)}x faster (median of paired seeds) "
            f"than the strongest baseline, {strongest}" + (f"; {others}" if others else ""))
    if lower:
        text += f"; {best} reached {strongest}'s final quality on {_reached_text(entry, best)} seeds"
    return text + "."


def headline(key: str, entry: dict) -> str:
    """The speed-up at the strongest baseline's final quality; where the target is lower, the speed-up at the
    target beside it, said to be at a lower target, never alone."""
    if "final_quality" not in entry:  # a summary written before final quality was judged
        return (f"{key}, at its target only (not judged at the baseline's final quality): "
                f"{target_headline(entry, False)}")
    if entry["final_quality"]["is_target"]:
        return quality_headline(key, entry)
    return quality_headline(key, entry) + " Beside it, " + target_headline(entry, True)


def task_markdown(key: str, entry: dict) -> str:
    """One task's results: a row per recipe (medians over seeds, min–max in brackets)."""
    target = entry["target"]
    extra = [k for k in entry["baseline"]["time_to"] if float(k) != target["value"]]
    n = len(entry["seeds"])
    baselines = list(entry["baselines"])
    lines = [
        f"## {key}: {entry['task']} to {target['metric']} {target['value']:g}",
        "",
        headline(key, entry),
        "",
        *[f"Note: {note}." for note in entry.get("notes", [])],
        f"Profile `{entry['profile']}`, {n} seed{'s' if n != 1 else ''}, {_sittings(entry)}; times are "
        f"training wall clock with a plain evaluation excluded (shown apart) and the extra "
        f"cost of evaluation-time methods and of set-up work at fit start included; setup (data into memory, "
        f"model, surgery) and compile time (also inside training time) are shown apart; speed-ups are "
        f"paired by seed. Machine: {machine_text(entry.get('machine', {}), entry.get('date', '?'))}."
        + data_text(entry.get("data")),
        *quality_lines(entry),
        "",
        *markdown_table(
            ["recipe", "budget", "reached", "time to target (s)", *[f"speed-up vs {b}" for b in baselines], "final",
             *quality_header(entry), "train s", "eval s", "setup s", "compile s",
             *[f"time to {k} (s)" for k in extra]],
            ([_label(entry, name), r.get("budget") or "—", f"{sum(t is not None for t in r['time_to_target_s'])}/{n}",
              _median_sum(r["time_to_target_s"]) + _spread(r["time_to_target_s"]), *_speedup_cells(entry, r),
              _num(median_or_none(r["final_metric"]), 4), *quality_cells(entry, r), _median_sum(r["train_s"]),
              _median_sum(r["eval_s"]), _median_sum(r["setup_s"]), _median_sum(r["compile_s"]),
              *[_median_sum(r["time_to"][k]) for k in extra]]
             for name, r in [*entry["baselines"].items(), *entry["recipes"].items()])),
    ]
    searched = {name: b["budget_search"] for name, b in entry["baselines"].items() if b.get("budget_search")}
    if searched:
        lines += ["", "Baseline budgets, searched (budget: seeds that reached the target): " + "; ".join(
            f"{name} {', '.join(f'{k}: {v}/{n}' for k, v in s['tried'].items())} -> {s['budget']}"
            for name, s in searched.items())]
    swept = {name: b["sweep"] for name, b in entry["baselines"].items() if b.get("sweep")}
    for name, sweep in swept.items():
        lines += ["", f"{name}'s learning rate and schedule, swept on one seed (each run stopped at the target; "
                      f"ranked by batches to it): " + "; ".join(
                          f"lr {t['lr']:g} {t['schedule']['name']}: {_num(t['batches_to_target'], 0, missing='not reached')}"
                          for t in sweep["tried"]) + f" -> lr {sweep['pick']['lr']:g} {sweep['pick']['schedule']['name']}"]
    if entry.get("flops_fraction_of_peak") is not None:
        lines += ["", f"Best recipe's achieved FLOP/s: {100 * entry['flops_fraction_of_peak']:.1f}% of the "
                      f"device's peak (a GPU's dense spec figure, else the measured matmul; record.environment['peak_flops'])."]
    lines += late_gain_markdown(entry)
    lines += leave_one_out_markdown(entry.get("leave_one_out"))
    lines += time_breakdown_markdown(entry.get("time_breakdown"))
    return "\n".join(lines)


def data_text(data: dict | None) -> str:
    """Where the runs' data came from and how much of it they used (a summary written before this says nothing)."""
    if not data:
        return ""
    folder = data.get("folder")
    if isinstance(folder, dict):
        facts = ", ".join(f"{k} {folder[k]}" for k in ("files", "fingerprint") if folder.get(k) is not None)
        where = f"`{folder.get('path', '?')}`" + (f" ({facts})" if facts else "")
    else:
        where = "the task's own data" if folder is None else f"`{folder}`"
    fraction = data.get("data_fraction")
    evaluated = data.get("eval_fraction")
    return (f" Data: {where}, training on {1.0 if fraction is None else fraction:g} of it"
            + ("" if evaluated is None else f", evaluating on {evaluated:g}") + ".")


def quality_lines(entry: dict) -> list[str]:
    """The level the ``final quality`` columns measure, and the rule that sets it."""
    fq = entry.get("final_quality")
    if fq is None:
        return []
    missing = ("" if fq["times_recorded"] else " The runs were not kept beside this summary, so the times to it "
               "are not known; who reached it is read from the seeds' final values.")
    return ["", f"Final quality: {_level(entry)}, {quality_text(entry)}. The rule: {fq['rule']}.{missing}"]


def quality_header(entry: dict) -> list[str]:
    return ["reached final quality", "time to final quality (s)",
            f"speed-up at final quality vs {entry['final_quality']['baseline']}"] if "final_quality" in entry else []


def quality_cells(entry: dict, r: dict) -> list[str]:
    """The ``final quality`` columns: seeds that reached it, the median time (min–max) and paired speed-up."""
    if "final_quality" not in entry:
        return []
    q, n = r["final_quality"], len(entry["seeds"])
    recorded = entry["final_quality"]["times_recorded"]
    median = q["speedup_median"]
    time = _median_sum(q["time_s"]) + _spread(q["time_s"]) if recorded else "not recorded"
    ratio = (_num(median, 2) + "x" * (median is not None) + _spread(q["speedup"], 2)) if recorded else "not recorded"
    if q["reached"] == 0:
        time = ratio = "not reached"
    return [f"{q['reached']}/{n}", time, ratio]


def _sittings(entry: dict) -> str:
    """How the main runs were ordered: one benchmark run, interleaved by seed, or which recipes a later one
    added (each named with the time it started, so a reader sees how far apart they were)."""
    sessions = entry.get("sessions") or {}
    if len(sessions) <= 1:
        return "baselines and recipes interleaved by seed"
    (first, names), *later = sessions.items()
    added = "; then ".join(f"{', '.join(recipes)} (started {session})" for session, recipes in later)
    return f"{', '.join(names)} interleaved by seed (started {first}); then {added}, paired by seed"


def late_gain_markdown(entry: dict) -> list[str]:
    """What each baseline still gained in the last quarter of its budget (``compare.late_gain``), medians over
    seeds: whether the speed-ups above are measured against a baseline that had converged."""
    gains = {name: b.get("late_gain") or [] for name, b in entry["baselines"].items()}
    shown = {name: g for name, g in gains.items() if any(v is not None for v in g)}
    if not shown:
        return []
    return ["", f"Baselines' gain in {entry['target']['metric']} over the last quarter of their budgets (median, "
                f"min–max over seeds): " + "; ".join(f"{name} {median_or_none(g):+.3f}{_spread(g, 3)}"
                                                  for name, g in shown.items())
            + ". A baseline still gaining there may not have converged: a recipe whose saving is a shorter "
              "budget is then measured where more epochs still buy accuracy, and shows less than it would against "
              "a longer-trained baseline."]


def leave_one_out_markdown(table: dict | None) -> list[str]:
    if not table:
        return []
    rerun = " (the full recipe rerun beside its ablations)" if table.get("reference_rerun") else ""
    parts = f"gives one part the baseline's value against {table['against']}" if table.get("against") else \
        "drops one method"
    needed = table.get("not_reached_without") or []
    share_sum = f"; the measurable shares add up to {_num(table['share_sum'], 2)}" if table.get("share_sum") is not None else ""
    if needed:
        share_sum += (f" ({' and '.join(needed)}: without {'it' if len(needed) == 1 else 'either'} the target is "
                      f"not reached within the budget, so no share)")
    lines = ["", f"Leave-one-out from `{table['of']}`{rerun}, time to target {_num(table['time_to_target_s'])} s; "
                 f"each row {parts}{share_sum}:",
             ""]
    return lines + markdown_table(
        ["left out", "time to target (s)", "slowdown", "share of speed-up", "pays off here", "final"],
        ([part, _num(row["time_without_s"], missing="not reached"), _num(row["slowdown"], 2), _num(row["share"], 2),
          {True: "yes", False: "**no**", None: "—"}[row.get("pays_off")], _num(row["final_metric"], 4)]
         for part, row in table["parts"].items()))


def time_breakdown_markdown(breakdown: dict | None) -> list[str]:
    if not breakdown:
        return []
    return ["", f"Where the time goes ({breakdown['recipe']}, {breakdown['steps']} steps):", "", *markdown_table(
        ["phase", "s", "share", "ms per step"],
        ([phase, f"{row['s']:.2f}", "—" if row["share"] is None else f"{100 * row['share']:.1f}%",
          _num(row["per_step_ms"], 2)] for phase, row in breakdown["phases"].items()))]


def summary_markdown(summary: dict) -> str:
    """summary.md: every task in the summary."""
    return "# Time-to-accuracy benchmark\n\n" + "\n\n".join(
        task_markdown(key, entry) for key, entry in summary.items()) + "\n"


# -- figures -----------------------------------------------------------------------------------
_COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")


def metric_curves_figure(records: Sequence[RunRecord], metric: str, target: float | None = None,
                         final_quality: float | None = None):
    """The metric against training wall clock for every run, one colour per recipe, with the target and the
    baseline's final quality (where it differs) as dashed lines."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colours: dict[str, str] = {}
    for record in records:
        recipe = record.config.get("recipe", record.name)
        first = recipe not in colours
        colour = colours.setdefault(recipe, _COLOURS[len(colours) % len(_COLOURS)])
        xs, ys = record.series(metric)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=recipe, legendgroup=recipe,
                                 showlegend=first, line={"color": colour}, hovertext=record.name))
    if target is not None:
        fig.add_hline(y=target, line_dash="dash", annotation_text=f"target {target:g}")
    if final_quality is not None and final_quality != target:
        fig.add_hline(y=final_quality, line_dash="dot", annotation_text=f"baseline's final quality {final_quality:.4g}",
                      annotation_position="bottom right")
    fig.update_layout(xaxis_title="training wall clock (s, evaluation excluded)", yaxis_title=metric)
    return fig


def speedup_figure(entry: dict):
    """Each recipe's speed-up over the strongest baseline at its final quality (at the target in a summary that
    predates it), one point per seed (paired), with its spread; a recipe's label says on how many seeds it
    reached that level, and one that reached it on none has no points."""
    import plotly.graph_objects as go

    fq = entry.get("final_quality")
    fig = go.Figure()
    for name, r in entry["recipes"].items():
        ratios = r["final_quality"]["speedup"] if fq else r["speedup"]
        reached = r["final_quality"]["reached"] if fq else r["reached"]
        values = [v for v in ratios if v is not None]
        fig.add_trace(go.Box(y=values, name=f"{name} ({reached}/{len(entry['seeds'])} reached)", boxpoints="all",
                             pointpos=0))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="baseline")
    level = f"the baseline's final quality, {entry['target']['metric']} {fq['value']:.4g}" if fq else "target"
    fig.update_layout(yaxis_title=f"speed-up to {level} (baseline time / recipe time)", showlegend=False)
    return fig


def write_figures(out_dir: str | Path, key: str, entry: dict, records: Sequence[RunRecord]) -> dict[str, Path]:
    """Standalone HTML figures; plotly.js is written once beside them, so they open offline."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = entry["target"]
    paths = {"curves_html": out_dir / f"{key}_curves.html", "speedup_html": out_dir / f"{key}_speedup.html"}
    level = entry["final_quality"]["value"] if "final_quality" in entry else None
    metric_curves_figure(records, target["metric"], target["value"], level).write_html(
        paths["curves_html"], include_plotlyjs="directory")
    speedup_figure(entry).write_html(paths["speedup_html"], include_plotlyjs="directory")
    return paths
