"""Loggers: where metrics go. The Logger fans one call out to every destination.

The run's RunRecord is always one destination, so the record, the console, the JSONL file and the
TensorBoard and CSV loggers see exactly the same numbers. Besides metrics, every destination hears of
the run twice: at fit start (its config and methods, ``log_run_start``) and at its end (its timings and
status, ``log_run_end``).

What a component has to say about the run (a method's surgery report, the microbatch size a run settled
on, the checkpoint it wrote last) it reports with ``logger.log_note(key, value)``, and a timing of its own
(``compile_s``) with ``logger.log_timing``; the record's destination writes them into ``record.notes`` and
``record.timings``. A component keeps what it needs to resume in its own ``state_dict``, never in the record.
"""
from __future__ import annotations

import csv
import difflib
import importlib
import json
import os
import sys
import time
from pathlib import Path

from speedkit.record.runs import json_safe


def _position(state) -> dict:
    ts = state.timestamp
    return {"batch": ts.batch, "epoch": ts.epoch, "sample": ts.sample, "token": ts.token,
            "wall_s": round(ts.wall_s, 4)}


def run_hyperparams(record) -> dict:
    """The run's config, target and methods as one flat ``{name: number | str | bool}`` dict, the shape
    TensorBoard's hparams and a two-column CSV both take: nested keys joined with ``/``
    (``optimizer/lr``), each method's parameters under ``method/<name>/``, ``methods`` listing them all."""
    flat = _flatten({"run_name": record.name, **record.config})
    if record.target:
        flat.update(_flatten({"target": record.target}))
    flat["methods"] = ",".join(record.method_names)
    for method in record.methods:
        flat.update(_flatten(method["params"], prefix=f"method/{method['name']}/"))
    return flat


def _flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, prefix=f"{prefix}{key}/"))
        elif isinstance(value, (bool, int, float, str)):
            flat[f"{prefix}{key}"] = value
        else:  # None, lists, tuples: kept readable rather than dropped
            flat[f"{prefix}{key}"] = json.dumps(json_safe(value))
    return flat


class LoggerDestination:
    def log_metrics(self, metrics: dict, position: dict) -> None:
        pass

    def log_text(self, text: str) -> None:
        pass

    def log_note(self, key: str, value, append: bool = False) -> None:
        """A fact about the run for ``record.notes[key]`` (``append``: one more item of the list there)."""

    def log_timing(self, key: str, seconds: float, add: bool = False) -> None:
        """Seconds for ``record.timings[key]`` (``add``: added to what is there)."""

    def log_run_start(self, record) -> None:
        """At fit start: ``record.config``, ``record.methods`` and ``record.target`` are final."""

    def log_run_end(self, record, position: dict) -> None:
        """At the run's end (any ending): ``record.timings`` and ``record.status`` are final."""

    def close(self) -> None:
        pass


class InMemoryLogger(LoggerDestination):
    """Keeps every logged row; handy in notebooks and tests."""

    def __init__(self):
        self.rows: list[dict] = []
        self.texts: list[str] = []

    def log_metrics(self, metrics, position):
        self.rows.append({**position, **metrics})

    def log_text(self, text):
        self.texts.append(text)

    def series(self, key: str, x: str = "batch") -> tuple[list, list]:
        pairs = [(r[x], r[key]) for r in self.rows if key in r]
        return [p[0] for p in pairs], [p[1] for p in pairs]


class JSONLFileLogger(LoggerDestination):
    """One JSON object per line; flushed each write so a killed run keeps its log."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")

    def log_metrics(self, metrics, position):
        self._file.write(json.dumps(json_safe({**position, **metrics})) + "\n")
        self._file.flush()

    def log_text(self, text):
        self._file.write(json.dumps({"text": text}) + "\n")
        self._file.flush()

    def close(self):
        self._file.close()


class ConsoleLogger(LoggerDestination):
    """Prints evaluation results (and train metrics every ``every`` rows) as one line each."""

    def __init__(self, stream=None, train_every: int = 0):
        self.stream = stream or sys.stdout
        self.train_every = train_every
        self._train_rows = 0

    def log_metrics(self, metrics, position):
        is_eval = any(k.startswith("eval") for k in metrics)
        if not is_eval:
            self._train_rows += 1
            if not self.train_every or self._train_rows % self.train_every:
                return
        values = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        print(f"[ep {position['epoch']} ba {position['batch']} {position['wall_s']:.1f}s] {values}",
              file=self.stream, flush=True)

    def log_text(self, text):
        print(text, file=self.stream, flush=True)


class RecordDestination(LoggerDestination):
    """Writes what is logged into the RunRecord: eval metrics as eval rows, the rest as step rows; notes and
    timings into ``notes`` and ``timings``."""

    def __init__(self, record):
        self.record = record

    def log_metrics(self, metrics, position):
        if any(k.startswith("eval") for k in metrics):
            self.record.add_eval(position, metrics)
        else:
            self.record.add_step(position, metrics)

    def log_note(self, key, value, append=False):
        self.record.add_note(key, value, append=append)

    def log_timing(self, key, seconds, add=False):
        if add:
            self.record.add_timing(key, seconds)
        else:
            self.record.set_timing(key, seconds)


class Logger:
    """What methods and callbacks call. ``state`` supplies the position of every row."""

    def __init__(self, state, destinations=()):
        self.state = state
        self.destinations = list(destinations)

    def log_metrics(self, metrics: dict) -> None:
        position = _position(self.state)
        for d in self.destinations:
            d.log_metrics(metrics, position)

    def log_text(self, text: str) -> None:
        for d in self.destinations:
            d.log_text(text)

    def log_note(self, key: str, value, append: bool = False) -> None:
        """Report a fact about the run (see the module notes); ``append`` adds one item to a list of them."""
        for d in self.destinations:
            _optional_hook(d, "log_note")(key, value, append)

    def log_timing(self, key: str, seconds: float, add: bool = False) -> None:
        """Report seconds a component spent (``add``: added to what it reported before)."""
        for d in self.destinations:
            _optional_hook(d, "log_timing")(key, seconds, add)

    def log_run_start(self, record) -> None:
        for d in self.destinations:
            _optional_hook(d, "log_run_start")(record)

    def log_run_end(self, record) -> None:
        position = _position(self.state)
        for d in self.destinations:
            _optional_hook(d, "log_run_end")(record, position)

    def close(self) -> None:
        for d in self.destinations:
            d.close()


def _optional_hook(destination, name: str):
    """A destination's run hook, or a no-op: destinations written before the hooks (duck-typed, not
    subclassing LoggerDestination) keep working."""
    return getattr(destination, name, None) or (lambda *args: None)


def _optional_import(module: str, extra: str):
    """``module``, imported only when its logger is asked for: speedkit runs without tensorboard, mlflow or wandb."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # torch.utils.tensorboard raises this too when the tensorboard package is missing
        raise ImportError(f"the {extra} logger needs the {extra} package: pip install 'torch-speedkit[{extra}]'"
                          f" (import failed: {e})") from e


def _summary_writer_class():
    return _optional_import("torch.utils.tensorboard", "tensorboard").SummaryWriter


def _numeric(metrics: dict) -> dict[str, float]:
    """The metrics that can be drawn as a curve: numbers and bools (strings and None have none)."""
    return {name: float(value) for name, value in metrics.items() if isinstance(value, (int, float))}


class TensorBoardLogger(LoggerDestination):
    """Writes TensorBoard event files into ``log_dir``: every numeric metric as a scalar at its batch, the
    run's config and methods as text and as hparams (the HPARAMS tab) at fit start, its timings as
    ``timings/<name>`` scalars and its status at the end. ``tensorboard --logdir <run_dir>`` shows them.

    The writer opens at the first write and closes at the run's end, so a Trainer that never fits
    leaves no folder, and a killed run keeps what was flushed (every ``flush_secs``).
    """

    def __init__(self, log_dir, flush_secs: int = 10):
        self._writer_class = _summary_writer_class()  # fail at construction, not in the middle of a run
        self.log_dir = Path(log_dir)
        self.flush_secs = flush_secs
        self._writer = None
        self._texts = 0

    @property
    def writer(self):
        if self._writer is None:
            self._writer = self._writer_class(log_dir=str(self.log_dir), flush_secs=self.flush_secs)
        return self._writer

    def log_metrics(self, metrics, position):
        for name, value in _numeric(metrics).items():
            self.writer.add_scalar(name, value, global_step=position["batch"])

    def log_text(self, text):
        self._texts += 1
        self.writer.add_text("log", text, global_step=self._texts)

    def log_run_start(self, record):
        hyperparams = run_hyperparams(record)
        self.writer.add_text("config", _json_block(record.config))
        self.writer.add_text("methods", _json_block(record.methods))
        self._write_hparams(hyperparams, record)

    def _write_hparams(self, hyperparams: dict, record) -> None:
        # Into this writer's own event file: SummaryWriter.add_hparams would start a second run folder.
        from torch.utils.tensorboard.summary import hparams

        metrics = {record.target["metric"]: 0.0} if record.target else {}
        for summary in hparams(hyperparams, metrics):
            self.writer.file_writer.add_summary(summary)

    def log_run_end(self, record, position):
        for name, seconds in record.timings.items():
            self.writer.add_scalar(f"timings/{name}", float(seconds), global_step=position["batch"])
        self.writer.add_text("status", f"{record.status}" + (f": {record.error}" if record.error else ""),
                             global_step=position["batch"])
        self.close()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _json_block(value) -> str:
    """JSON as a markdown code block: TensorBoard's text tab renders markdown."""
    return "```json\n" + json.dumps(json_safe(value), indent=2) + "\n```"


class CSVTable:
    """One CSV file whose header grows: a row with a new metric name rewrites the file with the wider header
    (written to a temporary file, then renamed), so every row stays under the right column."""

    def __init__(self, path: Path):
        self.path = path
        self.columns: list[str] | None = None  # read from the file at the first append (a resumed run's file)

    def append(self, row: dict) -> None:
        if self.columns is None:
            self.columns = self._header()
        new = [k for k in row if k not in self.columns]
        if new or not self.path.exists():
            self._rewrite(self.columns + new)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)

    def _rewrite(self, columns: list[str]) -> None:
        rows = self._read() if self.path.exists() else []
        self.columns = columns
        write_csv(self.path, columns, rows)

    def _header(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return next(csv.reader(f), [])

    def _read(self) -> list[dict]:
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))


def write_csv(path: Path, columns, rows) -> None:
    """Write a whole CSV file atomically: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as f:
        writer = csv.DictWriter(f, list(columns))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, path)


class CSVLogger(LoggerDestination):
    """CSV files in ``folder``: ``train.csv`` (one row per logged batch) and ``eval.csv`` (one row per
    evaluation), each with the position columns (batch, epoch, sample, token, wall_s) then one column per
    metric in order of first appearance; ``hparams.csv`` (name, value) at fit start and ``timings.csv``
    (name, value, and the run's status) at the end. Train and eval live apart because their metrics differ;
    a metric first seen late widens its file's header (see CSVTable).

    Like the RunRecord, metrics logged at the same batch by several callbacks share one train row: the row
    is written when the next batch is logged or the run ends. Rows are appended, so a run resumed from a
    checkpoint adds its rows after the first run's (batches after that checkpoint then appear twice; the
    later rows are the resumed run's).
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self.train = CSVTable(self.folder / "train.csv")
        self.eval = CSVTable(self.folder / "eval.csv")
        self._pending: dict | None = None  # the current batch's train row

    def log_metrics(self, metrics, position):
        row = {**position, **json_safe(metrics)}
        if any(k.startswith("eval") for k in metrics):
            self.eval.append(row)
        elif self._pending is not None and self._pending["batch"] == position["batch"]:
            self._pending.update(row)
        else:
            self._write_pending()
            self._pending = row

    def _write_pending(self) -> None:
        if self._pending is not None:
            self.train.append(self._pending)
            self._pending = None

    def log_run_start(self, record):
        rows = [{"name": k, "value": v} for k, v in run_hyperparams(record).items()]
        write_csv(self.folder / "hparams.csv", ("name", "value"), rows)

    def log_run_end(self, record, position):
        self._write_pending()
        rows = [{"name": k, "value": v} for k, v in record.timings.items()]
        rows.append({"name": "status", "value": record.status})
        write_csv(self.folder / "timings.csv", ("name", "value"), rows)

    def close(self):
        self._write_pending()


# What a run's status means to MLflow.
MLFLOW_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "target_reached": "FINISHED", "failed": "FAILED",
                 "interrupted": "KILLED", "terminated": "KILLED"}


class MLflowLogger(LoggerDestination):
    """One MLflow run per fit, in ``experiment`` of the tracking store at ``tracking_uri`` (a server's URL, or
    ``sqlite:///<path>/mlflow.db``; None: MLflow's own choice, ``MLFLOW_TRACKING_URI``). Metrics at their
    batch as the step, the config and methods as params (flattened as for TensorBoard) at fit start, the
    methods also as the tag ``"speedkit.methods"``; at the end ``timings/<name>`` metrics, the tag
    ``"speedkit.status"`` and the run ended as FINISHED, FAILED or KILLED. Text lines are not sent (MLflow keeps
    text only as artifacts). Uses ``MlflowClient``, so it never touches MLflow's global active run.
    """

    def __init__(self, tracking_uri=None, experiment: str = "speedkit"):
        self._tracking = _optional_import("mlflow.tracking", "mlflow")
        self._entities = importlib.import_module("mlflow.entities")
        self.tracking_uri = str(tracking_uri) if tracking_uri else None
        self.experiment = experiment
        self.run_id: str | None = None
        self._client = None

    @classmethod
    def in_folder(cls, folder) -> "MLflowLogger":
        """A SQLite store in ``folder`` (MLflow 3 refuses its plain-file store), unless MLFLOW_TRACKING_URI names one."""
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path(folder) / 'mlflow.db').resolve()}"
        return cls(tracking_uri=uri)

    def _start_run(self, name: str | None) -> None:
        if self.tracking_uri and self.tracking_uri.startswith("sqlite:///"):  # SQLite makes no folders
            Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        client = self._client = self._client or self._tracking.MlflowClient(self.tracking_uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(self.experiment)
        self.run_id = client.create_run(experiment_id, run_name=name).info.run_id

    def log_metrics(self, metrics, position):
        if self.run_id is None:  # metrics before fit (a trainer.eval()) get a run of their own
            self._start_run(None)
        self._send_metrics(_numeric(metrics), position["batch"])

    def _send_metrics(self, metrics: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        rows = [self._entities.Metric(name, value, now_ms, step) for name, value in metrics.items()]
        if rows:
            self._client.log_batch(self.run_id, metrics=rows)

    def log_run_start(self, record):
        self._start_run(record.name)
        params = [self._entities.Param(k, str(v)) for k, v in run_hyperparams(record).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a call
            self._client.log_batch(self.run_id, params=params[start:start + 100])
        self._client.set_tag(self.run_id, "speedkit.methods", ",".join(record.method_names))

    def log_run_end(self, record, position):
        if self.run_id is None:
            return
        self._send_metrics({f"timings/{k}": float(v) for k, v in record.timings.items()}, position["batch"])
        self._client.set_tag(self.run_id, "speedkit.status", record.status)
        self._client.set_terminated(self.run_id, MLFLOW_STATUS.get(record.status, "FINISHED"))
        self.run_id = None


class WandBLogger(LoggerDestination):
    """One Weights & Biases run per fit (``wandb.init(project=..., dir=folder, mode=mode)``): metrics at their batch
    as the step, the config and methods (flattened as for TensorBoard) as the run's config at fit start, the
    ``timings/<name>`` and ``status`` in its summary at the end, then the run finished (exit code 1 unless
    it completed, stopped or reached its target). ``mode="offline"`` (or ``WANDB_MODE=offline``) writes only
    to ``folder/wandb``; ``wandb sync`` uploads it later. Other ``wandb.init`` arguments pass through.
    Text lines are not sent (W&B records the console itself).
    """

    FINISHED = ("completed", "stopped", "target_reached")

    def __init__(self, project: str = "speedkit", folder=None, mode: str | None = None, **init_kwargs):
        self._wandb = _optional_import("wandb", "wandb")
        self.project, self.folder, self.mode = project, Path(folder) if folder else None, mode
        self.init_kwargs = init_kwargs
        self.run = None

    def _start_run(self, name: str | None, config: dict) -> None:
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)  # wandb.init wants the folder to exist
        self.run = self._wandb.init(project=self.project, name=name, config=config, mode=self.mode,
                                    dir=str(self.folder) if self.folder else None, reinit="create_new",
                                    **self.init_kwargs)

    def log_metrics(self, metrics, position):
        if self.run is None:  # metrics before fit (a trainer.eval()) get a run of their own
            self._start_run(None, {})
        self.run.log(_numeric(metrics), step=position["batch"])

    def log_run_start(self, record):
        self._start_run(record.name, run_hyperparams(record))

    def log_run_end(self, record, position):
        if self.run is None:
            return
        self.run.summary.update({**{f"timings/{k}": v for k, v in record.timings.items()}, "status": record.status})
        self.run.finish(exit_code=0 if record.status in self.FINISHED else 1)
        self.run = None

    def close(self):
        if self.run is not None:  # a run started by metrics outside fit
            self.run.finish()
            self.run = None


# Loggers a Trainer (``loggers=["tensorboard"]``) or ``speedkit train --logger`` can name: each writes into
# the folder of that name inside the run folder (MLflow: unless MLFLOW_TRACKING_URI names a store).
NAMED_LOGGERS = {"tensorboard": TensorBoardLogger, "csv": CSVLogger, "mlflow": MLflowLogger.in_folder,
                 "wandb": lambda folder: WandBLogger(folder=folder)}


def check_logger_name(name: str) -> None:
    if name not in NAMED_LOGGERS:
        close = difflib.get_close_matches(name, list(NAMED_LOGGERS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"loggers: unknown logger name {name!r}{hint}; known names: {', '.join(NAMED_LOGGERS)}, "
                         "or pass a speedkit.record.loggers.LoggerDestination object")


def logger_from_name(name: str, run_folder) -> LoggerDestination:
    """The logger ``name`` writing into ``run_folder/name`` (``runs/<run>/tensorboard``, ``runs/<run>/csv``)."""
    check_logger_name(name)
    return NAMED_LOGGERS[name](Path(run_folder) / name)
