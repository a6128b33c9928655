"""TensorBoard and CSV loggers: a tiny real Trainer run, then its files read back with TensorBoard's own reader and
the csv module, and compared with the RunRecord the same run wrote (the loggers must see the same numbers)."""
from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest
from helpers import needs_fmnist, toy_loaders, toy_model
from prerequisites import import_or_missing

from speedkit import Trainer
from speedkit.methods import LabelSmoothing
from speedkit.record.loggers import CSVLogger, TensorBoardLogger


def fit_toy(tmp_path, loggers, run_name="run"):
    train, test = toy_loaders()  # 8 batches an epoch
    trainer = Trainer(toy_model(), train, eval_dataloader=test, max_duration="2ep", log_interval=3,
                      eval_interval="1ep", methods=[LabelSmoothing(smoothing=0.1)], loggers=loggers,
                      device="cpu", run_dir=tmp_path, run_name=run_name, save_checkpoints=False)
    return trainer.fit(), tmp_path / run_name


def numeric_metrics(row: dict) -> dict:
    position = ("batch", "epoch", "sample", "token", "wall_s")
    return {k: float(v) for k, v in row.items() if k not in position and isinstance(v, (int, float))}


# -- TensorBoard --------------------------------------------------------------------------------
def read_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def scalars_by_step(events, tag) -> dict[int, float]:
    return {e.step: e.value for e in events.Scalars(tag)}


def logged_hparams(events) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    values = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in values.items()}


def text(events, tag) -> str:
    return events.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def test_tensorboard_logs_the_records_metrics_hparams_and_timings(tmp_path):
    import_or_missing("tensorboard", "pip install 'torch-speedkit[tensorboard]'")
    record, folder = fit_toy(tmp_path, ["tensorboard"])
    events = read_events(folder / "tensorboard")

    for row in record.steps + record.evals:
        for name, value in numeric_metrics(row).items():
            assert scalars_by_step(events, name)[row["batch"]] == pytest.approx(value, rel=1e-5, abs=1e-7), name
    assert "loss" in events.Tags()["scalars"] and "eval/accuracy" in events.Tags()["scalars"]

    hparams = logged_hparams(events)
    assert hparams["methods"] == "label_smoothing"
    assert hparams["method/label_smoothing/smoothing"] == pytest.approx(0.1)
    assert hparams["optimizer/lr"] == pytest.approx(record.config["optimizer"]["lr"])
    assert json.loads(text(events, "config").strip("`").removeprefix("json"))["seed"] == 0

    final_batch = record.steps[-1]["batch"]
    for name, seconds in record.timings.items():
        assert scalars_by_step(events, f"timings/{name}")[final_batch] == pytest.approx(seconds, rel=1e-5)
    assert text(events, "status") == "completed"


def test_a_missing_tensorboard_names_the_extra_and_the_trainer_runs_without_it(tmp_path, monkeypatch):
    # None in sys.modules makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'torch-speedkit\[tensorboard\]'"):
        TensorBoardLogger(tmp_path / "tb")
    record, _ = fit_toy(tmp_path, ["csv"])
    assert record.status == "completed"


# -- CSV ----------------------------------------------------------------------------------------
def read_csv(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def same_row(csv_row: dict, record_row: dict) -> bool:
    """A CSV row (all strings, '' where the metric was not logged) against the record's row."""
    present = {k: v for k, v in csv_row.items() if v != ""}
    if set(present) != set(record_row):
        return False
    return all(float(present[k]) == pytest.approx(v) if isinstance(v, (int, float)) else present[k] == str(v)
               for k, v in record_row.items())


def test_csv_writes_one_row_per_logged_batch_and_evaluation(tmp_path):
    record, folder = fit_toy(tmp_path, ["csv"])

    header, train_rows = read_csv(folder / "csv" / "train.csv")
    assert header[:5] == ["batch", "epoch", "sample", "token", "wall_s"] and "loss" in header
    assert len(train_rows) == len(record.steps)
    assert all(same_row(c, r) for c, r in zip(train_rows, record.steps))

    header, eval_rows = read_csv(folder / "csv" / "eval.csv")
    assert "eval/accuracy" in header and len(eval_rows) == len(record.evals) == 2
    assert all(same_row(c, r) for c, r in zip(eval_rows, record.evals))

    _, hparams = read_csv(folder / "csv" / "hparams.csv")
    hparams = {row["name"]: row["value"] for row in hparams}
    assert hparams["methods"] == "label_smoothing" and float(hparams["method/label_smoothing/smoothing"]) == 0.1
    _, timings = read_csv(folder / "csv" / "timings.csv")
    timings = {row["name"]: row["value"] for row in timings}
    assert float(timings["train_s"]) == record.timings["train_s"] and timings["status"] == "completed"


def test_csv_header_widens_for_a_late_metric_without_moving_a_column(tmp_path):
    logger = CSVLogger(tmp_path)
    at = lambda batch: {"batch": batch, "epoch": 0, "sample": 32 * batch, "token": 0, "wall_s": 0.1 * batch}
    logger.log_metrics({"loss": 1.0}, at(1))
    logger.log_metrics({"lr": 0.1}, at(1))  # another callback at the same batch: the same row
    logger.log_metrics({"loss": 0.9}, at(2))
    logger.log_metrics({"loss": 0.8, "grad_norm": 3.0}, at(3))  # a metric first seen late
    logger.close()
    # Another logger on the same folder (a resumed run) keeps the header and appends.
    again = CSVLogger(tmp_path)
    again.log_metrics({"loss": 0.7, "lr": 0.05}, at(4))
    again.close()

    header, rows = read_csv(tmp_path / "train.csv")
    assert header == ["batch", "epoch", "sample", "token", "wall_s", "loss", "lr", "grad_norm"]
    assert [(r["batch"], r["loss"], r["lr"], r["grad_norm"]) for r in rows] == [
        ("1", "1.0", "0.1", ""), ("2", "0.9", "", ""), ("3", "0.8", "", "3.0"), ("4", "0.7", "0.05", "")]
    with open(tmp_path / "train.csv") as f:
        assert {line.count(",") for line in f} == {len(header) - 1}  # every line as wide as the header


# -- MLflow and W&B: real packages, local stores only -------------------------------------------
def test_mlflow_logs_the_records_metrics_params_and_timings(tmp_path):
    tracking = import_or_missing("mlflow.tracking", "pip install 'torch-speedkit[mlflow]'")
    record, folder = fit_toy(tmp_path, ["mlflow"])  # a SQLite store in the run folder, as MLflow 3 advises

    client = tracking.MlflowClient(f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("speedkit").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    for row in record.steps + record.evals:
        for name, value in numeric_metrics(row).items():
            history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
            assert history[row["batch"]] == pytest.approx(value), name
    assert run.data.params["methods"] == "label_smoothing" and run.data.params["method/label_smoothing/smoothing"] == "0.1"
    assert run.data.tags["speedkit.methods"] == "label_smoothing" and run.data.tags["speedkit.status"] == "completed"
    assert run.data.metrics["timings/train_s"] == pytest.approx(record.timings["train_s"])


def wandb_records(path) -> list:
    """The records of an offline W&B run file: LevelDB's log format (32 KiB blocks of chunks with a 7-byte
    header: CRC, length, type) after a 7-byte ':W&B' header, each record a protobuf wandb ships."""
    from wandb.proto import wandb_internal_pb2

    data, block, offset, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        length, kind = int.from_bytes(data[offset + 4:offset + 6], "little"), data[offset + 6]
        pending += data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def written_wandb_records(path, timeout_s: float = 60.0) -> list:
    """The run file's records once its exit record is there: wandb's service process writes the offline file
    on its own time, and on a busy machine ``run.finish()`` returns while the file holds only its header."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = wandb_records(path)
        except Exception:  # a record caught half-written
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def wandb_items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_wandb_offline_logs_the_records_metrics_config_and_timings(tmp_path, monkeypatch):
    import_or_missing("wandb", "pip install 'torch-speedkit[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing leaves the machine; no account needed
    monkeypatch.setenv("WANDB_SILENT", "true")
    record, folder = fit_toy(tmp_path, ["wandb"])

    (run_file,) = (folder / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    records = written_wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    history = {r.history.step.num: wandb_items(r.history.item) for r in records if r.HasField("history")}
    for row in record.steps + record.evals:
        for name, value in numeric_metrics(row).items():
            assert history[row["batch"]][name] == pytest.approx(value), name
    (run,) = [r.run for r in records if r.HasField("run")]
    config = wandb_items(run.config.update)
    assert run.display_name == "run" and config["methods"] == "label_smoothing"
    assert config["method/label_smoothing/smoothing"] == 0.1
    summary = {}
    for r in records:
        if r.HasField("summary"):
            summary.update(wandb_items(r.summary.update))
    assert summary["timings/train_s"] == pytest.approx(record.timings["train_s"]) and summary["status"] == "completed"
    assert "exit" in kinds and [r.exit.exit_code for r in records if r.HasField("exit")] == [0]


# -- choosing loggers ---------------------------------------------------------------------------
def test_logger_objects_write_where_they_are_told(tmp_path):
    import_or_missing("tensorboard", "pip install 'torch-speedkit[tensorboard]'")
    record, _ = fit_toy(tmp_path, [CSVLogger(tmp_path / "my-csv"), TensorBoardLogger(tmp_path / "my-tb")])
    assert len(read_csv(tmp_path / "my-csv" / "eval.csv")[1]) == len(record.evals)
    assert len(read_events(tmp_path / "my-tb").Scalars("eval/accuracy")) == len(record.evals)


def test_an_unknown_logger_name_is_refused_with_the_known_names(tmp_path):
    train, _ = toy_loaders()
    with pytest.raises(ValueError, match=r"'tensorbord' \(did you mean 'tensorboard'\?\); known names: "
                                         r"tensorboard, csv, mlflow, wandb"):
        Trainer(toy_model(), train, loggers=["tensorbord"], device="cpu", run_dir=tmp_path)


# -- loggers named by a recipe file, and the explorer's runs --------------------------------------
TINY_RUN = ["--duration", "4ba", "--batch-size", "64", "--data-fraction", "0.02", "--eval-fraction", "0.05",
            "--device", "cpu", "--no-progress"]


def recipe_file(tmp_path, loggers) -> str:
    from speedkit.tasks import get_recipe

    recipe = dataclasses.replace(get_recipe("fashion-mnist", "plain"), name="logged", loggers=loggers)
    path = tmp_path / "logged.yaml"
    path.write_text(recipe.to_yaml())
    return str(path)


@needs_fmnist
def test_a_recipe_files_loggers_log_its_runs_and_the_cli_flag_replaces_them(tmp_path):
    from speedkit.cli.main import main

    recipe = recipe_file(tmp_path, ["csv"])
    assert "loggers:\n- csv" in (tmp_path / "logged.yaml").read_text()
    assert main(["train", "--recipe", recipe, *TINY_RUN, "--run-dir", str(tmp_path), "--run-name", "from-file"]) == 0
    assert (tmp_path / "from-file" / "csv" / "eval.csv").is_file()

    import_or_missing("tensorboard", "pip install 'torch-speedkit[tensorboard]'")
    assert main(["train", "--recipe", recipe, *TINY_RUN, "--run-dir", str(tmp_path), "--run-name", "flag",
                 "--logger", "tensorboard"]) == 0
    assert (tmp_path / "flag" / "tensorboard").is_dir() and not (tmp_path / "flag" / "csv").exists()
    assert main(["train", "--recipe", recipe, *TINY_RUN, "--run-dir", str(tmp_path), "--run-name", "quiet",
                 "--logger", "none"]) == 0
    assert (tmp_path / "quiet" / "record.json").is_file() and not (tmp_path / "quiet" / "csv").exists()


def test_a_recipe_file_with_an_unknown_logger_is_refused_when_read(tmp_path):
    from speedkit.tasks.recipes import Recipe

    path = tmp_path / "bad.yaml"
    path.write_text(Path(recipe_file(tmp_path, ["csv"])).read_text().replace("- csv", "- tensorbord"))
    with pytest.raises(ValueError, match=r"recipe 'logged': loggers: unknown logger name 'tensorbord' "
                                         r"\(did you mean 'tensorboard'\?\)"):
        Recipe.from_file(path)
    path.write_text(Path(recipe_file(tmp_path, ["csv"])).read_text().replace("- csv", "- 3"))
    with pytest.raises(TypeError, match="loggers must be a list of logger names"):
        Recipe.from_file(path)


@needs_fmnist
def test_the_explorers_runs_log_to_the_loggers_it_was_given(tmp_path):
    import_or_missing("ipywidgets")
    from speedkit.ui.explorer import MethodExplorer

    explorer = MethodExplorer(run_dir=tmp_path, duration="4ba", data_fraction=0.02, eval_fraction=0.05,
                              device="cpu", update_interval=0.05, live=False, loggers=["csv"])
    explorer.run(wait=True)
    (record,) = explorer.history
    _, rows = read_csv(tmp_path / record.name / "csv" / "eval.csv")
    assert len(rows) == len(record.evals) >= 1
