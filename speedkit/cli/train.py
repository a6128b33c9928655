"""``speedkit train``: one run of a task with a recipe and methods, through the same ``make_trainer`` as Python."""
from __future__ import annotations

import argparse
import sys

from speedkit.cli.task_flags import add_folder_task_arguments, add_task_argument, folder_options, importable


def add_parser(commands) -> None:
    train = commands.add_parser("train", help="train a task with a recipe and methods", allow_abbrev=False,
                                description="Trains one run and writes its folder (record.json, log.jsonl, "
                                            "checkpoints) under --run-dir/--run-name.",
                                epilog="examples:\n  speedkit train --task fashion-mnist --recipe hot\n"
                                       "  speedkit train --task image-folder --data ~/photos --recipe mild\n"
                                       "  speedkit train --recipe my.yaml --run-name first --autoresume",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = train.add_argument_group("what to train")
    add_task_argument(what, "to train")
    add_folder_task_arguments(what)
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


def run(args, argv: list[str]) -> int:
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
        importable(args.task), args.recipe, data=args.data, task_options=folder_options(args),
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


def _save_interval(value: str) -> str | None:
    """``--save-interval none`` as None (only the final checkpoint); a duration as it is. Not given at all,
    the run request's default applies (``speedkit.tasks.build.DEFAULT_SAVE_INTERVAL``)."""
    return None if value.strip().lower() == "none" else value


def _logger_names(value: str) -> list[str] | None:
    """``--logger tensorboard,csv`` as a list of names; the Trainer refuses an unknown one, naming the known.
    Not given: None (the recipe's own ``loggers`` field applies); ``none``: no loggers, whatever the recipe says."""
    if value.strip().lower() == "none":
        return []
    return [name.strip() for name in value.split(",") if name.strip()] or None


def _summary(record) -> str:
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in record.final_metrics.items() if isinstance(v, float))
    reached = record.time_to_target
    target = (f"  {record.target['metric']} {record.target['value']} reached after {reached:.1f}s"
              if record.target and reached is not None else "")
    return (f"{record.status}: {record.timings.get('train_s', 0):.1f}s training "
            f"({record.timings.get('eval_s', 0):.1f}s eval apart)  {metrics}{target}\nrecord: {record.path}")
