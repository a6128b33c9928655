"""The command line end to end: a tiny budget writes a RunRecord that we read back."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import needs_fmnist
from prerequisites import import_or_missing

from speedkit import RunRecord
from speedkit.cli.main import main


@needs_fmnist
def test_speedkit_train_writes_a_record(tmp_path, capsys):
    code = main(["train", "--task", "fashion-mnist", "--recipe", "mild", "--duration", "6ba", "--batch-size", "64",
                 "--data-fraction", "0.02", "--eval-fraction", "0.05", "--methods", "label_smoothing",
                 "--precision", "fp32", "--device", "cpu", "--run-dir", str(tmp_path), "--run-name", "cli",
                 "--no-progress"])
    assert code == 0
    record = RunRecord.load(tmp_path / "cli")
    assert record.status == "completed"
    assert record.method_names == ["label_smoothing"]
    assert record.config["task"] == "fashion-mnist" and record.config["recipe"] == "mild"
    assert record.steps[-1]["batch"] == 6 and record.evals
    assert 0.0 <= record.final_metrics["eval/accuracy"] <= 1.0
    assert "record:" in capsys.readouterr().out


@needs_fmnist
def test_speedkit_train_logs_to_tensorboard_and_csv(tmp_path):
    import_or_missing("tensorboard", "pip install 'torch-speedkit[tensorboard]'")
    code = main(["train", "--duration", "4ba", "--batch-size", "64", "--data-fraction", "0.02", "--eval-fraction",
                 "0.05", "--device", "cpu", "--run-dir", str(tmp_path), "--run-name", "logged", "--no-progress",
                 "--logger", "tensorboard,csv"])
    assert code == 0
    run = tmp_path / "logged"
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "csv" / "eval.csv").read_text().startswith("batch,epoch,sample,token,wall_s,eval/accuracy")


@needs_fmnist
@pytest.mark.parametrize("args, message", [
    (["--methods", "label_smothing"], "Did you mean 'label_smoothing'"),
    (["--duration", "3 fortnights"], "fortnights"),
    (["--task", "cifar-1000"], "unknown task"),
    (["--model", "resnet1000"], "resnet1000"),
    (["--logger", "tensorboard,neptune"], "unknown logger name 'neptune'; known names: tensorboard, csv, mlflow, wandb"),
    (["--num-workers", "-1"], "num_workers"),
])
def test_bad_input_gets_a_clear_error(tmp_path, capsys, args, message):
    code = main(["train", "--device", "cpu", "--data-fraction", "0.01", "--run-dir", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_version_prints_the_packages_version_without_importing_torch():
    from speedkit.version import __version__

    result = subprocess.run([sys.executable, "-m", "speedkit", "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"speedkit {__version__}"
    # what makes it instant: building the parser imports no torch (checked by module, not by the clock)
    code = ("import sys, contextlib, io\nfrom speedkit.cli.main import _parser\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    _parser().parse_args(['train', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'yaml')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_help_fits_a_screen_and_names_every_command():
    from speedkit.cli.main import _parser

    out = subprocess.run([sys.executable, "-m", "speedkit", "--help"], capture_output=True, text=True, check=True).stdout
    assert len(out.splitlines()) <= 45, out
    for command in _subcommands(_parser()):
        assert f"    {command} " in out or f"    {command}\n" in out, command


def test_each_command_is_the_module_named_after_it():
    """cli/COMMAND.py registers exactly the command COMMAND (one each, in the order help lists them), so the one
    file to open for a command is the one named after it."""
    from speedkit.cli.main import COMMANDS, _parser

    assert list(COMMANDS) == list(_subcommands(_parser()))
    for name, module in COMMANDS.items():
        assert module.__name__ == f"speedkit.cli.{name}" and callable(module.run), name


def _subcommands(parser):
    import argparse

    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def _all_parsers(parser, path=("speedkit",)):
    yield path, parser
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_parsers(sub, (*path, name))


def test_every_flag_of_every_command_has_help_text():
    import argparse

    from speedkit.cli.main import _parser

    missing = [f"{' '.join(path)} {action.option_strings or action.dest}"
               for path, parser in _all_parsers(_parser()) for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help]
    assert missing == []
    # The parser imports no torch, so its help states the default checkpoint interval rather than reading it.
    from speedkit.tasks.build import DEFAULT_SAVE_INTERVAL

    train = dict(_all_parsers(_parser()))[("speedkit", "train")]
    save_interval = next(a for a in train._actions if "--save-interval" in a.option_strings)
    assert f"(default {DEFAULT_SAVE_INTERVAL})" in save_interval.help


def test_every_command_that_takes_a_task_names_it_with_the_same_flag():
    from speedkit.cli.main import _parser

    for path, parser in _all_parsers(_parser()):
        dests = {a.dest: a for a in parser._actions}
        if "task" in dests:
            assert dests["task"].option_strings == ["--task"], path
    args = _parser().parse_args(["bench", "--task", "pydocs"])
    assert args.task == "pydocs"
    with pytest.raises(SystemExit):  # the old positional form is refused, not read as something else
        _parser().parse_args(["bench", "vision"])


def test_catalogue_commands_list_tasks_recipes_models_and_methods(capsys):
    from speedkit.methods import REGISTRY
    from speedkit.tasks import TASKS

    assert main(["tasks"]) == 0
    tasks = capsys.readouterr().out
    for expected in ("fashion-mnist", "pydocs", "image-folder", "text-folder", "resnet8", "gpt-nano",
                     f"eval/bpb {TASKS['pydocs'].target_value:g}"):
        assert expected in tasks
    assert main(["recipes", "--task", "fashion-mnist"]) == 0
    recipes = capsys.readouterr().out
    assert all(f"  {name} " in recipes for name in TASKS["fashion-mnist"].recipes) and "pydocs" not in recipes
    assert main(["methods"]) == 0
    methods = capsys.readouterr().out
    assert all(line.split()[0] in REGISTRY for line in methods.splitlines()) and len(methods.splitlines()) == len(REGISTRY)


def test_recipes_of_a_folder_task_say_which_rungs_nobody_measured_there_and_how_to(tmp_path, capsys):
    """``speedkit recipes --task image-folder --data DIR``: the ladder rebuilt on the folder's baseline, each rung
    marked as not measured here, and the one-seed bench command (with the folder's flags) that measures them."""
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(6):
            Image.new("L", (12, 12), color=i * 40).save(tmp_path / label / f"{i}.png")
    assert main(["recipes", "--task", "image-folder", "--data", str(tmp_path), "--no-flips"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^  (\S+) +(baseline|rebuilt|speed-up) ", out, flags=re.M))
    assert rows == {"baseline": "baseline", "plain-bf16": "baseline", "mild": "rebuilt", "medium": "rebuilt",
                    "hot": "rebuilt"}, out
    assert (f"speedkit bench --task image-folder --data {tmp_path} --no-flips --recipes mild,medium,hot "
            f"--baselines plain-bf16 --seeds 1") in out
    assert main(["recipes", "--task", "fashion-mnist"]) == 0
    assert "not measured here" not in capsys.readouterr().out  # the built-in presets were measured on their task
    with pytest.raises(SystemExit, match="--no-flips are about a folder's files; give the folder with --data"):
        main(["recipes", "--task", "text-folder", "--no-flips"])
    with pytest.raises(SystemExit, match="need --task"):
        main(["recipes", "--data", str(tmp_path)])


def test_recipes_lists_every_task_and_a_folder_tasks_presets_without_its_folder(tmp_path, capsys):
    """``speedkit recipes`` lists all the tasks, the folder tasks' presets too; ``--task imagenet`` lists its presets
    without --data, as its profile runs them; a folder task's presets read without the folder are the ones it
    runs with it."""
    from PIL import Image

    from speedkit.tasks import FOLDER_TASKS, TASKS

    assert main(["recipes"]) == 0
    listed = re.findall(r"^(\S+)[ :]", capsys.readouterr().out, flags=re.M)
    assert listed == [*(n for n in TASKS if n not in FOLDER_TASKS), *FOLDER_TASKS]
    assert main(["recipes", "--task", "imagenet", "--sizes", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^  (\S+) +(baseline|rebuilt|speed-up) ", out, flags=re.M))
    assert rows == {"baseline": "baseline", "plain-bf16": "baseline", "mild": "speed-up", "medium": "speed-up",
                    "hot": "speed-up"}, out
    assert "cpu sizes" in out and "progressive resizing off" in out  # the rehearsal's presets, as it runs them

    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(6):
            Image.new("RGB", (12, 12), color=(i * 40, 0, 0)).save(tmp_path / label / f"{i}.png")
    assert main(["recipes", "--task", "image-folder"]) == 0
    without_folder = capsys.readouterr().out.splitlines()[1:]
    assert main(["recipes", "--task", "image-folder", "--data", str(tmp_path)]) == 0
    with_folder = capsys.readouterr().out.replace(str(tmp_path), "DIR").splitlines()[1:]
    assert without_folder == with_folder and len(with_folder) >= 5


def test_tasks_prints_plain_text_not_restructured_text(capsys):
    """``speedkit tasks`` shows each folder task's whole first paragraph, without reStructuredText's markup."""
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out
    assert "recipe (--task gpt2)" in out and "(--task imagenet)" in out  # a paragraph over two lines, joined


def test_a_pipe_closed_early_ends_quietly():
    """``speedkit methods | head -1``: the reader goes away; no BrokenPipeError traceback, exit status 0."""
    proc = subprocess.Popen([sys.executable, "-m", "speedkit", "methods", "--markdown"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command has written anything: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_env_prints_what_a_bug_report_needs(capsys):
    import torch

    from speedkit.cli.env import environment_rows

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    rows = dict(environment_rows())
    assert rows["torch"] == torch.__version__ and re.search(rf"^torch +{re.escape(torch.__version__)}$", out, re.M)
    for name in ("speedkit", "python", "cpu", "cuda", "auto precision", "fashion-mnist", "pydocs text",
                 "open files limit", "lightning", "accelerate", "transformers"):
        assert name in rows and out.count(name) >= 1, name
    if torch.device(rows["auto device"]).type == "cpu":
        assert "x over fp32, measured now" in rows["cpu bf16 speed-up"]


@pytest.mark.prerequisite("fashion-mnist")
def test_a_run_in_a_pipe_prints_progress_at_a_bounded_interval(tmp_path, capsys, monkeypatch):
    """Where no bar draws (pytest captures both streams, as a pipe would), the run prints where it is between its
    evaluations, at most every PIPED_PROGRESS_EVERY_S; --no-progress keeps it quiet."""
    import speedkit.cli.train as train_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEEDKIT_PROGRESS", "0")  # nobody watches (this process has ipykernel, which says otherwise)
    monkeypatch.setattr(train_command, "PIPED_PROGRESS_EVERY_S", 1e-6)  # every batch: the test does not wait
    args = ["train", "--duration", "4ba", "--data-fraction", "0.01", "--eval-fraction", "0.02", "--batch-size", "32",
            "--eval-interval", "4ba"]
    assert main([*args, "--run-name", "piped"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "progress:" in line]
    assert [line.split("progress: ")[1].split(",")[0] for line in lines] == \
        [f"{b} of 4 batches ({25 * b}%)" for b in (1, 2, 3, 4)], lines
    assert main([*args, "--run-name", "quiet", "--no-progress"]) == 0
    assert "progress:" not in capsys.readouterr().out
