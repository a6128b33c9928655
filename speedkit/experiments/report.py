"""What the benchmark and the search leave behind, rendered in one module so their pages share one way to write
numbers, tables and the leave-one-out table. The benchmark's: summary.json (merged across tasks), summary.md, the
README's table, figures, and what each preset reached (``speedkit/tasks/presets/reached.json``). The search's: the
winner and its baseline as recipe files, report.md, report.html and summary.json."""
from __future__ import annotations

import datetime as _dt
import html
import importlib.util
import json
from pathlib import Path
from typing import Sequence

import yaml

from speedkit.experiments.compare import machine_text, markdown_table, median_or_none
from speedkit.record.runs import RunRecord, atomic_write_bytes, environment, lower_is_better
from speedkit.record.runs import json_safe as _json_safe
from speedkit.tasks.ladder import task_flags


def _num(value, digits: int = 1, missing: str = "—") -> str:
    """A number as the tables write it, ``missing`` where there is none."""
    return missing if value is None else f"{value:.{digits}f}"


SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


# -- the benchmark's summary.json ------------------------------------------------------------------------------
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


# -- the benchmark's markdown -----------------------------------------------------------------------
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


# -- the benchmark's figures -----------------------------------------------------------------------------------
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


# == the search (speedkit tune) ==================================================================
def reached_entry(config, entry: dict) -> dict:
    """The recipe's ``reached``: what its confirmation runs (its summary entry) measured, in the presets' format."""
    fraction = config.settings.run.data_fraction
    return {"metric": config.metric, "target": config.target,
            "seeds_reached": f"{entry['reached']}/{len(entry['time_to_target_s'])}",
            "time_to_target_s": entry["median_time_to_target_s"], "final": median_or_none(entry["final_metric"]),
            "profile": f"speedkit tune, data_fraction {fraction}, device {config.settings.run.device}",
            "machine": machine_text(environment()),
            "date": _dt.date.today().isoformat()}


# Not "tuned": that is a baseline's name on some tasks (pydocs), and runs of a baseline's name count as baseline runs.
WINNER_NAME = "tune-winner"
BASELINE_NAME = "tune-baseline"  # the baseline the speed-up is measured against


def winner_recipe(config, summary: dict):
    """The confirmed winner as a Recipe (with ``reached`` filled from measurement), or None."""
    confirmation = summary["confirmation"]
    row = confirmation["recipes"].get(confirmation["best_recipe"])
    if row is None:
        return None
    settings = config.settings
    return confirmed_recipe(config, row, WINNER_NAME, f"found by speedkit tune on {settings.run.task} (data_fraction "
                                                      f"{settings.run.data_fraction}): {row['change']}")


def baseline_recipe(config, summary: dict):
    """The baseline the speed-up was measured against (the stronger of the tuned one and the base as given, on
    the confirmation's seeds), as the confirmation ran it, so that a user can run the comparison again."""
    row = reference_baseline(summary["confirmation"])
    return confirmed_recipe(config, row, BASELINE_NAME,
                            f"the baseline speedkit tune measured its speed-up against on {config.settings.run.task}: "
                            f"{row['change'] or 'as it is'}")


def reference_baseline(confirmation: dict) -> dict:
    """The confirmation's entry of the baseline the speed-up is measured against."""
    return confirmation["baselines"][confirmation["strongest_baseline"]]


def confirmed_recipe(config, row: dict, name: str, summary: str):
    """A confirmation candidate as a Recipe file holds it: the search's evaluation cadence, a portable
    precision, and what its confirmation runs ``reached``."""
    from speedkit.tasks.recipes import Recipe

    data = dict(row["recipe"])
    data.update(name=name, precision=portable_precision(data["precision"], config.settings.run.device),
                eval_interval=config.settings.run.eval_interval or data["eval_interval"], summary=summary,
                reached=reached_entry(config, row))
    return Recipe(**data)


def portable_precision(precision: str, device) -> str:
    """The winner's precision as the recipe file says it: ``"auto"`` where that is what auto picks here, so the
    file picks the fast precision wherever it runs rather than keep bf16 on a machine that emulates it (a
    choice against auto stays)."""
    from speedkit.core.devices import resolve_device, resolve_precision

    return "auto" if precision == resolve_precision("auto", resolve_device(device)) else precision


def recipe_yaml(recipe) -> str:
    """``Recipe.to_yaml`` plus the measured ``reached`` (which ``Recipe.from_file`` reads back)."""
    return recipe.to_yaml() + yaml.safe_dump({"reached": recipe.reached}, sort_keys=False)


def write_outputs(config, summary: dict) -> dict:
    out = Path(config.settings.out_dir)
    paths: dict = {"summary": out / "summary.json", "report": out / "report.md"}
    paths["summary"].write_text(json.dumps(summary, indent=1, default=str))
    recipe = winner_recipe(config, summary)
    if recipe is not None:
        paths["recipe"] = out / "recipe.yaml"
        paths["recipe"].write_text(recipe_yaml(recipe))
        paths["recipe_obj"] = recipe
        paths["baseline"] = out / "baseline.yaml"
        paths["baseline"].write_text(recipe_yaml(baseline_recipe(config, summary)))
    paths["report"].write_text(tune_markdown(config, summary, paths.get("recipe")))
    html_path = tune_html(config, summary, out / "report.html")
    if html_path is not None:
        paths["html"] = html_path
    return paths


# -- the search's markdown ------------------------------------------------------------------------------
def tune_markdown(config, summary: dict, recipe_path) -> str:
    confirmation = summary["confirmation"]
    trials = summary["trials"]
    states = {}
    for t in trials:
        states[t["state"]] = states.get(t["state"], 0) + 1
    lines = [f"# speedkit tune: {config.settings.run.task}", "",
             f"Target {config.metric} {config.target}; budget {config.budget_s:.0f}s, used {summary['spent_s']:.0f}s; "
             f"trial limit {config.limit_s:.0f}s of training; data_fraction {config.settings.run.data_fraction}; "
             f"trials: {', '.join(f'{n} {s}' for s, n in sorted(states.items()))}; the baseline: "
             f"`{config.base['name']}` ({config.base.get('summary') or 'as the task has it'}).", "",
             "Times are training wall clock to the target, evaluation excluded. A trial that missed the target "
             "scores limit x (1 + shortfall).", ""]
    shortfall = baseline_shortfall(summary)
    lines += [f"**{shortfall}**", ""] if shortfall else []
    unfinished = baseline_plan_note(summary)
    lines += [f"**{unfinished}**", ""] if unfinished else []
    lines += _confirmation_lines(confirmation, recipe_path, config)
    lines += _time_lines(summary.get("time"))
    lines += ["", "## Best trials of the search", "",
              "Each recipe ranks by its worst seed: the search runs its best so far again on a second seed.", ""]
    lines += trials_table(_by_recipe(trials, ("baseline", "search"))[:12])
    lines += ["", "## Methods", "", f"Searched: {', '.join(summary['methods_searched']) or 'none'}.", ""]
    from speedkit.experiments.tune.space import describe_limit

    lines += [f"- left out `{m}`: {why}" for m, why in summary["left_out"].items()]
    lines += [f"- searched `{key}` only {describe_limit(limit)}: elsewhere in its card's range it finds nothing to "
              f"change in this model" for key, limit in summary.get("hparam_limits", {}).items()]
    settings = config.settings
    lines += ["", f"Study `{settings.study_name}` in `{settings.storage}` (rerun the same command to continue it; "
              f"`optuna-dashboard {settings.storage}` shows it where optuna-dashboard is installed). "
              f"RunRecords: `{settings.run.run_dir}`."]
    return "\n".join(lines) + "\n"


def _task_flags(config) -> str:
    """The flags that name the search's task in a command: a folder task's --data and options too."""
    source = config.task_source or {}
    return task_flags(source.get("task", config.settings.run.task), source.get("data"), source.get("options"))


def baseline_shortfall(summary: dict) -> str | None:
    """What to rerun with when the tuned baseline never reached the target: a speed-up is a ratio of times to a
    target both reach, so against one the baseline misses there is nothing to measure (a folder task's default
    target, set before anyone saw its data, can be out of the baseline's reach there)."""
    runs = [t for t in summary["trials"] if t["phase"] == "baseline" and t["state"] == "complete"
            and t["final"] is not None]
    confirmed = summary["confirmation"]["baselines"].values()
    if not runs or any(t["time_to_target_s"] is not None for t in runs) or any(r["reached"] for r in confirmed):
        return None
    metric, target = summary["target"]["metric"], summary["target"]["value"]
    finals = [t["final"] for t in runs]
    best = min(finals) if lower_is_better(metric) else max(finals)
    return (f"The tuned baseline reached {metric} {target:g} in none of its {len(runs)} run(s) (its best: {best:.4g}), "
            f"so no speed-up towards that target can be measured here; rerun with `--target {best:.4g}`, the "
            f"baseline's own best {metric}.")


def baseline_plan_note(summary: dict) -> str | None:
    """What a baseline plan cut short leaves out of the baseline, and how to give it room: a baseline less tuned
    than the plan would have made it can make the speed-up over it larger than over one tuned to the end."""
    plan = summary.get("baseline_plan") or {"finished": True}
    if plan["finished"]:
        return None
    missing = {"its budget walk": "its budget was not walked down, so it runs at the budget of the rate sweep (a "
                                  "baseline that stops at the target can reach it sooner on a shorter schedule)",
               "the rest of its budget walk": "its budget was walked down only part of the way, and a shorter one "
                                              "may still reach the target, sooner"}.get(
        plan["left"], "its learning rate and schedule were not tuned to the end")
    return (f"The baseline plan stopped after {plan['runs']} runs, at {plan['stopped_by']}, before {plan['left']}: "
            f"{missing}, so the speed-up over it may be larger than over a baseline tuned to the end. The same "
            f"command with a larger `--baseline-share` continues the plan and confirms the winner again beside the "
            f"baseline it tunes.")


def proposal(trial: dict) -> str:
    """Where a trial came from: a starting point, the baseline plan, a move from an earlier trial, a second seed of
    one, or the sampler."""
    if trial.get("start_from"):
        return f"start: {trial['start_from']}"
    if trial.get("plan"):
        return f"baseline plan: {trial['plan']}"
    if trial.get("repeat_of") is not None:
        return f"#{trial['repeat_of']} again, on seed {trial['seed']}"
    return f"move: {trial['move']}" if trial.get("move") else "sampler"


def _by_recipe(trials: list[dict], phases: tuple) -> list[tuple[float | None, dict, list[dict]]]:
    """[(worst objective, trial, its runs)]: each recipe of ``phases`` as the search ranks it (``worst_seed``),
    best first; a recipe that missed on a pruned seed last."""
    by_number = {(t["phase"], t["number"]): t for t in trials}
    rows = [(t["worst_seed"]["value"], t, [by_number[(t["phase"], n)] for n in t["worst_seed"]["runs"]])
            for t in trials if t["phase"] in phases and t.get("worst_seed")]
    return sorted(rows, key=lambda row: (row[0] is None, row[0] or 0.0, row[1]["number"]))


def trials_table(rows: list[tuple[float | None, dict, list[dict]]]) -> list[str]:
    """The report's table of trials, from ``_by_recipe``'s rows."""
    return markdown_table(
        ["phase", "#", "objective (worst seed)", "time to target (s), by seed", "best metric", "change",
         "proposed as"],
        ([t["phase"], t["number"], _num(worst, 2), " / ".join(_num(r["time_to_target_s"]) for r in runs),
          _num(t["final"], 4), t["change"] or "", proposal(t)] for worst, t, runs in rows))


def _time_lines(time: dict | None) -> list[str]:
    if not time:
        return []
    total = max(time["worker_s"], 1e-9)
    return ["", f"## Where the time went ({spent_line(time)})", "", *markdown_table(
        ["what", "runs", "seconds", "share"],
        ([what, time["runs"].get(what, ""), f"{seconds:.0f}", f"{seconds / total:.0%}"]
         for what, seconds in time["seconds"].items()))]


def spent_line(time: dict) -> str:
    """The search's time as the report heads it, which its shares are of: ``1208s``, or with several workers
    ``1208s on 2 workers: 2416 worker-seconds``."""
    workers = time["workers"]
    return f"{time['spent_s']:.0f}s" + (f" on {workers} workers: {time['worker_s']:.0f} worker-seconds"
                                        if workers > 1 else "")


def _row_mark(key: str, row: dict, confirmation: dict) -> str:
    """The confirmation table's mark: which candidate won (the runner-up or a longer budget can) and which
    baseline the speed-up is measured against."""
    if key == confirmation["best_recipe"]:
        return "" if row["role"] == "winner" else " (winner)"
    return " (reference)" if key == confirmation["strongest_baseline"] else ""


def _confirmation_lines(confirmation: dict, recipe_path, config) -> list[str]:
    seeds = confirmation["seeds"]
    lines = [f"## Confirmation on seeds {seeds}", "", *markdown_table(
        ["candidate", "reached", "median time (s)", "times (s)", "median final", "change"],
        ([f"{row['role']}{_row_mark(key, row, confirmation)}", f"{row['reached']}/{len(seeds)}",
          _num(row["median_time_to_target_s"]), ", ".join(_num(t) for t in row["time_to_target_s"]),
          _num(median_or_none(row["final_metric"]), 4), row["change"]]
         for key, row in {**confirmation["baselines"], **confirmation["recipes"]}.items())), ""]
    sessions = confirmation.get("sessions") or {}
    if len(sessions) > 1:
        lines += [f"These runs come from {len(sessions)} sittings of the search: {_sittings(confirmation)}. A pair "
                  f"made in two sittings compares the sittings too (the machine, its load), not the recipes alone: "
                  f"for a speed-up measured side by side, run the recipe files below together on fresh seeds, or "
                  f"the search again in a new `--out`.", ""]
    asked = config.settings.seeds_to_confirm
    if len(seeds) < asked:
        lines += [f"Confirmed on {len(seeds)} of the {asked} seeds asked for: the budget held no "
                  f"more beside the search; a longer budget confirms on every seed.", ""]
    if confirmation["best_recipe"] is None:
        lines.append("No search candidate reached the target on every seed: no recipe is called the winner.")
    else:
        pairs = ", ".join(_num(s, 2) for s in confirmation["recipes"][confirmation["best_recipe"]]["speedup"])
        lines.append(f"Speed-up over the {reference_baseline(confirmation)['role']} (the faster baseline on these "
                     f"seeds; paired by seed): median "
                     f"**{_num(confirmation['speedup_median'], 2)}x** ({pairs}).")
        command = f"speedkit train {_task_flags(config)} --stop-at-target --recipe"
        lines.append(f"Recipe: `{recipe_path}`; run it with `{command} {recipe_path}`, and that baseline "
                     f"with `{command} {recipe_path.with_name('baseline.yaml')}`.")
    if confirmation.get("leave_one_out"):
        lines += ["", f"### The winner's leave-one-out (seed {confirmation['leave_one_out']['seed']})",
                  *leave_one_out_markdown(confirmation["leave_one_out"]),
                  "", "Slowdown above 1: the part pays off here; below 1: the winner is faster without it."]
    return lines


# -- the search's plotly page --------------------------------------------------------------------------------------
def tune_html(config, summary: dict, path: Path) -> Path | None:
    """Every trial on time to target vs final metric, and the search's path; None without plotly."""
    if importlib.util.find_spec("plotly") is None:
        return None
    figures = [trials_figure(summary), path_figure(summary)]
    if summary["confirmation"].get("leave_one_out"):
        figures.append(leave_one_out_figure(summary))
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    title = html.escape(f"speedkit tune: {config.settings.run.task}")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
                    f"<h1>{title}</h1>{''.join(parts)}</body></html>")
    return path


def trials_figure(summary: dict):
    """Every trial that evaluated: time to target (or time trained, when missed) against its best metric."""
    import plotly.graph_objects as go

    target = summary["target"]
    fig = go.Figure()
    for phase, color in (("baseline", "#7f7f7f"), ("search", "#1f77b4")):
        for reached in (True, False):
            rows = [t for t in summary["trials"] if t["phase"] == phase and t["final"] is not None
                    and (t["time_to_target_s"] is not None) == reached]
            fig.add_trace(go.Scatter(
                x=[t["time_to_target_s"] if reached else t["train_s"] for t in rows], y=[t["final"] for t in rows],
                mode="markers", name=f"{phase} ({'reached' if reached else 'missed: time trained'})",
                marker={"color": color, "size": 9, "symbol": "circle" if reached else "circle-open"},
                text=[f"#{t['number']} {t['state']}: {t['change']}" for t in rows], hoverinfo="text+x+y"))
    fig.add_hline(y=target["value"], line_dash="dot", annotation_text="target")
    fig.update_layout(title="Every trial: time to target vs best metric", xaxis_title="training seconds",
                      yaxis_title=target["metric"], height=480)
    return fig


def path_figure(summary: dict):
    """The search's path: each completed trial's objective, and the best so far, by trial number."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for phase, color in (("baseline", "#7f7f7f"), ("search", "#1f77b4")):
        rows = [t for t in summary["trials"] if t["phase"] == phase and t["state"] == "complete"]
        best, bests = float("inf"), []
        for t in rows:
            best = min(best, t["value"])
            bests.append(best)
        fig.add_trace(go.Scatter(x=[t["number"] for t in rows], y=[t["value"] for t in rows], mode="markers",
                                 name=f"{phase} trials", marker={"color": color},
                                 text=[t["change"] for t in rows]))
        fig.add_trace(go.Scatter(x=[t["number"] for t in rows], y=bests, mode="lines", name=f"{phase} best so far",
                                 line={"color": color, "shape": "hv"}))
    fig.update_layout(title="The search's path: objective by trial (lower is faster)", xaxis_title="trial",
                      yaxis_title="objective (s)", yaxis_type="log", height=420)
    return fig


def leave_one_out_figure(summary: dict):
    """The winner's slowdown with each part of its lead over the baseline put back (above 1: the part pays off)."""
    import plotly.graph_objects as go

    rows = summary["confirmation"]["leave_one_out"]["parts"]
    names = list(rows)
    slowdowns = [rows[m]["slowdown"] for m in names]
    fig = go.Figure(go.Bar(x=names, y=[10.0 if s is None else min(s, 10.0) for s in slowdowns],
                           text=["never reached" if s is None else f"{s:.2f}x" for s in slowdowns]))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="no effect")
    fig.update_layout(title="The winner's leave-one-out: time without each part / time with all",
                      yaxis_title="slowdown", height=360)
    return fig
