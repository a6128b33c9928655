"""``speedkit COMMAND``: the top-level parser and the dispatch. Each command lives in its own module,
``speedkit/cli/COMMAND.py``, which holds its ``add_parser(commands)`` and its ``run(args)``; a new command is a new
module listed in ``COMMANDS``. Building the parser imports nothing heavy (each command imports what it needs when
it runs), so ``--version`` is instant."""
from __future__ import annotations

import argparse
import contextlib
import sys

from speedkit.cli import bench, data, demo, env, export, launch, methods, notebooks, recipes, tasks, train, tune
from speedkit.version import __version__

# In the order ``speedkit --help`` lists them; each module's last name is its command's.
COMMANDS = {module.__name__.rpartition(".")[2]: module
            for module in (train, launch, methods, tasks, recipes, demo, export, bench, tune, notebooks, data, env)}

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
    for command in COMMANDS.values():
        command.add_parser(commands)
    return parser


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

    try:
        if args.command == "train":  # the one command that prints the resume command, so it needs the command line
            return train.run(args, argv)
        return COMMANDS[args.command].run(args)
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


if __name__ == "__main__":
    sys.exit(main())
