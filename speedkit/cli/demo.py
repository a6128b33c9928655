"""The demo: notebooks/00_quickstart.ipynb run headlessly, then where its outputs are and the speed-up.

The quickstart trains the hand-written baseline and the fastest vision preset of the committed benchmark
(``hot``) on Fashion-MNIST, each until it reaches a target accuracy, with the same seed, initial weights and
test set, and reports how much sooner the preset got there. ``make demo`` and ``speedkit demo`` run it with
the ``params/demo`` set (``params/gpu`` where CUDA is available), show each cell as it starts and the runs'
progress lines while it runs, and end with the ratio, the figure's path and the executed notebook's.

The demo's target is lower than the benchmark's (0.80 in ``params/demo`` against 0.92), and each run keeps
the budget it was benchmarked with (the schedule follows it), stopping at the target. Its ratio is therefore
printed beside the committed benchmark's figure for the full target, each named, so one is not taken for the
other; the demo's last lines set it beside the committed benchmark's ratio at the demo's own target where the
committed summary timed that level or kept its runs' curves, and otherwise say plainly that the two targets
differ. On a busy machine one pair says little, so the demo runs up to ``repeats`` pairs interleaved
(baseline, preset, baseline, ...) and reports the median ratio with its spread. The number of pairs follows
the machine: with ``time_budget_s`` (180 in ``params/demo``) another pair starts only while the pairs so far
say it fits, so a slow CPU runs one pair in about three minutes of training and a fast one three. It says when
the machine was busy (load average against cores; a calibration matmul timed before and after the runs).
What the notebook imports to do all this lives in ``speedkit.ui.notebook_helpers``, not here.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import json

# The measurement and the notebook helpers are imported where used, so that the command line's parser, built
# from add_parser below, imports nothing heavy.

QUICKSTART = "00_quickstart"
FIGURE = f"{QUICKSTART}.png"  # beside the executed notebook


def add_parser(commands) -> None:
    demo = commands.add_parser("demo", allow_abbrev=False,
                               help="the headline: how much sooner the fastest preset "
                                    "reaches a target accuracy on Fashion-MNIST than the hand-written baseline")
    demo.add_argument("--duration", help="budget for both runs (default: each recipe's own, as benchmarked)")
    demo.add_argument("--data-fraction", type=float, help="train on this class-balanced fraction (default: the "
                      "parameter set's)")
    demo.add_argument("--device", help="device for both runs (default: the parameter set's)")
    demo.add_argument("--out", default="runs/demo", help="where the executed notebook, its HTML, PNG figure and "
                      "records go")
    demo.add_argument("--params", help="parameter set: a name under ROOT/params or a folder (default: gpu where "
                      "CUDA is available, else demo)")
    demo.add_argument("--root", help="a speedkit checkout holding notebooks/ and params/ (default: the copy "
                      "installed with speedkit)")


def run(args) -> int:
    overrides = {"duration": args.duration, "data_fraction": args.data_fraction, "device": args.device}
    return run_demo(args.root, args.out, {k: v for k, v in overrides.items() if v is not None}, params=args.params)


def run_demo(root: str | Path | None = None, out: str | Path = "runs/demo", overrides: dict | None = None,
             params: str | Path | None = None) -> int:
    """Execute the quickstart notebook; print where the executed notebook, its HTML and figure are, and the
    ratio. ``root``: a checkout (default: the copy installed with speedkit); ``params``: a set name or a
    folder (default: ``gpu`` where CUDA is available, else ``demo``)."""
    from speedkit.cli.notebooks import run_notebooks
    from speedkit.cli.shipped import notebook_root
    from speedkit.experiments.measure import Measurement
    from speedkit.record.runs import AS_ASKED, load_records
    from speedkit.ui.notebook_helpers import speedup_summary

    root = notebook_root(root)
    params = params or default_params()
    print(f"running {root / 'notebooks' / (QUICKSTART + '.ipynb')} headlessly (papermill) with the {params} "
          f"parameters; each cell and the runs' progress follow ...", flush=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = run_notebooks(params, out=out, root=root, only=[QUICKSTART], overrides=overrides,
                           stream=lambda line: print(line, flush=True))[0]
    print(f"executed notebook: {result.executed}\nHTML:              {result.html}")
    figure = Path(result.out_dir) / FIGURE
    if figure.exists():
        print(f"figure (PNG):      {figure}")
    # this demo's runs only (earlier demos' records share the folder), in the order they ran
    runs = sorted((r for r in load_records(result.out_dir) if r.status in AS_ASKED and r.created >= started),
                  key=lambda r: r.created)
    baselines = [r for r in runs if r.config.get("recipe") == "baseline"]
    recipes = [r for r in runs if r.config.get("recipe") != "baseline"]
    if baselines and len(baselines) == len(recipes) and all(r.time_to_target is not None for r in runs):
        # the quickstart's pairs as its Measurement held them, so the ratio is the one it printed
        pairs = {"baseline": baselines, recipes[0].config.get("recipe", recipes[0].name): recipes}
        print(speedup_summary(Measurement.of_runs(pairs, ["baseline"]))[1])
        print(committed_at_target(root, pairs, recipes[0].target["value"]))
    if runs:  # what "three minutes of training" is checked against
        print(f"training: {sum(r.timings.get('train_s', 0.0) for r in runs):.0f} s over {len(runs)} runs (evaluation and "
              f"set-up apart); the notebook took {result.seconds:.0f} s")
    if result.failed:
        print(f"the quickstart failed: {result.error}")
        return 1
    return 0


def committed_at_target(root: Path, pairs: dict, target: float, task: str = "fashion-mnist") -> str:
    """The committed benchmark's ratio for the demo's recipe against the hand-written baseline at the demo's own
    target, paired by seed from its recorded times to that level or from its runs' curves, where it has either;
    otherwise a line saying plainly that its figure is at another target (and at which final quality), so one is
    not read as the other."""
    from speedkit.experiments.compare import median_or_none, paired_speedups
    from speedkit.ui.notebook_helpers import SUMMARY, TASK_KINDS

    recipe = next(name for name in pairs if name != "baseline")
    path = Path(root) / SUMMARY
    entry = json.loads(path.read_text()).get(TASK_KINDS.get(task, task)) if path.exists() else None
    if entry is None or recipe not in entry.get("recipes", {}) or "baseline" not in entry.get("baselines", {}):
        return f"the committed benchmark ({path}) has no {task} run of {recipe} beside the baseline to set beside this"
    metric, key = entry["target"]["metric"], f"{target:g}"
    recipe_times, baseline_times = (_times_to(entry["recipes"][recipe], key, target, metric),
                                    _times_to(entry["baselines"]["baseline"], key, target, metric))
    if recipe_times is not None and baseline_times is not None:
        ratios = [r for r in paired_speedups(baseline_times, recipe_times) if r is not None]
        shown = "never reached there" if not ratios else f"{median_or_none(ratios):.2f}x sooner"
        seeds = len(entry["seeds"])
        pairs = f"{seeds}" if len(ratios) == seeds else f"the {len(ratios)} of {seeds}"
        return (f"committed benchmark at this demo's target, {metric} {key}: {recipe} {shown} than baseline "
                f"(median of {pairs} paired seeds where both reached it; {path})")
    timed = ", ".join(sorted(entry["baselines"]["baseline"]["time_to"]))
    full = entry["recipes"][recipe]["speedup_median_vs"]["baseline"]
    fq = entry.get("final_quality") or {}
    level = (f", at or beyond {fq['baseline']}'s final quality" if fq.get("is_target") else
             f", below {fq['baseline']}'s final quality {fq['value']:.4g}" if fq else "")
    return (f"the committed benchmark's {recipe} is {full:.2f}x sooner than baseline to {metric} "
            f"{entry['target']['value']:g}{level}: a different target from this demo's {key} (its records time "
            f"{timed} only), so the two ratios are not the same measurement ({path})")


def _times_to(runs: dict, key: str, target: float, metric: str) -> list | None:
    """A committed entry's times to ``target``, seed by seed: those it timed, else read from the runs' curves
    (which summaries keep since 2026-12-05); None where it has neither."""
    from speedkit.experiments.compare import curve_time_to

    if key in runs["time_to"]:
        return runs["time_to"][key]
    return [curve_time_to(curve, target, metric) for curve in runs["curve"]] if "curve" in runs else None


def default_params() -> str:
    """The parameter set for this machine: ``gpu`` where CUDA is available, else ``demo`` (two CPU cores)."""
    import torch

    return "gpu" if torch.cuda.is_available() else "demo"
