"""RunRecord: a run as data (config, methods, metric history, timings, environment), JSON on disk.

Live plots, the run board, benchmark tables and README figures are all drawn from these records,
so a run made headlessly and one made by hand produce the same figures.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import tempfile
import uuid
from pathlib import Path
from typing import Any

from speedkit.version import __version__

RECORD_VERSION = 1
LOWER_IS_BETTER = ("loss", "perplexity", "bpb", "bits_per_byte", "error")


def lower_is_better(metric: str) -> bool:
    """Loss-like metrics improve downwards; accuracy-like ones upwards."""
    name = metric.rsplit("/", 1)[-1].lower()
    return any(word in name for word in LOWER_IS_BETTER)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write then rename, so a kill mid-write never leaves a half-written file under ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600; the file gets what open() would give it
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename is None and error.errno is not None:
            raise type(error)(error.errno, error.strerror, str(path)) from error  # a write names no file: name it
        raise


def _umask() -> int:
    """The process's umask: from /proc where Linux shows it, else by setting it and setting it back (a moment in
    which another thread's new files would get 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def json_safe(value: Any) -> Any:
    """Floats that JSON cannot hold (nan, inf) become None; tensors and numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


# The endings of a run that went as it was asked to: its budget ran out, or it stopped at its target. A run
# stopped by hand, interrupted, terminated or failed ended early, and one killed outright still says "running".
AS_ASKED = ("completed", "target_reached")


@dataclasses.dataclass
class RunRecord:
    """One training run. ``steps`` holds train metrics every few batches; ``evals`` every evaluation.

    Each row carries its position: ``batch``, ``epoch``, ``sample``, ``token`` and ``wall_s`` (training
    wall clock: plain evaluation excluded, set-up and evaluation work of methods included), so curves can
    be drawn against time or samples seen.
    """

    name: str = ""
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: str = dataclasses.field(default_factory=_now)
    updated: str = ""
    status: str = "created"  # created | running | completed | stopped | target_reached | failed | interrupted | terminated
    stop_reason: str | None = None
    error: str | None = None
    config: dict = dataclasses.field(default_factory=dict)
    methods: list = dataclasses.field(default_factory=list)  # [{"name": ..., "params": {...}}]
    target: dict | None = None  # {"metric": "eval/accuracy", "value": 0.92}
    steps: list = dataclasses.field(default_factory=list)
    evals: list = dataclasses.field(default_factory=list)
    timings: dict = dataclasses.field(default_factory=dict)  # train_s, eval_s, checkpoint_s, compile_s, ...
    final_metrics: dict = dataclasses.field(default_factory=dict)
    environment: dict = dataclasses.field(default_factory=dict)
    notes: dict = dataclasses.field(default_factory=dict)  # surgery reports and anything else methods add
    version: int = RECORD_VERSION
    path: str | None = dataclasses.field(default=None, compare=False)

    # -- filling in -----------------------------------------------------------------------
    def add_step(self, position: dict, metrics: dict) -> None:
        row = {**position, **json_safe(metrics)}
        if self.steps and self.steps[-1].get("batch") == position.get("batch"):
            self.steps[-1].update(row)  # several loggers at one batch share a row
        else:
            self.steps.append(row)

    def add_eval(self, position: dict, metrics: dict) -> None:
        self.evals.append({**position, **json_safe(metrics)})

    def add_timing(self, key: str, seconds: float) -> None:
        """Add ``seconds`` to ``timings[key]`` (e.g. ``eval_s``), kept to 0.1 ms."""
        self.timings[key] = round(self.timings.get(key, 0.0) + seconds, 4)

    def set_timing(self, key: str, seconds: float) -> None:
        """``timings[key] = seconds`` (e.g. ``train_s``), kept to 0.1 ms."""
        self.timings[key] = round(seconds, 4)

    def add_note(self, key: str, value: Any, append: bool = False) -> None:
        """``notes[key] = value``, or with ``append`` one more item of the list ``notes[key]``."""
        if append:
            self.notes.setdefault(key, []).append(value)
        else:
            self.notes[key] = value

    def continue_from(self, earlier: "RunRecord") -> None:
        """Carry on the run whose earlier part wrote ``earlier`` (a resume): its id, creation time, metric rows,
        timings and notes. The record is output: nothing is read back from it to resume."""
        self.run_id, self.created = earlier.run_id, earlier.created
        self.steps, self.evals, self.timings, self.notes = earlier.steps, earlier.evals, earlier.timings, earlier.notes
        self.final_metrics = dict(earlier.final_metrics)  # until an evaluation of the resumed run replaces them

    # -- reading --------------------------------------------------------------------------
    @property
    def method_names(self) -> list[str]:
        return [m["name"] for m in self.methods]

    def what_trains(self) -> str:
        """What the run trains, for a person at its start, read from this record: the model and its size, the
        input sizes it trains and evaluates at, the precision as resolved and why, the methods on and those its
        preset names that are off (and why), the data and the share of it, and the budget."""
        c = self.config
        model = (c.get("recipe_spec") or {}).get("model") or c.get("model") or "a model"
        parameters = f" ({c['parameters']:,} parameters)" if isinstance(c.get("parameters"), int) else ""
        where = ", ".join(f"{k} {c[k]}" for k in ("task", "recipe") if c.get(k))
        lines = [f"what trains: {model}{parameters}" + (f", {where}" if where else "")]
        if c.get("inputs"):
            lines.append(f"  inputs:    {describe_inputs(c['inputs'])}")
        lines += [f"  precision: {_precision_text(c)}", f"  methods:   {_methods_text(self.method_names, c)}",
                  f"  data:      {_data_text(c)}", f"  budget:    {_budget_text(c, self.target)}"]
        return "\n".join(lines)

    @property
    def last_checkpoint(self) -> Path | None:
        """The run's newest checkpoint (``notes["last_checkpoint"]``) as a path. The record names a checkpoint
        inside its run folder (the folder of ``record.json``) relative to that folder, so a copied or moved run
        folder names its own checkpoint; one elsewhere (a ``save_folder``) by its absolute path."""
        name = self.notes.get("last_checkpoint")
        if not name:
            return None
        if self.path is None or Path(name).is_absolute():
            return Path(name)
        return Path(self.path).parent / name

    def series(self, key: str, x: str = "wall_s", source: str | None = None) -> tuple[list, list]:
        """(xs, ys) for one metric, from evals if the key is an eval metric, else from steps."""
        rows = getattr(self, source) if source else (self.evals if key.startswith("eval") else self.steps)
        pairs = [(r[x], r[key]) for r in rows if r.get(key) is not None and x in r]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def time_to(self, metric: str, value: float, x: str = "wall_s") -> float | None:
        """The first ``x`` (training seconds by default; or ``"batch"``, ``"sample"``, ``"token"``: counted work)
        at which ``metric`` reached ``value``, else None (also where the evaluation did not log ``x``)."""
        lower = lower_is_better(metric)
        for row in self.evals:
            v = row.get(metric)
            if v is not None and (v <= value if lower else v >= value):
                return row.get(x)
        return None

    @property
    def time_to_target(self) -> float | None:
        if not self.target:
            return None
        return self.time_to(self.target["metric"], self.target["value"])

    def best(self, metric: str) -> float | None:
        values = [r[metric] for r in self.evals if r.get(metric) is not None]
        if not values:
            return None
        return min(values) if lower_is_better(metric) else max(values)

    # -- disk -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("path")
        d["time_to_target_s"] = self.time_to_target
        return json_safe(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        path = Path(path or self.path or f"{self.name or self.run_id}.json")
        self.path = str(path)
        self.updated = _now()
        atomic_write_bytes(path, self.to_json().encode())
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "RunRecord":
        if not isinstance(d, dict) or "run_id" not in d:
            raise ValueError("not a speedkit RunRecord: expected a JSON object with a 'run_id'")
        if d.get("version", 0) > RECORD_VERSION:
            raise ValueError(f"RunRecord version {d['version']} is newer than this speedkit reads "
                             f"({RECORD_VERSION}); upgrade speedkit")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields and k != "path"})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunRecord":
        path = Path(path)
        if path.is_dir():
            path = path / "record.json"
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); it is not a complete RunRecord") from e
        record = cls.from_dict(d)
        record.path = str(path)
        return record


def describe_inputs(inputs: dict) -> str:
    """``{"train": 32, "eval": 48, "unit": "px"}`` as "32 px (evaluated at 48 px)", or "32 px" where both agree."""
    unit = inputs.get("unit", "")
    train, evaluate = inputs.get("train"), inputs.get("eval")
    if train is None or evaluate is None or train == evaluate:
        shown = train if train is not None else evaluate
        return f"{shown} {unit}" + (" (evaluation)" if train is None else "")
    return f"{train} {unit} (evaluated at {evaluate} {unit})"


def _precision_text(config: dict) -> str:
    """The precision a run trains in, and why where it is not what its preset states."""
    asked, resolved = config.get("precision"), config.get("precision_resolved") or config.get("precision")
    why = []
    if config.get("precision_published"):
        why.append(f"the preset states {config['precision_published']}; task {config.get('task')} runs it as "
                   f"{asked} here")
    measured = config.get("bf16_speedup_measured")
    if asked == "auto" and measured is not None:  # a CPU: auto measured bf16 against fp32 there
        why.append(f"this CPU has no fast bf16: bf16 autocast measured at {measured:.2f}x fp32's speed"
                   if resolved == "fp32" else f"bf16 autocast measured at {measured:.2f}x fp32's speed here")
    elif asked == "auto":
        why.append(f"auto on {config.get('device', 'this device')}")
    elif asked != resolved:
        why.append(f"asked {asked}")
    return f"{resolved}" + (f" ({'; '.join(why)})" if why else "")


def _methods_text(names: list[str], config: dict) -> str:
    off = config.get("switched_off") or {}
    text = ", ".join(names) or "none"
    return text + ("; off: " + "; ".join(f"{name} ({why})" for name, why in off.items()) if off else "")


def _data_text(config: dict) -> str:
    data = config.get("data")
    if isinstance(data, dict):
        shown = data.get("path", "?") + (f" (data_fingerprint {data['fingerprint']})" if data.get("fingerprint") else "")
    else:
        shown = str(data) if data is not None else f"task {config.get('task', '?')}'s own data"
    fraction = config.get("data_fraction", 1.0)
    share = "all of it" if fraction in (None, 1, 1.0) else f"a {fraction:g} share of it"
    evaluation = config.get("eval_fraction")
    return f"{shown}, training on {share}" + (f", evaluating on a {evaluation:g} share" if evaluation else "")


def _budget_text(config: dict, target: dict | None) -> str:
    text = f"{config.get('max_duration', '?')} at batch {config.get('batch_size') or '?'}"
    if config.get("eval_interval") not in (None, "None"):
        text += f", evaluated every {config['eval_interval']}"
    target = target or config.get("target")
    if target:
        text += f"; target {target['metric']} {target['value']:g}" + (" (ends there)" if config.get("stop_at_target") else "")
    return text


def load_records(folder: str | os.PathLike) -> list[RunRecord]:
    """Every RunRecord under ``folder`` (``*/record.json`` and ``*.json``), oldest first; others skipped."""
    records = []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            records.append(RunRecord.load(path))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(records, key=lambda r: r.created)


# -- environment -------------------------------------------------------------------------------
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device=None) -> dict:
    """What a figure needs to be read honestly: versions, device, threads, processor names."""
    import torch

    env = {
        "speedkit": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device) if device is not None else None,
    }
    if device is not None and torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    return env
