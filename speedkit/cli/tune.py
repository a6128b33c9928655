"""``speedkit tune``: an Optuna search for the recipe that reaches a task's target soonest."""
from __future__ import annotations

import argparse
import contextlib
import sys

from speedkit.cli.task_flags import add_folder_task_arguments, add_task_argument, folder_options, importable


def add_parser(commands) -> None:
    tune = commands.add_parser(
        "tune", allow_abbrev=False, help="search (Optuna) for the recipe that reaches a task's target soonest",
        description="A measured search: the baseline's learning rate, schedule and budget are tuned first; then the "
                    "task's presets, and moves from the best recipe so far (add, drop or retune one method, "
                    "change the budget or the learning rate), against training time to the target; the winner "
                    "is confirmed on fresh seeds beside the tuned baseline and the base as given, within the "
                    "budget. "
                    "Writes OUT/recipe.yaml (for `speedkit train --recipe`), OUT/report.md, OUT/report.html and "
                    "OUT/summary.json. Rerun the same command to continue a search that was stopped or killed. "
                    "Needs: pip install 'torch-speedkit[tune]'. optuna-dashboard, where installed, opens the study.",
        epilog="example:\n  speedkit tune --task fashion-mnist --budget 45m --data-fraction 0.25 "
               "--methods channels_last,label_smoothing,ema,mixup,cutmix,identity_init --out runs/tune-fmnist",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_task_argument(tune, "to search on")
    add_folder_task_arguments(tune)
    tune.add_argument("--target", help="a value of the task's metric, or METRIC=VALUE (default: the task's target)")
    tune.add_argument("--budget", default="30m", help="wall clock for the whole search, e.g. 30m, 90s, 1h")
    tune.add_argument("--methods", help="comma-separated methods the search may turn on (default: all that fit)")
    tune.add_argument("--base", help="the baseline the search tunes, measures against and starts from (a preset "
                      "or a file; default: the task's strongest baseline, the last baseline `speedkit recipes` lists)")
    tune.add_argument("--storage", help="Optuna storage: a journal file, a *.db SQLite file or a database URL "
                                        "(default OUT/study.journal); share it to run workers elsewhere")
    tune.add_argument("--study", default="tune", help="study name within the storage")
    tune.add_argument("--out", default="runs/tune", help="folder for the recipe, report and records")
    tune.add_argument("--run-dir", help="where each trial's RunRecord goes (default OUT/runs)")
    tune.add_argument("--data-fraction", type=float, default=1.0, help="train on this class-balanced fraction")
    tune.add_argument("--eval-fraction", type=float, help="evaluate on this fraction of the test set")
    tune.add_argument("--eval-interval", help="evaluation cadence of every trial, e.g. 0.25ep, 50ba")
    tune.add_argument("--device", default="auto", help="auto (default: a GPU when there is one), cpu, cuda, mps")
    tune.add_argument("--workers", type=int, default=1,
                      help="processes working on the study at once; on one machine they share its cores (set "
                           "OMP_NUM_THREADS to cores/workers) and time each other's trials slower")
    tune.add_argument("--seeds", type=int, default=3,
                      help="fresh seeds the winner is confirmed on (fewer where the budget holds no more; default 3)")
    tune.add_argument("--trial-limit", help="most training time of one trial (default: a fifth of the budget)")
    tune.add_argument("--max-trials", type=int, help="stop the search after this many trials")
    tune.add_argument("--max-baseline-trials", type=int, help="stop tuning the baseline after this many runs")
    tune.add_argument("--baseline-share", type=float, default=0.3,
                      help="the part of the budget the baseline plan's runs may take (default 0.3)")
    tune.add_argument("--pruner", default="halving", choices=["halving", "hyperband", "median", "none"],
                      help="stops trials that fall behind at an evaluation (successive halving by default)")
    tune.add_argument("--no-hparams", action="store_true", help="methods on/off only, each at its card's defaults")
    tune.add_argument("--leave-one-out", action="store_true",
                      help="then run the winner with each part of its difference from the reference baseline put "
                           "back, as speedkit bench --leave-one-out does")
    tune.add_argument("--runner", help="MODULE:FUNCTION that runs one trial instead of training (advanced)")


def run(args) -> int:
    try:
        from speedkit.experiments.tune import TuneSettings, tune
        from speedkit.experiments.tune.storage import optuna_module

        optuna_module()
    except ImportError as e:
        print(f"speedkit: error: {e}", file=sys.stderr)
        return 2
    with _stop_on_ctrl_c() as stop:
        result = tune(_tune_settings(TuneSettings, args), should_stop=stop.is_set)
    if stop.is_set():
        print(f"speedkit tune: stopped; finished trials are kept in the study and the report is at "
              f"{result.report_path}; the same command continues the search (the trial that was cut short "
              f"runs again)", file=sys.stderr)
        return 130
    confirmation = result.summary["confirmation"]
    if result.recipe is None:
        print("no candidate reached the target on every seed; see the report")
    else:
        speedup = confirmation["speedup_median"]
        paired = confirmation["recipes"][confirmation["best_recipe"]]["speedup"]
        pairs = sum(p is not None for p in paired)  # the seeds where both reached the target
        seeds = len(confirmation["seeds"])
        basis = f"median of {pairs} seeds" if pairs > 1 else f"{pairs} seed"
        if pairs < seeds:
            basis += f" of {seeds}: the baseline missed the target on the others"
        print(f"winner: {result.recipe.summary}\nspeed-up over the faster baseline: "
              f"{'-' if speedup is None else f'{speedup:.2f}x'} ({basis})\nrecipe: {result.recipe_path}")
    print(f"report: {result.report_path}")
    return 0


@contextlib.contextmanager
def _stop_on_ctrl_c():
    """The first Ctrl-C stops the search at the next batch (finished trials kept, a report written); a
    second one interrupts at once. A KeyboardInterrupt raised anywhere could land inside a storage write."""
    import signal
    import threading

    stop = threading.Event()

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("speedkit tune: stopping at the next batch (Ctrl-C again to quit at once) ...", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _tune_settings(settings_class, args):
    """The search the flags ask for, as the TuneSettings that ``tune`` takes."""
    return settings_class(
        task=importable(args.task), data=args.data, task_options=folder_options(args), target=args.target,
        budget=args.budget, searched_methods=args.methods, base=args.base, storage=args.storage, study_name=args.study,
        out_dir=args.out, run_dir=args.run_dir, data_fraction=args.data_fraction, eval_fraction=args.eval_fraction,
        eval_interval=args.eval_interval, device=args.device, n_workers=args.workers, seeds_to_confirm=args.seeds,
        trial_limit=args.trial_limit, max_trials=args.max_trials, max_baseline_trials=args.max_baseline_trials,
        baseline_share=args.baseline_share, pruner=args.pruner, tune_hparams=not args.no_hparams,
        leave_one_out=args.leave_one_out, runner=args.runner)
