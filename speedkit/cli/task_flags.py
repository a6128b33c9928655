"""The flags every command that takes a task shares (train, recipes, bench, tune): ``--task`` and a folder task's or
a seed task's options, and how they become the task's arguments. One place, so each command names a task alike."""
from __future__ import annotations

import sys


def add_task_argument(parser, what: str) -> None:
    """The one way every command names a task."""
    parser.add_argument("--task", default="fashion-mnist",
                        help=f"the task {what}: a name from `speedkit tasks` (default fashion-mnist), or "
                             "package.module:attr naming a speedkit.Task or a function returning one (imported "
                             "from the current folder too)")


def add_folder_task_arguments(parser) -> None:
    """The options of the folder tasks (image-folder, text-folder) and the seed's tasks (imagenet, gpt2)."""
    parser.add_argument("--data", help="the folder for image-folder / text-folder (or passed to a task function)")
    parser.add_argument("--image-size", type=int,
                        help="image-folder: resize images to this square size (default 32); imagenet: train every "
                             "recipe at this size (default: each recipe's published size at the task's --sizes)")
    parser.add_argument("--skip-unreadable", action="store_true",
                        help="image-folder / text-folder: leave out (and count) images that cannot be decoded and "
                             "files that are not text, instead of refusing the folder")
    parser.add_argument("--stream", action="store_true",
                        help="image-folder / text-folder: stream from shards (prepared once, into a cache folder, "
                             "unless --data is a shard folder from `speedkit data prepare`); chosen by itself when "
                             "the images would not fit in memory")
    parser.add_argument("--sizes", choices=["cpu", "gpu"],
                        help="imagenet / gpt2: cpu (a rehearsal: a narrow model, small inputs) or gpu (the seed's "
                             "real sizes); default: bench's --profile, else gpu where CUDA is available")
    parser.add_argument("--eval-image-size", type=int,
                        help="imagenet: evaluate at this size (FFCV's test evaluates larger than it trains; "
                             "default: each recipe's published size at the task's --sizes)")
    parser.add_argument("--no-flips", action="store_true",
                        help="image-folder: a horizontal flip changes these images' labels (digits, letters, "
                             "text), so train without flip augmentation, alternating flips or mirrored test views")


def folder_options(args) -> dict | None:
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
    """The seed's tasks' (imagenet, gpt2) options: their sizes (``--sizes``, else bench's
    ``--profile``) and imagenet's evaluation size. Refused by the other tasks, naming the flag."""
    options = {}
    sizes = getattr(args, "sizes", None)
    if sizes is None and getattr(args, "task", None) in ("imagenet", "gpt2") and getattr(args, "profile", None) \
            in ("cpu", "gpu"):
        sizes = args.profile
    if sizes is not None:
        options["sizes"] = sizes
    if getattr(args, "eval_image_size", None) is not None:
        options["eval_image_size"] = args.eval_image_size
    return options


def importable(task: str) -> str:
    """``--task module:attr`` imports from the current folder too, as ``python -m`` would (the ``speedkit``
    script's own folder is first on the path, not the user's)."""
    import os

    if ":" in task and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return task
