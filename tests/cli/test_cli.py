"""The command line end to end: a tiny budget writes a RunRecord that we read back."""
from __future__ import annotations

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
    (["--task", "imagenet"], "unknown task"),
    (["--model", "resnet1000"], "resnet1000"),
    (["--logger", "tensorboard,neptune"], "unknown logger name 'neptune'; known names: tensorboard, csv, mlflow, wandb"),
])
def test_bad_input_gets_a_clear_error(tmp_path, capsys, args, message):
    code = main(["train", "--device", "cpu", "--data-fraction", "0.01", "--run-dir", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_version_prints_the_packages_version():
    from speedkit.version import __version__

    result = subprocess.run([sys.executable, "-m", "speedkit", "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"speedkit {__version__}"


def test_help_lists_tasks_models_and_methods():
    out = subprocess.run([sys.executable, "-m", "speedkit", "--help"], capture_output=True, text=True, check=True).stdout
    for expected in ("fashion-mnist", "resnet8", "gpt-nano", "label_smoothing", "channels_last", "train", "demo"):
        assert expected in out
