"""``speedkit tasks``: the built-in tasks, their targets and models, and the folder tasks."""
from __future__ import annotations


def add_parser(commands) -> None:
    commands.add_parser("tasks", help="the tasks, their targets and models", allow_abbrev=False)


def run(args) -> int:
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
