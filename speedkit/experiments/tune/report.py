"""What ``speedkit tune`` leaves behind: the winner as a recipe file, a markdown report, a plotly page, summary.json."""
from __future__ import annotations

import datetime as _dt
import html
import json
from pathlib import Path

import yaml

from speedkit.experiments.bench.report import leave_one_out_markdown
from speedkit.experiments.compare import machine_text, markdown_table
from speedkit.experiments.tune.confirm import BASELINE_ROLE_NAMES
from speedkit.experiments.tune.space import describe_limit
from speedkit.record.runs import environment, lower_is_better
from speedkit.tasks.ladder import task_flags


def reached_entry(config, winner: dict) -> dict:
    """The recipe's ``reached``: what the confirmation runs measured, in the presets' format."""
    fraction = config.settings.run.data_fraction
    return {"metric": config.metric, "target": config.target,
            "seeds_reached": f"{winner['seeds_reached']}/{len(winner['seeds'])}",
            "time_to_target_s": winner["median_s"], "final": winner["median_final"],
            "profile": f"speedkit tune, data_fraction {fraction}, device {config.settings.run.device}",
            "machine": machine_text(environment()),
            "date": _dt.date.today().isoformat()}


# Not "tuned": that is a baseline's name on some tasks (pydocs), and runs of a baseline's name count as baseline runs.
WINNER_NAME = "tune-winner"
BASELINE_NAME = "tune-baseline"  # the baseline the speed-up is measured against


def winner_recipe(config, summary: dict):
    """The confirmed winner as a Recipe (with ``reached`` filled from measurement), or None."""
    confirmation = summary["confirmation"]
    row = next((r for r in confirmation["candidates"] if r["key"] == confirmation.get("winner")), None)
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
    """The confirmation's row of the baseline the speed-up is measured against."""
    return next(r for r in confirmation["candidates"] if r["key"] == confirmation["baseline"])


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


def write_outputs(config, studies, summary: dict) -> dict:
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
    paths["report"].write_text(markdown(config, summary, paths.get("recipe")))
    html_path = write_html(config, summary, out / "report.html")
    if html_path is not None:
        paths["html"] = html_path
    return paths


# -- markdown -------------------------------------------------------------------------------------------
def _fmt(value, spec: str = ".1f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def markdown(config, summary: dict, recipe_path) -> str:
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
    lines += _confirmation_lines(confirmation, recipe_path, config)
    lines += _time_lines(summary.get("time"))
    lines += ["", "## Best trials of the search", "",
              "Each recipe ranks by its worst seed: the search runs its best so far again on a second seed.", ""]
    lines += trials_table(_by_recipe(trials, ("baseline", "search"))[:12])
    lines += ["", "## Methods", "", f"Searched: {', '.join(summary['methods_searched']) or 'none'}.", ""]
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
    confirmed = [r for r in summary["confirmation"]["candidates"] if r["role"] in BASELINE_ROLE_NAMES]
    if not runs or any(t["time_to_target_s"] is not None for t in runs) or any(r["seeds_reached"] for r in confirmed):
        return None
    metric, target = summary["target"]["metric"], summary["target"]["value"]
    finals = [t["final"] for t in runs]
    best = min(finals) if lower_is_better(metric) else max(finals)
    return (f"The tuned baseline reached {metric} {target:g} in none of its {len(runs)} run(s) (its best: {best:.4g}), "
            f"so no speed-up towards that target can be measured here; rerun with `--target {best:.4g}`, the "
            f"baseline's own best {metric}.")


def proposal(trial: dict) -> str:
    """Where a trial came from: a starting point, a move from an earlier trial, a second seed of one, or the
    sampler."""
    if trial.get("start_from"):
        return f"start: {trial['start_from']}"
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
        ([t["phase"], t["number"], _fmt(worst, ".2f"), " / ".join(_fmt(r["time_to_target_s"]) for r in runs),
          _fmt(t["final"], ".4f"), t["change"] or "", proposal(t)] for worst, t, runs in rows))


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


def _row_mark(row: dict, confirmation: dict) -> str:
    """The confirmation table's mark: which row won (the runner-up or a longer budget can) and which baseline
    the speed-up is measured against."""
    if row["key"] == confirmation.get("winner"):
        return "" if row["role"] == "winner" else " (winner)"
    return " (reference)" if row["key"] == reference_baseline(confirmation)["key"] else ""


def _confirmation_lines(confirmation: dict, recipe_path, config) -> list[str]:
    seeds = confirmation["seeds"]
    lines = [f"## Confirmation on seeds {seeds}", "", *markdown_table(
        ["candidate", "reached", "median time (s)", "times (s)", "median final", "change"],
        ([f"{row['role']}{_row_mark(row, confirmation)}", f"{row['seeds_reached']}/{len(seeds)}",
          _fmt(row["median_s"]), ", ".join(_fmt(t) for t in row["times_s"]), _fmt(row["median_final"], ".4f"),
          row["change"]] for row in confirmation["candidates"])), ""]
    asked = config.settings.seeds_to_confirm
    if len(seeds) < asked:
        lines += [f"Confirmed on {len(seeds)} of the {asked} seeds asked for: the budget held no "
                  f"more beside the search; a longer budget confirms on every seed.", ""]
    if confirmation.get("winner") is None:
        lines.append("No search candidate reached the target on every seed: no recipe is called the winner.")
    else:
        pairs = ", ".join(_fmt(s, ".2f") for s in confirmation["speedups"] or [])
        lines.append(f"Speed-up over the {reference_baseline(confirmation)['role']} (the faster baseline on these "
                     f"seeds; paired by seed): median "
                     f"**{_fmt(confirmation['speedup_median'], '.2f')}x** ({pairs}).")
        command = f"speedkit train {_task_flags(config)} --stop-at-target --recipe"
        lines.append(f"Recipe: `{recipe_path}`; run it with `{command} {recipe_path}`, and that baseline "
                     f"with `{command} {recipe_path.with_name('baseline.yaml')}`.")
    if confirmation.get("leave_one_out"):
        lines += ["", f"### The winner's leave-one-out (seed {seeds[0]})",
                  *leave_one_out_markdown(confirmation["leave_one_out"]),
                  "", "Slowdown above 1: the method pays off here; below 1: the winner is faster without it."]
    return lines


# -- plotly page --------------------------------------------------------------------------------------
def write_html(config, summary: dict, path: Path) -> Path | None:
    """Every trial on time to target vs final metric, and the search's path; None without plotly."""
    try:
        import plotly.graph_objects as go
    except ImportError:
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
    """The winner's slowdown when each of its methods is left out (above 1: the method pays off)."""
    import plotly.graph_objects as go

    rows = summary["confirmation"]["leave_one_out"]["parts"]
    names = list(rows)
    slowdowns = [rows[m]["slowdown"] for m in names]
    fig = go.Figure(go.Bar(x=names, y=[10.0 if s is None else min(s, 10.0) for s in slowdowns],
                           text=["never reached" if s is None else f"{s:.2f}x" for s in slowdowns]))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="no effect")
    fig.update_layout(title="The winner's leave-one-out: time without each method / time with all",
                      yaxis_title="slowdown", height=360)
    return fig
