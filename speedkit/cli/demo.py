"""The demo: notebooks/00_quickstart.ipynb run headlessly, then where its outputs are and the speed-up.

The quickstart trains the hand-written baseline and the fastest vision preset of the committed benchmark
(``hot``) on Fashion-MNIST, each until it reaches a target accuracy, with the same seed, initial weights and
test set, and reports how much sooner the preset got there. ``make demo`` and ``speedkit demo`` run it with
the ``params/demo`` set (``params/gpu`` where CUDA is available), show each cell as it starts and the runs'
progress lines while it runs, and end with the ratio, the figure's path and the executed notebook's.

The demo's target is lower than the benchmark's (0.80 in ``params/demo`` against 0.92), and each run keeps
the budget it was benchmarked with (the schedule follows it), stopping at the target. Its ratio is therefore
printed beside the committed benchmark's figure for the full target, each named, so one is not taken for the
other. On a busy machine one pair says little, so the demo runs up to ``repeats`` pairs interleaved
(baseline, preset, baseline, ...) and reports the median ratio with its spread. The number of pairs follows
the machine: with ``time_budget_s`` (180 in ``params/demo``) another pair starts only while the pairs so far
say it fits, so a slow CPU runs one pair in about three minutes of training and a fast one three. It says when
the machine was busy (load average against cores; a calibration matmul timed before and after the runs).
What the notebook imports to do all this lives in ``speedkit.ui.notebook_helpers``, not here.
"""
from __future__ import annotations

import os  # noqa: F401  (kept: tests patch os.environ through it)
from datetime import datetime, timezone
from pathlib import Path

from speedkit.experiments.measure import Measurement
from speedkit.record.runs import load_records
from speedkit.ui.notebook_helpers import speedup_summary

QUICKSTART = "00_quickstart"
FIGURE = f"{QUICKSTART}.png"  # beside the executed notebook
ENDED = ("target_reached", "completed")  # a run stopped at its target, or one whose budget ran out first


def run_demo(root: str | Path | None = None, out: str | Path = "runs/demo", overrides: dict | None = None,
             params: str | Path | None = None) -> int:
    """Execute the quickstart notebook; print where the executed notebook, its HTML and figure are, and the
    ratio. ``root``: a checkout (default: the copy installed with speedkit); ``params``: a set name or a
    folder (default: ``gpu`` where CUDA is available, else ``demo``)."""
    from speedkit.cli.notebooks import run_notebooks
    from speedkit.cli.shipped import notebook_root

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
    runs = sorted((r for r in load_records(result.out_dir) if r.status in ENDED and r.created >= started),
                  key=lambda r: r.created)
    baselines = [r for r in runs if r.config.get("recipe") == "baseline"]
    recipes = [r for r in runs if r.config.get("recipe") != "baseline"]
    if baselines and len(baselines) == len(recipes) and all(r.time_to_target is not None for r in runs):
        # the quickstart's pairs as its Measurement held them, so the ratio is the one it printed
        pairs = {"baseline": baselines, recipes[0].config.get("recipe", recipes[0].name): recipes}
        print(speedup_summary(Measurement.of_runs(pairs, ["baseline"]))[1])
    if runs:  # what "three minutes of training" is checked against
        print(f"training: {sum(r.timings.get('train_s', 0.0) for r in runs):.0f} s over {len(runs)} runs (evaluation and "
              f"set-up apart); the notebook took {result.seconds:.0f} s")
    if result.failed:
        print(f"the quickstart failed: {result.error}")
        return 1
    return 0


def default_params() -> str:
    """The parameter set for this machine: ``gpu`` where CUDA is available, else ``demo`` (two CPU cores)."""
    import torch

    return "gpu" if torch.cuda.is_available() else "demo"
