"""``speedkit recipes``: each task's presets, baselines and speed-up recipes (a folder task's without its folder)."""
from __future__ import annotations

from speedkit.cli.task_flags import add_folder_task_arguments, folder_options, importable


def add_parser(commands) -> None:
    recipes = commands.add_parser("recipes", help="each task's presets: baselines and speed-up recipes",
                                  allow_abbrev=False)
    recipes.add_argument("--task", help="only this task's (default: every built-in task's): a name from `speedkit "
                         "tasks`, a folder task with --data DIR, or package.module:attr")
    add_folder_task_arguments(recipes)


# What a folder task's presets depend on, so `speedkit recipes` takes them without --data.
PRESET_OPTIONS = {"sizes", "image_size"}
OPTION_FLAGS = {"skip_unreadable": "--skip-unreadable", "flips_keep_labels": "--no-flips", "stream": "--stream",
                "eval_image_size": "--eval-image-size", "sizes": "--sizes", "image_size": "--image-size"}


def run(args) -> int:
    from speedkit.tasks import FOLDER_TASKS, TASKS
    from speedkit.tasks.build import FOLDER_PRESETS, find_task

    options = folder_options(args) or {}
    if args.task is None and (args.data is not None or options):
        raise SystemExit("speedkit recipes: --data and the folder options need --task (e.g. --task image-folder "
                         "--data DIR)")
    names = [args.task] if args.task else [*(n for n in TASKS if n not in FOLDER_TASKS), *FOLDER_TASKS]
    for name in names:
        if name in FOLDER_PRESETS and args.data is None:
            _print_folder_presets(name, options)
            continue
        try:
            task = find_task(importable(name), args.data, **options)
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
    presets = folder_task_presets(name, options.get("sizes"), options.get("image_size"))
    print(f"{name} (trains on --data DIR{f', {presets.sizes} sizes' if presets.sizes else ''}):")
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
