"""Loggers: where metrics go. The Logger fans one call out to every destination.

The run's RunRecord is always one destination, so the record, the console and the JSONL file
see exactly the same numbers.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from speedkit.runs import json_safe


def _position(state) -> dict:
    ts = state.timestamp
    return {"batch": ts.batch, "epoch": ts.epoch, "sample": ts.sample, "token": ts.token,
            "wall_s": round(ts.wall_s, 4)}


class LoggerDestination:
    def log_metrics(self, metrics: dict, position: dict) -> None:
        pass

    def log_text(self, text: str) -> None:
        pass

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
    """Writes logged metrics into the RunRecord: eval metrics as eval rows, the rest as step rows."""

    def __init__(self, record):
        self.record = record

    def log_metrics(self, metrics, position):
        if any(k.startswith("eval") for k in metrics):
            self.record.add_eval(position, metrics)
        else:
            self.record.add_step(position, metrics)


class Logger:
    """What algorithms and callbacks call. ``state`` supplies the position of every row."""

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

    def close(self) -> None:
        for d in self.destinations:
            d.close()
