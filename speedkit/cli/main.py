"""``speedkit train | launch | methods | tasks | recipes | demo | export | bench | tune | notebooks | env``: the
command line over the same make_trainer, benchmark harness and notebooks that everything else uses. Building the
parser imports nothing heavy (each command imports what it needs when it runs), so ``--version`` is instant."""
from __future__ import annotations

import argparse
import contextlib
import sys

from speedkit.version import __version__


COMMANDS_EPILOG = """getting started:
  speedkit demo                                     the headline: time to a target, preset against baseline
  speedkit train --task fashion-mnist --recipe hot  train a preset; see speedkit tasks, recipes, methods
  speedkit COMMAND --help                           each command's own flags

exit status:
  0        done (a run that had already ended, resumed, is done too)
  2        refused: a flag, a file or folder, the data, a full or read-only disk, a diverged loss; one line
           names the path or flag and the fix, and nothing of yours was changed beyond the run's own folder
  129/130/143  interrupted by SIGHUP / Ctrl-C / SIGTERM with a checkpoint: the same command with --autoresume
           continues it (a tune search: the same command)
  1        an error in your own code (your task, model or plugin): its traceback is printed
"""


def _parser() -> argparse.ArgumentParser:
    """The whole command line; building it imports nothing heavy, so --version and --help answer at once."""
    parser = argparse.ArgumentParser(prog="speedkit", description="Faster PyTorch training by composing "
                                     "speed-up methods.", epilog=COMMANDS_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"speedkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_parser(commands)
    _add_launch_parser(commands)
    _add_catalogue_parsers(commands)
    _add_demo_parser(commands)
    _add_export_parser(commands)
    _add_bench_parser(commands)
    _add_tune_parser(commands)
    _add_notebooks_parser(commands)
    _add_data_parser(commands)
    commands.add_parser("env", help="what a bug report needs: versions, devices, bf16 speed measured here, data found",
                        allow_abbrev=False)
    return parser


def _add_task_argument(parser, what: str) -> None:
    """The one way every command names a task."""
    parser.add_argument("--task", default="fashion-mnist",
                        help=f"the task {what}: a name from `speedkit tasks` (default fashion-mnist), or "
                             "package.module:attr naming a speedkit.Task or a function returning one (imported "
                             "from the current folder too)")


def _add_folder_task_arguments(parser) -> None:
    parser.add_argument("--data", help="the folder for image-folder / text-folder (or passed to a task function)")
    parser.add_argument("--image-size", type=int,
                        help="image-folder: resize images to this square size (default 32); imagenet: train every "
                             "recipe at this size (default: each recipe's published size at the profile's scale)")
    parser.add_argument("--skip-unreadable", action="store_true",
                        help="image-folder / text-folder: leave out (and count) images that cannot be decoded and "
                             "files that are not text, instead of refusing the folder")
    parser.add_argument("--stream", action="store_true",
                        help="image-folder / text-folder: stream from shards (prepared once, into a cache folder, "
                             "unless --data is a shard folder from `speedkit data prepare`); chosen by itself when "
                             "the images would not fit in memory")
    parser.add_argument("--task-profile", choices=["cpu", "gpu"],
                        help="imagenet / gpt2: cpu (a rehearsal: a narrow model, small inputs) or gpu (the seed's "
                             "real sizes); default: bench's --profile, else gpu where CUDA is available")
    parser.add_argument("--eval-image-size", type=int,
                        help="imagenet: evaluate at this size (FFCV's test evaluates larger than it trains; "
                             "default: each recipe's published size at the profile's scale)")
    parser.add_argument("--no-flips", action="store_true",
                        help="image-folder: a horizontal flip changes these images' labels (digits, letters, "
                             "text), so train without flip augmentation, alternating flips or mirrored test views")


def _add_train_parser(commands) -> None:
    train = commands.add_parser("train", help="train a task with a recipe and methods", allow_abbrev=False,
                                description="Trains one run and writes its folder (record.json, log.jsonl, "
                                            "checkpoints) under --run-dir/--run-name.",
                                epilog="examples:\n  speedkit train --task fashion-mnist --recipe hot\n"
                                       "  speedkit train --task image-folder --data ~/photos --recipe mild\n"
                                       "  speedkit train --recipe my.yaml --run-name first --autoresume",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = train.add_argument_group("what to train")
    _add_task_argument(what, "to train")
    _add_folder_task_arguments(what)
    what.add_argument("--recipe", default="baseline", help="a preset from `speedkit recipes` (default baseline), or "
                      "a recipe file: FILE, or FILE:NAME for one of several (copy speedkit/tasks/presets/TASK.yaml "
                      "to start one)")
    what.add_argument("--model", help="a model name, replacing the recipe's (`speedkit tasks` lists each task's)")
    what.add_argument("--methods", help="comma-separated methods, replacing the recipe's ('' for none; "
                      "`speedkit methods` lists them)")
    how = train.add_argument_group("how long and on what")
    how.add_argument("--duration", help="training budget such as 3ep, 500ba, 90s (default: the recipe's)")
    how.add_argument("--precision", choices=["fp32", "bf16", "fp16", "auto"],
                     help="numeric precision (default: the recipe's); auto measures what is fast here")
    how.add_argument("--batch-size", type=int, help="samples per step (default: the recipe's)")
    how.add_argument("--device", default="auto", help="auto (default: a GPU when there is one), cpu, cuda, cuda:N, mps")
    how.add_argument("--seed", type=int, default=0, help="seeds the weights, the data order and the methods (default 0)")
    how.add_argument("--data-fraction", type=float, default=1.0, help="train on this class-balanced fraction")
    how.add_argument("--eval-fraction", type=float, help="evaluate on this fraction of the test set")
    how.add_argument("--eval-interval", help="how often to evaluate, e.g. 0.25ep, 50ba (default: the recipe's; a "
                     "baseline with --stop-at-target as finely as bench times it); a time to target is read at an "
                     "evaluation, so a finer cadence reads it closer")
    how.add_argument("--target", type=float, help="target value of the task's metric (default: the recipe's or task's)")
    how.add_argument("--stop-at-target", action="store_true", help="end the run when the target is reached")
    how.add_argument("--download", action="store_true", help="let torchvision download missing data")
    how.add_argument("--num-workers", type=int, help="data-loading worker processes for loaders that decode on the "
                     "host (streamed folders, torch DataLoaders); default: none on a CPU, every core but one (at "
                     "most 16) on a GPU")
    how.add_argument("--parallel", default="auto", choices=["auto", "ddp", "fsdp", "none"],
                     help="under torchrun / speedkit launch: ddp (auto) or fsdp; none trains each process alone")
    where = train.add_argument_group("the run folder")
    where.add_argument("--run-dir", default="runs", help="the folder holding run folders (default runs)")
    where.add_argument("--run-name", help="the run's folder name (default: run-DATE-TIME-PID); a name in use is "
                       "refused unless --autoresume or --overwrite says what to do with it")
    where.add_argument("--autoresume", action="store_true",
                       help="continue the named run from its newest good checkpoint (a new name starts afresh)")
    where.add_argument("--overwrite", action="store_true",
                       help="replace the run already in the --run-name folder (its record, log and checkpoints)")
    where.add_argument("--extend-duration", action="store_true",
                       help="with --autoresume: train the run on to a longer --duration (the record notes it)")
    where.add_argument("--save-interval", help="checkpoint every interval of training (default 5m), e.g. 90s, "
                       "200ba, 1ep, 0.25dur; 'none': only at the end. A kill loses at most one interval")
    shown = train.add_argument_group("what it shows")
    shown.add_argument("--no-progress", action="store_true",
                       help="no progress bar or lines (by default a bar when a terminal shows the run; in a pipe, "
                            "a log file or CI, a progress line every 30 seconds)")
    shown.add_argument("--logger", default="", help="comma-separated loggers besides the record and log.jsonl: "
                       "tensorboard, csv, mlflow, wandb (each writes into a folder of that name in the run "
                       "folder; MLFLOW_TRACKING_URI and WANDB_MODE=offline are honoured); replaces the recipe "
                       "file's loggers field ('none': no loggers)")


def _add_catalogue_parsers(commands) -> None:
    methods = commands.add_parser("methods", help="the speed-up methods, from their cards", allow_abbrev=False)
    methods.add_argument("--markdown", action="store_true", help="print the methods table as markdown")
    methods.add_argument("name", nargs="?", help="show one method's whole card")
    methods.add_argument("--json", action="store_true", help="with a name: the card as JSON")
    commands.add_parser("tasks", help="the tasks, their targets and models", allow_abbrev=False)
    recipes = commands.add_parser("recipes", help="each task's presets: baselines and speed-up recipes",
                                  allow_abbrev=False)
    recipes.add_argument("--task", help="only this task's (default: every built-in task's): a name from `speedkit "
                         "tasks`, a folder task with --data DIR, or package.module:attr")
    _add_folder_task_arguments(recipes)


def _add_demo_parser(commands) -> None:
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


def _tasks(args) -> int:
    from speedkit.cli.show import plain_text
    from speedkit.tasks import FOLDER_TASKS, TASKS

    for name, task in TASKS.items():
        if name not in FOLDER_TASKS:
            print(f"{name:<14} {task.summary}; target {task.target_metric} {task.target_value:g}\n"
                  f"{'':<14} models: {', '.join(task.models) if task.models else 'its own'}")
    for name, make in FOLDER_TASKS.items():
        print(f"{name:<14} {plain_text(make.__doc__)} (needs --data DIR)")
    print("\nor --task package.module:attr naming a speedkit.Task of your own (see tutorials/t8)")
    return 0


# What a folder task's presets depend on, so `speedkit recipes` takes them without --data.
PRESET_OPTIONS = {"profile", "image_size"}
OPTION_FLAGS = {"skip_unreadable": "--skip-unreadable", "flips_keep_labels": "--no-flips", "stream": "--stream",
                "eval_image_size": "--eval-image-size", "profile": "--task-profile", "image_size": "--image-size"}


def _recipes(args) -> int:
    from speedkit.tasks import FOLDER_TASKS, TASKS
    from speedkit.tasks.build import FOLDER_PRESETS, find_task

    options = _folder_options(args) or {}
    if args.task is None and (args.data is not None or options):
        raise SystemExit("speedkit recipes: --data and the folder options need --task (e.g. --task image-folder "
                         "--data DIR)")
    names = [args.task] if args.task else [*(n for n in TASKS if n not in FOLDER_TASKS), *FOLDER_TASKS]
    for name in names:
        if name in FOLDER_PRESETS and args.data is None:
            _print_folder_presets(name, options)
            continue
        try:
            task = find_task(_importable(name), args.data, **options)
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"speedkit recipes: {e}") from None
        print(f"{name}:")
        _print_presets(name, task.recipes, task.baselines, args.data, options)
    return 0


def _print_folder_presets(name: str, options: dict) -> None:
    """A folder task's presets, read without its folder: the flags that need the folder are refused."""
    from speedkit.tasks.build import folder_task_presets

    needing_data = [OPTION_FLAGS[option] for option in sorted(set(options) - PRESET_OPTIONS)]
    if needing_data:
        raise SystemExit(f"speedkit recipes: {', '.join(needing_data)} are about a folder's files; give the "
                         f"folder with --data DIR, or leave them out to list {name}'s presets")
    presets = folder_task_presets(name, options.get("profile"), options.get("image_size"))
    print(f"{name} (trains on --data DIR{f', {presets.profile} profile' if presets.profile else ''}):")
    _print_presets(name, presets.recipes, presets.baselines, "DIR", options)


def _print_presets(name: str, recipes: dict, baselines: tuple, data, options: dict) -> None:
    from speedkit.tasks.ladder import measure_hint

    for recipe_name, recipe in recipes.items():
        print(f"  {recipe_name:<12} {_recipe_kind(baselines, recipe):<9} {recipe.duration:>6}  {recipe.summary}")
    unmeasured = [r.name for r in recipes.values() if r.unmeasured_rebuild and r.name not in baselines]
    if unmeasured:
        print(f"  {', '.join(unmeasured)}: rebuilt from another task's presets and not measured here; before "
              f"trusting a speed-up, measure it against this task's strongest baseline on one seed:\n    "
              + measure_hint(name, ",".join(unmeasured), data, options or None, baselines[-1]))


def _recipe_kind(baselines: tuple, recipe) -> str:
    if recipe.name in baselines:
        return "baseline"
    return "rebuilt" if recipe.unmeasured_rebuild else "speed-up"


def _summary(record) -> str:
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in record.final_metrics.items() if isinstance(v, float))
    reached = record.time_to_target
    target = (f"  {record.target['metric']} {record.target['value']} reached after {reached:.1f}s"
              if record.target and reached is not None else "")
    return (f"{record.status}: {record.timings.get('train_s', 0):.1f}s training "
            f"({record.timings.get('eval_s', 0):.1f}s eval apart)  {metrics}{target}\nrecord: {record.path}")


def _add_export_parser(commands) -> None:
    export = commands.add_parser("export", allow_abbrev=False, help="write a run's trained weights for other tools (safetensors, pt)",
                                 description="Writes the weights the run ended with (EMA/SWA averages where it used "
                                             "them) as a plain state dict that safetensors.torch.load_file or "
                                             "torch.load(weights_only=True) reads into a fresh model.")
    export.add_argument("run", help="a run folder (runs/NAME) or a .ckpt file")
    export.add_argument("--format", default="safetensors", choices=["safetensors", "pt"],
                        help="safetensors (default) or pt (torch.save of the state dict)")
    export.add_argument("--out", help="file to write (default: model.safetensors or model.pt in the run folder)")
    export.add_argument("--weights", default="auto", choices=["auto", "model", "ema", "swa"],
                        help="auto: what the run ended with; or one set from the checkpoint")


def _export(args) -> int:
    from speedkit.cli.export import export_weights

    print(export_weights(args.run, out=args.out, format=args.format, weights=args.weights).instructions())
    return 0


def _add_launch_parser(commands) -> None:
    launch = commands.add_parser(
        "launch", allow_abbrev=False, help="run a script on N processes per machine with torchrun (DDP in the Trainer)",
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


def _train(args, argv: list[str]) -> int:
    from speedkit.cli.outcomes import (INPUT_ERROR_EXIT_CODE, INTERRUPTED_EXIT_CODE, interrupted_line,
                                       is_file_system_error, raised_in_user_code, stopped_line)
    from speedkit.core import distributed
    from speedkit.tasks import make_trainer

    trainer = make_trainer(run_request(args))
    if distributed.is_main():
        print(trainer.record.what_trains(), flush=True)  # before the first step: what it trains, as resolved
    try:
        record = trainer.fit()
    except KeyboardInterrupt:  # the Trainer saved a checkpoint and the record before letting it through
        if distributed.is_main():
            print(interrupted_line(trainer, argv), file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except (OSError, FloatingPointError) as e:  # a full or read-only disk, a diverged loss: where it stopped, what next
        if (isinstance(e, OSError) and not is_file_system_error(e)) or raised_in_user_code(e):
            raise
        if distributed.is_main():
            print(stopped_line(trainer, argv, e), file=sys.stderr)
        return INPUT_ERROR_EXIT_CODE
    if distributed.is_main():
        if trainer.owner.finished:
            print(f"speedkit: run {trainer.run_folder} had already ended; nothing was trained and its record is as "
                  f"it was", file=sys.stderr)
        print(_summary(record))
    return 0


def run_request(args):
    """The RunRequest that ``speedkit train``'s flags ask for (the request checks them, naming the field)."""
    from speedkit.tasks import RunRequest

    saving = {} if args.save_interval is None else {"save_interval": _save_interval(args.save_interval)}
    return RunRequest.build(
        _importable(args.task), args.recipe, data=args.data, task_options=_folder_options(args),
        model=args.model, duration=args.duration, methods=args.methods, precision=args.precision,
        batch_size=args.batch_size, device=args.device, seed=args.seed, data_fraction=args.data_fraction,
        eval_fraction=args.eval_fraction, eval_interval=args.eval_interval, target=args.target,
        stop_at_target=args.stop_at_target, download=args.download, num_workers=args.num_workers,
        run_dir=args.run_dir, run_name=args.run_name,
        loggers=_logger_names(args.logger),
        autoresume=args.autoresume, overwrite=args.overwrite, extend_duration=args.extend_duration,
        progress_bar=False if args.no_progress else "auto", console=True,
        parallel=None if args.parallel == "none" else args.parallel, **saving, **_piped_progress(args))


# How often a run whose output nobody watches live (a pipe, a log file, CI) prints where it is.
PIPED_PROGRESS_EVERY_S = 30.0


def _piped_progress(args) -> dict:
    """Progress lines at a bounded interval where no bar draws (``ProgressLines``), unless --no-progress."""
    from speedkit.callbacks.monitors import ProgressLines, someone_is_watching

    if args.no_progress or someone_is_watching():
        return {}
    return {"callbacks": [ProgressLines(PIPED_PROGRESS_EVERY_S)]}


def _folder_options(args) -> dict | None:
    """A folder task's options from the flags given (``--image-size 0`` is given, and refused by the task)."""
    options = {"image_size": args.image_size} if args.image_size is not None else {}
    if getattr(args, "skip_unreadable", False):
        options["skip_unreadable"] = True
    if getattr(args, "no_flips", False):
        options["flips_keep_labels"] = False
    if getattr(args, "stream", False):
        options["stream"] = True
    options.update(_seed_task_options(args))
    return options or None


def _seed_task_options(args) -> dict:
    """The seed's tasks' (imagenet, gpt2) options: their profile (``--task-profile``, else bench's
    ``--profile``) and imagenet's evaluation size. Refused by the other tasks, naming the flag."""
    options = {}
    profile = getattr(args, "task_profile", None)
    if profile is None and getattr(args, "task", None) in ("imagenet", "gpt2") and getattr(args, "profile", None) \
            in ("cpu", "gpu"):
        profile = args.profile
    if profile is not None:
        options["profile"] = profile
    if getattr(args, "eval_image_size", None) is not None:
        options["eval_image_size"] = args.eval_image_size
    return options


def _save_interval(value: str) -> str | None:
    """``--save-interval none`` as None (only the final checkpoint); a duration as it is. Not given at all,
    the run request's default applies (``speedkit.tasks.build.DEFAULT_SAVE_INTERVAL``)."""
    return None if value.strip().lower() == "none" else value


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

    if args.name and args.json:
        print(json.dumps(get_method(args.name).CARD.to_dict(), indent=2, default=str))
    elif args.name:
        from speedkit.cli.show import method_card_text

        print(method_card_text(args.name))
    elif args.markdown:
        print(methods_table())
    else:
        for name, cls in REGISTRY.items():
            print(f"{name:<26} {cls.CARD.domain:<9} {cls.CARD.summary}")
    return 0


def _add_bench_parser(commands) -> None:
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
    _add_task_argument(bench, "to benchmark")
    _add_folder_task_arguments(bench)
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
                            "(language: tuned; a task whose profile names none: each baseline's own rate x0.5, x1, "
                            "x2, cosine or linear decay; past the grid's edge while the edge wins), then run them with the pick")
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
    options = _folder_options(args)
    result = run_benchmark(_importable(args.task), args.profile, seeds=args.seeds, recipes=args.recipes,
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


def _add_tune_parser(commands) -> None:
    tune = commands.add_parser(
        "tune", allow_abbrev=False, help="search (Optuna) for the recipe that reaches a task's target soonest",
        description="A measured search: the baseline's learning rate and budget are tuned first; then the "
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
    _add_task_argument(tune, "to search on")
    _add_folder_task_arguments(tune)
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
    tune.add_argument("--max-baseline-trials", type=int, help="stop tuning the baseline after this many trials")
    tune.add_argument("--pruner", default="halving", choices=["halving", "hyperband", "median", "none"],
                      help="stops trials that fall behind at an evaluation (successive halving by default)")
    tune.add_argument("--no-hparams", action="store_true", help="methods on/off only, each at its card's defaults")
    tune.add_argument("--leave-one-out", action="store_true", help="then run the winner without each of its methods")
    tune.add_argument("--runner", help="MODULE:FUNCTION that runs one trial instead of training (advanced)")


def _tune(args) -> int:
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
        speedup = confirmation.get("speedup_median")
        pairs = sum(p is not None for p in confirmation.get("speedups") or [])  # seeds where both reached it
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
        task=_importable(args.task), data=args.data, task_options=_folder_options(args), target=args.target,
        budget=args.budget, methods=args.methods, base=args.base, storage=args.storage, study_name=args.study,
        out_dir=args.out, run_dir=args.run_dir, data_fraction=args.data_fraction, eval_fraction=args.eval_fraction,
        eval_interval=args.eval_interval, device=args.device, n_workers=args.workers, seeds_to_confirm=args.seeds,
        trial_limit=args.trial_limit, max_trials=args.max_trials, max_baseline_trials=args.max_baseline_trials,
        pruner=args.pruner, tune_hparams=not args.no_hparams, leave_one_out=args.leave_one_out, runner=args.runner)


def _add_notebooks_parser(commands) -> None:
    notebooks = commands.add_parser("notebooks", allow_abbrev=False, help="run the notebooks and tutorials headlessly with papermill")
    actions = notebooks.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", allow_abbrev=False, help="run every notebook with a parameter set; exit status 1 if any fails")
    run.add_argument("--params", default="cpu-smoke", help="parameter set: a folder under ROOT/params (cpu-smoke, gpu)")
    run.add_argument("--out", default="runs/nb", help="each notebook's records, executed copy and HTML go to OUT/<name>/")
    run.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (names without .ipynb)")
    run.add_argument("--root", help="a checkout holding notebooks/, tutorials/ and params/ (default: the copy "
                     "installed with speedkit)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="override a parameter of every notebook run (VALUE is read as YAML)")
    run.add_argument("--timeout", type=float, help="seconds any one cell may take")
    where = actions.add_parser("where", allow_abbrev=False, help="print the folder holding the notebooks, tutorials and params")
    where.add_argument("--root", help="a checkout to check instead of the installed copy")
    copy = actions.add_parser("copy", allow_abbrev=False, help="copy the notebooks, tutorials and params into a folder "
                              "of yours, to open and edit them (nothing there is replaced)")
    copy.add_argument("destination", nargs="?", default="speedkit-notebooks", help="the folder (default: "
                      "./speedkit-notebooks)")
    copy.add_argument("--root", help="copy from this checkout instead of the installed copy")


def _notebooks(args) -> int:
    import yaml

    from speedkit.cli.notebooks import format_summary, run_notebooks
    from pathlib import Path

    from speedkit.cli.shipped import copy_notebooks, notebook_root

    if args.action == "where":
        print(notebook_root(args.root))
        return 0
    if args.action == "copy":
        written = copy_notebooks(args.destination, root=args.root)
        print(f"copied {len(written)} files into {Path(args.destination).expanduser()}; open them with: "
              f"jupyter lab {args.destination}")
        return 0
    overrides = {}
    for name, value in args.parameter:
        try:
            overrides[name] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ValueError(f"notebooks run -p {name} {value!r}: the value is read as plain YAML and this is not "
                             f"({' '.join(str(e).split())}); quote it as a string (-p {name} \"'{value}'\") or give "
                             f"a number, true/false, a list or a mapping") from None
    results = run_notebooks(args.params, out=args.out, root=args.root, only=args.only, overrides=overrides,
                            timeout=args.timeout, progress=print)
    print(format_summary(results))
    return 1 if any(r.failed for r in results) else 0


# Flags whose value may start with '-' (a negative number or duration): argparse would take "-5ba" for a flag
# and answer "expected one argument"; given as --flag=-5ba, the value reaches the check that names it.
NEGATIVE_OK = ("--duration", "--save-interval", "--eval-interval", "--target", "--trial-limit", "--budget",
               "--data-fraction", "--eval-fraction", "--seed", "--batch-size", "--image-size", "--duration-scale")


def _join_negative_values(argv: list[str]) -> list[str]:
    joined, i = [], 0
    while i < len(argv):
        if argv[i] in NEGATIVE_OK and i + 1 < len(argv) and argv[i + 1][:2] not in ("--",) \
                and argv[i + 1].startswith("-") and argv[i + 1][1:2] not in ("", "h"):
            joined.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        joined.append(argv[i])
        i += 1
    return joined


def main(argv: list[str] | None = None) -> int:
    argv = _join_negative_values(sys.argv[1:] if argv is None else list(argv))
    args = _parser().parse_args(argv)
    from speedkit.cli.show import warning_lines

    try:
        with warning_lines():  # one `speedkit: warning: ...` line each, not a site-packages source line
            return _dispatch(args, argv)
    except BrokenPipeError:  # `speedkit methods | head` closed the pipe: not an error of ours, nothing to say
        _silence_stdout()
        return 0


def _dispatch(args, argv: list[str]) -> int:
    from speedkit.cli.outcomes import INTERRUPTED_EXIT_CODE, interrupted_line, report_error, report_refusal

    simple = {"launch": _launch, "methods": _methods, "tasks": _tasks, "recipes": _recipes, "export": _export,
              "bench": _bench, "notebooks": _notebooks, "tune": _tune, "demo": _demo, "env": _env, "data": _data}
    try:
        if args.command == "train":
            return _train(args, argv)
        return simple[args.command](args)
    except KeyboardInterrupt:  # speedkit train answers a Ctrl-C during training itself (with the resume command)
        print(interrupted_line(None, argv) if args.command == "train" else f"speedkit {args.command}: interrupted",
              file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        return report_error(e)  # one line for a mistake in the input; the traceback for one in the user's code
    except (OSError, MemoryError, FloatingPointError) as e:  # a file system, memory or loss that refuses the run
        return report_refusal(e)


def _silence_stdout() -> None:
    """Python flushes stdout again at exit; pointed at /dev/null, that flush cannot raise a second time."""
    import os

    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _demo(args) -> int:
    from speedkit.cli.demo import run_demo

    overrides = {"duration": args.duration, "data_fraction": args.data_fraction, "device": args.device}
    return run_demo(args.root, args.out, {k: v for k, v in overrides.items() if v is not None}, params=args.params)


def _add_data_parser(commands) -> None:
    from speedkit.cli.data import add_data_parser

    add_data_parser(commands)


def _data(args) -> int:
    from speedkit.cli.data import run_data

    return run_data(args)


def _env(args) -> int:
    from speedkit.cli.env import environment_report

    print(environment_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
