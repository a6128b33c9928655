"""``speedkit bench``: the time-to-accuracy benchmark, a task's baselines and recipes interleaved by seed."""
from __future__ import annotations

import argparse

from speedkit.cli.task_flags import add_folder_task_arguments, add_task_argument, folder_options, importable


def add_parser(commands) -> None:
    bench = commands.add_parser("bench", help="time-to-accuracy benchmark: baselines and recipes interleaved by seed",
                                allow_abbrev=False,
                                description="Runs each baseline and speed-up recipe of a task on every seed, "
                                            "interleaved, and reports how much sooner each recipe reaches the "
                                            "target. Writes summary.json (merged across tasks), summary.md and "
                                            "figures. The built-in tasks' results are keyed vision "
                                            "(fashion-mnist) and language (pydocs), names --task also takes.",
                                epilog="example:\n  speedkit bench --task fashion-mnist --seeds 3 --recipes hot "
                                       "--baselines plain,plain-bf16",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_task_argument(bench, "to benchmark")
    add_folder_task_arguments(bench)
    bench.add_argument("--profile", default="cpu", help="cpu (default) or gpu: the task's batch sizes, precision, "
                       "compile settings and cadence for that device")
    bench.add_argument("--seeds", type=_seeds, help="number of seeds (3: seeds 0, 1, 2), or which: 0,1 or 4-6 "
                       "(to split a benchmark across processes on one --run-dir, then --reuse it whole; default: "
                       "the profile's)")
    bench.add_argument("--recipes", help="comma-separated speed-up recipes (default: the profile's)")
    bench.add_argument("--baselines", help="comma-separated baselines to measure them against (default: all of "
                       "the task's, e.g. baseline,plain,plain-bf16)")
    bench.add_argument("--sweep", action="store_true",
                       help="first sweep the learning rate and schedule of the baselines the profile sweeps "
                            "(language: tuned; a task whose profile names none: each baseline's own rate x1, x0.5, "
                            "x2, with its own schedule or a linear decay after the same warmup, the grid tune's "
                            "baseline plan tries; past the grid's edge while the edge wins), then run them with the "
                            "pick")
    bench.add_argument("--sweeps", help="a <task>_sweeps.json from an earlier --sweep: run the swept baselines "
                       "with its picks")
    bench.add_argument("--find-budgets", action="store_true",
                       help="first search each baseline's shortest budget (in whole epochs, or the profile's "
                            "budget step) that reaches the target in every seed, then run the baselines with it "
                            "(the search is saved as <out>/<task>_budgets.json)")
    bench.add_argument("--budgets", help="a <task>_budgets.json from an earlier --find-budgets: run the baselines "
                       "with the budgets it found")
    bench.add_argument("--leave-one-out", action="store_true", help="ablate each part of the best recipe")
    bench.add_argument("--profile-steps", type=int, default=0, help="profile this many steps of the best recipe")
    bench.add_argument("--device", help="device, overriding the profile's")
    bench.add_argument("--data-fraction", type=float, help="train on this class-balanced fraction (default: all)")
    bench.add_argument("--eval-fraction", type=float, help="evaluate on this fraction of the test set "
                       "(default: the profile's)")
    bench.add_argument("--eval-interval", help="one evaluation cadence for every run, e.g. 0.25ep, 25ba "
                       "(default: the profile's for the baselines, each recipe's own for the recipes)")
    bench.add_argument("--duration", help="one budget for every recipe (smoke tests)")
    bench.add_argument("--duration-scale", type=float, help="multiply every recipe's budget")
    bench.add_argument("--target", type=float, help="target value of the task's metric (with --reuse: the runs "
                                                    "are judged at it, whatever target they ran with)")
    bench.add_argument("--out", default="bench/results", help="where summary.json, summary.md and the figures go "
                       "(default bench/results)")
    bench.add_argument("--run-dir", default="runs/bench", help="where each run's folder goes (default runs/bench)")
    bench.add_argument("--no-figures", action="store_true", help="write no figures (plotly's image export is slow)")
    bench.add_argument("--reuse", action="store_true",
                       help="take the main runs from --run-dir instead of running them (e.g. to add --leave-one-out)")
    bench.add_argument("--only", help="comma-separated recipes to run now; the others' runs are taken from --run-dir "
                                      "as --reuse takes them (to measure a changed recipe against the runs made)")


def _seeds(text: str) -> int | list[int]:
    """``--seeds``: a count, a comma-separated list or an inclusive range."""
    try:
        if "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        elif "-" in text[1:]:
            first, last = (int(part) for part in text.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = int(text)
    except ValueError:
        seeds = None
    valid = seeds >= 1 if isinstance(seeds, int) else \
        bool(seeds) and min(seeds) >= 0 and len(set(seeds)) == len(seeds)
    if not valid:
        raise argparse.ArgumentTypeError(f"{text!r} is not seeds; give a count (3), a list (0,1) or a range (4-6) of "
                                         f"distinct seeds 0 or above")
    return seeds


def run(args) -> int:
    import json
    from pathlib import Path

    from speedkit.experiments.bench import run_benchmark
    from speedkit.experiments.report import task_markdown

    def earlier_result(path, flag, writer):
        if not path:
            return None
        try:
            return json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{flag} {path}: cannot read it ({e}); pass the <task>_{flag[2:]}.json that "
                             f"{writer} wrote") from None

    budgets = earlier_result(args.budgets, "--budgets", "--find-budgets")
    sweeps = earlier_result(args.sweeps, "--sweeps", "--sweep")
    options = folder_options(args)
    result = run_benchmark(importable(args.task), args.profile, seeds=args.seeds, recipes=args.recipes,
                           baselines=args.baselines, find_budgets=args.find_budgets, budgets=budgets, sweep=args.sweep,
                           sweeps=sweeps, out_dir=args.out,
                           run_dir=args.run_dir, leave_one_out=args.leave_one_out, reuse=args.reuse,
                           profile_steps=args.profile_steps, figures=not args.no_figures, device=args.device,
                           data_fraction=args.data_fraction, eval_fraction=args.eval_fraction,
                           eval_interval=args.eval_interval, duration=args.duration,
                           duration_scale=args.duration_scale, target=args.target, data=args.data,
                           task_options=options, only=args.only)
    print("\n" + task_markdown(result.key, result.entry))
    print("\n" + "\n".join(f"{name}: {path}" for name, path in result.paths.items()))
    return 0
