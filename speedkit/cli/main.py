"""``speedkit train | launch | methods | export | demo | bench | tune | notebooks``: the command line over the same make_trainer,
benchmark harness and notebooks that everything else uses."""
from __future__ import annotations

import argparse
import contextlib
import sys

from speedkit.version import __version__


def _catalogue() -> str:
    from speedkit.methods import REGISTRY
    from speedkit.models import list_models
    from speedkit.tasks import FOLDER_TASKS, TASKS

    lines = ["tasks (or --task package.module:attr naming a speedkit.Task, or a function returning one):"]
    lines += [f"  {name:<14} {spec.summary} (target {spec.target_metric} {spec.target_value})"
              for name, spec in TASKS.items() if name not in FOLDER_TASKS]
    lines += [f"  {name:<14} {make.__doc__.splitlines()[0]} (needs --data DIR)" for name, make in FOLDER_TASKS.items()]
    lines.append("recipes:")
    lines += [f"  {name:<14} {', '.join(spec.recipes)}" for name, spec in TASKS.items() if name not in FOLDER_TASKS]
    lines.append("models:\n  " + ", ".join(list_models()))
    lines.append("methods:")
    lines += [f"  {name:<18} {cls.CARD.summary}" for name, cls in sorted(REGISTRY.items())]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speedkit", description="Faster PyTorch training by composing "
                                     "speed-up methods.", epilog=_catalogue(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"speedkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a task with a recipe and methods",
                                epilog=_catalogue(), formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--task", default="fashion-mnist",
                       help="a task name (below), or package.module:attr naming a speedkit.Task or a function "
                            "returning one (imported from the current folder too)")
    train.add_argument("--data", help="the folder for image-folder / text-folder (or passed to a task function)")
    train.add_argument("--image-size", type=int, help="image-folder: resize images to this square size (default 32)")
    train.add_argument("--recipe", default="baseline", help="preset to start from (see below), or a recipe file: "
                       "FILE, or FILE:NAME for one of several (copy speedkit/tasks/presets/TASK.yaml to start one)")
    train.add_argument("--model", help="model name, overriding the recipe's")
    train.add_argument("--duration", help="training budget such as 3ep, 500ba, 90s")
    train.add_argument("--methods",
                       help="comma-separated methods, replacing the recipe's (use '' for none)")
    train.add_argument("--precision", choices=["fp32", "bf16", "fp16", "auto"])
    train.add_argument("--batch-size", type=int)
    train.add_argument("--device", default="auto")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--data-fraction", type=float, default=1.0, help="train on this class-balanced fraction")
    train.add_argument("--eval-fraction", type=float, help="evaluate on this fraction of the test set")
    train.add_argument("--target", type=float, help="target value of the task's metric")
    train.add_argument("--stop-at-target", action="store_true", help="end the run when the target is reached")
    train.add_argument("--run-dir", default="runs")
    train.add_argument("--run-name")
    train.add_argument("--autoresume", action="store_true", help="continue the named run from its checkpoint")
    train.add_argument("--download", action="store_true", help="let torchvision download missing data")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--logger", default="", help="comma-separated loggers besides the record and log.jsonl: "
                       "tensorboard, csv, mlflow, wandb (each writes into a folder of that name in the run "
                       "folder; MLFLOW_TRACKING_URI and WANDB_MODE=offline are honoured); replaces the recipe "
                       "file's loggers field ('none': no loggers)")
    train.add_argument("--parallel", default="auto", choices=["auto", "ddp", "fsdp", "none"],
                       help="under torchrun / speedkit launch: ddp (auto) or fsdp; none trains each process alone")
    _add_launch_parser(commands)

    methods = commands.add_parser("methods", help="the method catalogue, from the cards")
    methods.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    methods.add_argument("name", nargs="?", help="show one method's whole card")

    demo = commands.add_parser("demo", help="run notebooks/00_quickstart headlessly: how much sooner the fastest "
                               "preset reaches a target accuracy on Fashion-MNIST than the hand-written baseline")
    demo.add_argument("--duration", help="budget for both runs (default: each recipe's own, as benchmarked)")
    demo.add_argument("--data-fraction", type=float)
    demo.add_argument("--device")
    demo.add_argument("--out", default="runs/demo", help="where the executed notebook, its HTML, PNG figure and "
                      "records go")
    demo.add_argument("--params", help="parameter set: a name under ROOT/params or a folder (default: gpu where "
                      "CUDA is available, else demo)")
    demo.add_argument("--root", help="a speedkit checkout holding notebooks/ and params/ (default: the copy "
                      "installed with speedkit)")
    _add_export_parser(commands)
    _add_bench_parser(commands)
    _add_tune_parser(commands)
    _add_notebooks_parser(commands)
    return parser


def _summary(record) -> str:
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in record.final_metrics.items() if isinstance(v, float))
    reached = record.time_to_target
    target = (f"  {record.target['metric']} {record.target['value']} reached after {reached:.1f}s"
              if record.target and reached is not None else "")
    return (f"{record.status}: {record.timings.get('train_s', 0):.1f}s training "
            f"({record.timings.get('eval_s', 0):.1f}s eval apart)  {metrics}{target}\nrecord: {record.path}")


def _add_export_parser(commands) -> None:
    export = commands.add_parser("export", help="write a run's trained weights for other tools (safetensors, pt)",
                                 description="Writes the weights the run ended with (EMA/SWA averages where it used "
                                             "them) as a plain state dict that safetensors.torch.load_file or "
                                             "torch.load(weights_only=True) reads into a fresh model.")
    export.add_argument("run", help="a run folder (runs/NAME) or a .ckpt file")
    export.add_argument("--format", default="safetensors", choices=["safetensors", "pt"])
    export.add_argument("--out", help="file to write (default: model.safetensors or model.pt in the run folder)")
    export.add_argument("--weights", default="auto", choices=["auto", "model", "ema", "swa"],
                        help="auto: what the run ended with; or one set from the checkpoint")


def _export(args) -> int:
    from speedkit.cli.export import export_weights

    print(export_weights(args.run, out=args.out, format=args.format, weights=args.weights).instructions())
    return 0


def _add_launch_parser(commands) -> None:
    launch = commands.add_parser(
        "launch", help="run a script on N processes per machine with torchrun (DDP in the Trainer)",
        description="A thin front to torchrun (torch.distributed.run): one process per device, each with RANK, "
                    "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; a Trainer in the script then trains "
                    "with DDP (or parallel='fsdp'). One machine: `speedkit launch -n 4 train.py`. Several: run the "
                    "same command on each with --nnodes, --node-rank and a shared --master-addr/--master-port, or "
                    "with --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB.",
        epilog="examples:\n  speedkit launch -n 2 train.py --lr 0.1\n"
               "  speedkit launch -n 2 -m speedkit train --task fashion-mnist --recipe mild\n"
               "  speedkit launch -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("-n", "--nproc-per-node", type=int, default=1, help="processes on this machine (default 1)")
    launch.add_argument("--nnodes", default="1", help="machines taking part, or MIN:MAX for elastic jobs")
    launch.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0 .. nnodes-1")
    launch.add_argument("--master-addr", help="address of the machine with node rank 0 (static rendezvous)")
    launch.add_argument("--master-port", type=int, help="a free port on that machine")
    launch.add_argument("--rdzv-backend", help="rendezvous backend, e.g. c10d (then --rdzv-endpoint, --rdzv-id)")
    launch.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous")
    launch.add_argument("--rdzv-id", help="a job id shared by every machine of the run")
    launch.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, run as with python -m")
    launch.add_argument("script", help="the training script (or module, with -m)")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed on to the script")


def torchrun_args(args) -> list[str]:
    """torchrun's command line for ``speedkit launch``'s arguments."""
    if args.nproc_per_node < 1:
        raise ValueError(f"-n/--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    argv = ["--nproc-per-node", str(args.nproc_per_node), "--nnodes", str(args.nnodes)]
    rendezvous = [args.master_addr, args.master_port, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id]
    if str(args.nnodes) == "1" and all(v is None for v in rendezvous):
        argv.append("--standalone")  # one machine: torchrun picks a free port itself
    else:
        argv += ["--node-rank", str(args.node_rank)]
        for flag, value in (("--master-addr", args.master_addr), ("--master-port", args.master_port),
                            ("--rdzv-backend", args.rdzv_backend), ("--rdzv-endpoint", args.rdzv_endpoint),
                            ("--rdzv-id", args.rdzv_id)):
            if value is not None:
                argv += [flag, str(value)]
    if args.module:
        argv.append("--module")
    return argv + [args.script, *args.script_args]


def _launch(args) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    argv = torchrun_args(args)
    try:
        torchrun(argv)
    except ChildFailedError as e:
        print(f"speedkit launch: {e.name} failed:\n{e.format_msg()}", file=sys.stderr)
        return 1
    return 0


def _train(args) -> int:
    from speedkit.core import distributed
    from speedkit.tasks import make_trainer

    record = make_trainer(run_request(args)).fit()
    if distributed.is_main():
        print(_summary(record))
    return 0


def run_request(args):
    """The RunRequest that ``speedkit train``'s flags ask for (the request checks them, naming the field)."""
    from speedkit.tasks import RunRequest

    return RunRequest.build(
        _importable(args.task), args.recipe, data=args.data,
        task_options={"image_size": args.image_size} if args.image_size else None,
        model=args.model, duration=args.duration, methods=args.methods, precision=args.precision,
        batch_size=args.batch_size, device=args.device, seed=args.seed, data_fraction=args.data_fraction,
        eval_fraction=args.eval_fraction, target=args.target, stop_at_target=args.stop_at_target,
        download=args.download, run_dir=args.run_dir, run_name=args.run_name, loggers=_logger_names(args.logger),
        autoresume=args.autoresume, progress_bar=not args.no_progress, console=True,
        parallel=None if args.parallel == "none" else args.parallel)


def _importable(task: str) -> str:
    """``--task module:attr`` imports from the current folder too, as ``python -m`` would (the ``speedkit``
    script's own folder is first on the path, not the user's)."""
    import os

    if ":" in task and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return task


def _logger_names(value: str) -> list[str] | None:
    """``--logger tensorboard,csv`` as a list of names; the Trainer refuses an unknown one, naming the known.
    Not given: None (the recipe's own ``loggers`` field applies); ``none``: no loggers, whatever the recipe says."""
    if value.strip().lower() == "none":
        return []
    return [name.strip() for name in value.split(",") if name.strip()] or None


def _methods(args) -> int:
    import json

    from speedkit.methods import REGISTRY, get_method, methods_table

    if args.name:
        print(json.dumps(get_method(args.name).CARD.to_dict(), indent=2, default=str))
    elif args.markdown:
        print(methods_table())
    else:
        for name, cls in REGISTRY.items():
            print(f"{name:<26} {cls.CARD.domain:<9} {cls.CARD.summary}")
    return 0


def _add_bench_parser(commands) -> None:
    from speedkit.experiments.bench.profiles import PROFILES, TASK_KEYS

    bench = commands.add_parser("bench", help="time-to-accuracy benchmark: baseline and recipes interleaved by seed",
                                description=f"Tasks: {', '.join(f'{k} = {v}' for k, v in TASK_KEYS.items())}. "
                                            "Writes summary.json (merged across tasks), summary.md and figures.")
    bench.add_argument("task", help="vision, language, or a task of your own: a registered name, "
                       "package.module:attr naming a speedkit.Task, or image-folder / text-folder with --data")
    bench.add_argument("--data", help="the folder for image-folder / text-folder (or passed to a task function)")
    bench.add_argument("--image-size", type=int, help="image-folder: resize images to this square size")
    bench.add_argument("--profile", default="cpu", choices=sorted({p for ps in PROFILES.values() for p in ps}))
    bench.add_argument("--seeds", type=int, help="number of seeds (default: the profile's)")
    bench.add_argument("--recipes", help="comma-separated speed-up recipes (default: the profile's)")
    bench.add_argument("--baselines", help="comma-separated baselines to measure them against (default: all of "
                       "the task's, e.g. baseline,plain,plain-bf16)")
    bench.add_argument("--sweep", action="store_true",
                       help="first sweep the learning rate and schedule of the baselines the profile sweeps "
                            "(language: tuned), then run them with the pick")
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
    bench.add_argument("--data-fraction", type=float)
    bench.add_argument("--eval-fraction", type=float)
    bench.add_argument("--eval-interval", help="one evaluation cadence for every run, e.g. 0.25ep, 25ba "
                       "(default: the profile's for the baselines, each recipe's own for the recipes)")
    bench.add_argument("--duration", help="one budget for every recipe (smoke tests)")
    bench.add_argument("--duration-scale", type=float, help="multiply every recipe's budget")
    bench.add_argument("--target", type=float, help="target value of the task's metric")
    bench.add_argument("--out", default="bench/results")
    bench.add_argument("--run-dir", default="runs/bench")
    bench.add_argument("--no-figures", action="store_true")
    bench.add_argument("--reuse", action="store_true",
                       help="take the main runs from --run-dir instead of running them (e.g. to add --leave-one-out)")


def _bench(args) -> int:
    import json
    from pathlib import Path

    from speedkit.experiments.bench import run_benchmark
    from speedkit.experiments.bench.report import task_markdown

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
    options = {"image_size": args.image_size} if args.image_size else None
    result = run_benchmark(_importable(args.task), args.profile, seeds=args.seeds, recipes=args.recipes,
                           baselines=args.baselines, find_budgets=args.find_budgets, budgets=budgets, sweep=args.sweep,
                           sweeps=sweeps, out_dir=args.out,
                           run_dir=args.run_dir, leave_one_out=args.leave_one_out, reuse=args.reuse,
                           profile_steps=args.profile_steps, figures=not args.no_figures, device=args.device,
                           data_fraction=args.data_fraction, eval_fraction=args.eval_fraction,
                           eval_interval=args.eval_interval, duration=args.duration,
                           duration_scale=args.duration_scale, target=args.target, data=args.data,
                           task_options=options)
    print("\n" + task_markdown(result.key, result.entry))
    print("\n" + "\n".join(f"{name}: {path}" for name, path in result.paths.items()))
    return 0


def _add_tune_parser(commands) -> None:
    tune = commands.add_parser(
        "tune", help="search (Optuna) for the recipe that reaches a task's target soonest",
        description="A measured search: the baseline's learning rate and budget are tuned first, then methods "
                    "(on/off and their cards' hyperparameters) and recipe fields, against training time to the "
                    "target; the winner and runner-up are confirmed on fresh seeds beside the tuned baseline. "
                    "Writes OUT/recipe.yaml (for `speedkit train --recipe`), OUT/report.md, OUT/report.html and "
                    "OUT/summary.json. Rerun the same command to continue a search that was stopped or killed. "
                    "Needs: pip install 'torch-speedkit[tune]'. optuna-dashboard, where installed, opens the study.",
        epilog="example:\n  speedkit tune --task fashion-mnist --budget 45m --data-fraction 0.25 "
               "--methods channels_last,label_smoothing,ema,mixup,cutmix,identity_init --out runs/tune-fmnist",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tune.add_argument("--task", default="fashion-mnist", help="a task name, or package.module:attr naming a "
                      "speedkit.Task (or a function returning one); a single worker unless the task is a built-in")
    tune.add_argument("--target", help="a value of the task's metric, or METRIC=VALUE (default: the task's target)")
    tune.add_argument("--budget", default="30m", help="wall clock for the whole search, e.g. 30m, 90s, 1h")
    tune.add_argument("--methods", help="comma-separated methods the search may turn on (default: all that fit)")
    tune.add_argument("--base", default="baseline", help="the recipe the search starts from (a preset or a file)")
    tune.add_argument("--storage", help="Optuna storage: a journal file, a *.db SQLite file or a database URL "
                                        "(default OUT/study.journal); share it to run workers elsewhere")
    tune.add_argument("--study", default="tune", help="study name within the storage")
    tune.add_argument("--out", default="runs/tune", help="folder for the recipe, report and records")
    tune.add_argument("--run-dir", help="where each trial's RunRecord goes (default OUT/runs)")
    tune.add_argument("--data-fraction", type=float, default=1.0, help="train on this class-balanced fraction")
    tune.add_argument("--eval-fraction", type=float, help="evaluate on this fraction of the test set")
    tune.add_argument("--eval-interval", help="evaluation cadence of every trial, e.g. 0.25ep, 50ba")
    tune.add_argument("--device", default="auto")
    tune.add_argument("--workers", type=int, default=1,
                      help="processes working on the study at once; on one machine they share its cores (set "
                           "OMP_NUM_THREADS to cores/workers) and time each other's trials slower")
    tune.add_argument("--seeds", type=int, default=3, help="fresh seeds the winner and runner-up are confirmed on")
    tune.add_argument("--trial-limit", help="most training time of one trial (default: a fifth of the budget)")
    tune.add_argument("--max-trials", type=int, help="stop the search after this many trials")
    tune.add_argument("--max-baseline-trials", type=int, help="stop tuning the baseline after this many trials")
    tune.add_argument("--pruner", default="halving", choices=["halving", "hyperband", "median", "none"],
                      help="stops trials that fall behind at an evaluation (successive halving by default)")
    tune.add_argument("--no-hparams", action="store_true", help="methods on/off only, each at its card's defaults")
    tune.add_argument("--leave-one-out", action="store_true", help="then run the winner without each of its methods")
    tune.add_argument("--runner", help="MODULE:FUNCTION that runs one trial instead of training (advanced)")


def _tune(args) -> int:
    try:
        from speedkit.experiments.tune import tune
        from speedkit.experiments.tune.storage import optuna_module

        optuna_module()
    except ImportError as e:
        print(f"speedkit: error: {e}", file=sys.stderr)
        return 2
    with _stop_on_ctrl_c() as stop:
        result = _run_tune(tune, args, stop.is_set)
    if stop.is_set():
        print(f"speedkit tune: stopped; finished trials are kept in the study and the report is at "
              f"{result.report_path}; the same command continues the search (the trial that was cut short "
              f"runs again)", file=sys.stderr)
        return 130
    confirmation = result.summary["confirmation"]
    if result.recipe is None:
        print("no candidate reached the target on every seed; see the report")
    else:
        speedup, seeds = confirmation.get("speedup_median"), len(confirmation["seeds"])
        print(f"winner: {result.recipe.summary}\nspeed-up over the tuned baseline: "
              f"{'-' if speedup is None else f'{speedup:.2f}x'} "
              f"({f'median of {seeds} seeds' if seeds > 1 else 'one seed'})\n"
              f"recipe: {result.recipe_path}")
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


def _run_tune(tune, args, should_stop):
    return tune(_importable(args.task), target=args.target, budget=args.budget, methods=args.methods, base=args.base,
                storage=args.storage, study_name=args.study, out_dir=args.out, run_dir=args.run_dir,
                data_fraction=args.data_fraction, eval_fraction=args.eval_fraction,
                eval_interval=args.eval_interval, device=args.device, n_workers=args.workers,
                seeds_to_confirm=args.seeds, trial_limit=args.trial_limit, max_trials=args.max_trials,
                max_baseline_trials=args.max_baseline_trials, pruner=args.pruner,
                tune_hparams=not args.no_hparams, leave_one_out=args.leave_one_out, runner=args.runner,
                should_stop=should_stop)


def _add_notebooks_parser(commands) -> None:
    notebooks = commands.add_parser("notebooks", help="run the notebooks and tutorials headlessly with papermill")
    actions = notebooks.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="run every notebook with a parameter set; exit status 1 if any fails")
    run.add_argument("--params", default="cpu-smoke", help="parameter set: a folder under ROOT/params (cpu-smoke, gpu)")
    run.add_argument("--out", default="runs/nb", help="each notebook's records, executed copy and HTML go to OUT/<name>/")
    run.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (names without .ipynb)")
    run.add_argument("--root", help="a checkout holding notebooks/, tutorials/ and params/ (default: the copy "
                     "installed with speedkit)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="override a parameter of every notebook run (VALUE is read as YAML)")
    run.add_argument("--timeout", type=float, help="seconds any one cell may take")


def _notebooks(args) -> int:
    import yaml

    from speedkit.cli.notebooks import format_summary, run_notebooks

    overrides = {name: yaml.safe_load(value) for name, value in args.parameter}
    results = run_notebooks(args.params, out=args.out, root=args.root, only=args.only, overrides=overrides,
                            timeout=args.timeout, progress=print)
    print(format_summary(results))
    return 1 if any(r.failed for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "launch":
            return _launch(args)
        if args.command == "methods":
            return _methods(args)
        if args.command == "export":
            return _export(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "notebooks":
            return _notebooks(args)
        if args.command == "tune":
            return _tune(args)
        if args.command == "demo":
            from speedkit.cli.demo import run_demo

            overrides = {"duration": args.duration, "data_fraction": args.data_fraction, "device": args.device}
            return run_demo(args.root, args.out, {k: v for k, v in overrides.items() if v is not None},
                            params=args.params)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        print(f"speedkit: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
