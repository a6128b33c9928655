"""A run folder has one owner: the rules for ``run_dir/run_name`` before a run writes anything into it.

* ``run_name`` names a folder under ``run_dir`` and cannot leave it (``../x`` and absolute paths are refused).
* A folder that already holds a run (its ``record.json``, ``log.jsonl`` or checkpoints) is not started on
  again by accident: a run continues it (``autoresume``), replaces it (``overwrite``), or takes another name.
  ``overwrite`` deletes only what the run wrote (its record, log, logger folders and checkpoints); the user's
  own files in the folder stay. An attempt killed before its first checkpoint has nothing to continue, so
  ``autoresume`` starts it again (a job controller restarts the same command whenever it likes).
* A run folder holds one run: a folder nested in another run's folder, or holding one, is refused.
* While a run trains, ``run.lock`` in its folder names the process (PID, host, start time) and is held with
  an OS lock (``flock``), which the kernel drops when the process dies however it dies (SIGKILL, OOM
  kill). So a second process is refused naming the first, and a lock file left by a dead process is
  recognised as such and taken over, with a note, instead of blocking the folder forever.
* A resumed run is the same experiment: ``experiment_changes`` compares the whole run description (task,
  recipe and its hyperparameters, model, duration, batch size, methods, seed, precision, data and its
  identity, ...) with the one the run recorded, and the Trainer also with the copy inside the checkpoint it
  would resume from (``speedkit.train.ownership``); lengthening the budget is allowed only when asked for
  (``extend_duration``).

The Trainer applies these rules (so the CLI, the explorer, the benchmark and the tune search all get them);
they live here, beside the RunRecord they protect.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path, PurePath

from speedkit.record.runs import RunRecord, describe_inputs

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the lock falls back to a PID check (see RunLock)
    fcntl = None

LOCK_FILE = "run.lock"
RUN_FILES = ("record.json", "log.jsonl")
CHOICES = ("continue it with --autoresume (autoresume=True), keep it and give this run a new --run-name "
           "(run_name=...), or replace it with --overwrite (overwrite=True)")


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked: in use by another process, holding an earlier run that the
    run would overwrite, or not matching the run it is asked to continue."""


# -- where a run lives ------------------------------------------------------------------------------
def run_folder_path(run_dir: str | os.PathLike, run_name: str) -> Path:
    """``run_dir/run_name``, refusing a name that would put the run outside ``run_dir``."""
    name = PurePath(run_name)
    if name.is_absolute() or ".." in name.parts or name.drive:
        raise ValueError(f"run_name {run_name!r} (--run-name) would write outside run_dir {str(run_dir)!r}; give "
                         f"a name inside it, such as 'baseline-s0' (subfolders like 'sweep/a' are fine), or move "
                         f"run_dir (--run-dir) itself")
    for folder in (Path(run_dir), *(Path(run_dir) / Path(*name.parts[:i]) for i in range(1, len(name.parts) + 1))):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"run_dir (--run-dir) {str(run_dir)!r} with run_name {run_name!r} needs {folder} to be a "
                             f"folder, and it is a file; give a --run-dir (run_dir=...) that is a folder or does not "
                             f"exist yet, or another --run-name")
    too_long = [part for part in name.parts if len(part.encode()) > MAX_NAME_BYTES]
    if too_long:
        raise ValueError(f"run_name (--run-name) has a folder name of {len(too_long[0].encode())} bytes "
                         f"({too_long[0][:40]}...), longer than file systems allow ({MAX_NAME_BYTES}); give a "
                         f"shorter name, or split it into subfolders with '/'")
    return Path(run_dir) / name


MAX_NAME_BYTES = 200  # below the common 255-byte limit: checkpoints' and temp files' names are added to it


def free_run_name(run_dir: str | os.PathLike, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``, ...: the first whose folder under ``run_dir`` does not exist yet."""
    n, free = 1, name
    while (Path(run_dir) / free).exists():
        n += 1
        free = f"{name}-{n}"
    return free


def checkpoint_files(folder: Path) -> list[Path]:
    """The speedkit checkpoints in ``folder`` (``ba*.ckpt``, ``latest.ckpt``)."""
    if not folder.is_dir():
        return []
    return sorted(folder.glob("ba*.ckpt")) + ([folder / "latest.ckpt"] if (folder / "latest.ckpt").exists() else [])


def earlier_run(folder: Path, checkpoint_folder: Path | None) -> str | None:
    """What ``folder`` holds from an earlier run, in words ("a completed run (120 batches, ...)"); None when
    it holds none. Logger folders alone (tensorboard/, csv/) do not count: they hold no record to lose."""
    record_file = folder / "record.json"
    checkpoints = checkpoint_files(checkpoint_folder) if checkpoint_folder is not None else []
    if not record_file.exists():
        if (folder / "log.jsonl").exists() or checkpoints:
            return "an earlier run's log.jsonl or checkpoints, but no record.json (its process ended before writing one)"
        return None
    try:
        record = json.loads(record_file.read_text())
        status, steps = record.get("status", "unknown"), record.get("steps") or []
    except (OSError, ValueError, AttributeError) as e:
        return f"a record.json that cannot be read ({e})"
    batch = steps[-1].get("batch", 0) if steps and isinstance(steps[-1], dict) else 0
    how = ("that was still running when its process stopped (killed, or out of memory)"
           if status in ("running", "created") else f"that ended {status}")
    return (f"a run {how} after {batch} batches (record.json written {record.get('updated') or '?'}"
            f"{', with checkpoints' if checkpoints else ', no checkpoint'})")


# What a run writes into its folder, and so all that ``overwrite`` deletes: its record and log, the folders its
# named loggers write (speedkit.record.loggers.NAMED_LOGGERS), and its checkpoints. Anything else in the folder
# (the user's notebooks, plots, exported weights) is not the run's and stays.
LOGGER_FOLDERS = ("tensorboard", "csv", "mlflow", "wandb")


def run_markers(folder: Path) -> list[str]:
    """The names in ``folder`` that mark it as a run folder (its record, log or lock)."""
    return [name for name in (*RUN_FILES, LOCK_FILE) if (folder / name).exists()]


def other_runs(folder: Path, run_dir: Path | None = None) -> list[str]:
    """Run folders nested in ``folder`` or holding it (up to ``run_dir``), in words: a run folder holds one run.
    ``--overwrite`` of the outer one would delete the inner, and a resume would read the wrong record."""
    found = []
    folder = Path(folder)
    stop = Path(os.path.abspath(run_dir)) if run_dir is not None else None
    here = Path(os.path.abspath(folder))
    for parent in here.parents:
        if stop is None or not (parent == stop or parent.is_relative_to(stop)):
            break
        if run_markers(parent):
            found.append(f"{parent} (holding this one) is a run folder")
    if folder.is_dir():
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "checkpoints" and d not in LOGGER_FOLDERS]
            if Path(root) != folder and any(name in files for name in (*RUN_FILES, LOCK_FILE)):
                found.append(f"{root} (inside this one) is a run folder")
                dirs[:] = []
    return found


def clear_run_folder(folder: Path, checkpoint_folder: Path | None) -> None:
    """Delete an earlier run from ``folder``: its record, log, logger folders and checkpoints; nothing else."""
    for name in RUN_FILES:
        (folder / name).unlink(missing_ok=True)
    for name in LOGGER_FOLDERS:
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            shutil.rmtree(folder / name)
    if checkpoint_folder is not None and checkpoint_folder.is_dir():
        for file in checkpoint_files(checkpoint_folder):
            file.unlink(missing_ok=True)
            shutil.rmtree(file.with_suffix(".dcp"), ignore_errors=True)  # an FSDP checkpoint's shards
        for pattern in ("ba*.ckpt.unusable*", "ba*.dcp.unusable*", ".ba*.ckpt.*.tmp", ".latest.ckpt.link",
                        ".*.dcp.partial", "latest.ckpt.unusable*"):
            for leftover in checkpoint_folder.glob(pattern):
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            checkpoint_folder.rmdir()  # only when empty: the user's own files there stay
    for leftover in folder.glob(".record.json.*.tmp"):
        leftover.unlink(missing_ok=True)


def remove_earlier_runs(folder: str | os.PathLike) -> list[Path]:
    """Delete the run folders directly in ``folder`` (those holding ``record.json`` or ``log.jsonl``), for a
    tool that owns ``folder`` and reruns what it holds (``speedkit notebooks run``); returns what it deleted.
    A run folder that a live process is training in is refused (RunFolderError), and nothing is deleted."""
    folder = Path(folder)
    markers = (*RUN_FILES, LOCK_FILE)  # a run that has only just started holds its lock alone
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and any((p / name).exists() for name in markers)) \
        if folder.is_dir() else []
    for run in runs:
        lock = RunLock(run)
        holder = lock.holder()
        if holder is not None:
            raise lock.refusal(holder)
    for run in runs:
        shutil.rmtree(run, ignore_errors=True)
    return runs


# -- the lock ---------------------------------------------------------------------------------------
def _describe_holder(info: dict) -> str:
    return f"PID {info.get('pid', '?')} on host {info.get('host', '?')} (since {info.get('started', '?')})"


def pid_alive(pid) -> bool:
    """Whether process ``pid`` runs on this machine (one of another user's, which may not be signalled, does)."""
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True
    except (OSError, ValueError, TypeError):
        return False
    return True


class RunLock:
    """``folder/run.lock``: held by the process that trains in ``folder``, naming its PID, host and start.

    The file is held with ``flock``, which the kernel releases when the process ends, however it ends; so
    ``holder`` tells a live owner from a file a dead one left. A lock file naming another host is obeyed
    (this machine cannot see that process) and the refusal says how to clear it. Without ``fcntl``
    (Windows) the lock is the file itself, and a lock naming a PID no longer running on this host is stale.
    """

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def holder(self) -> dict | None:
        """The live process holding the lock (``{"pid", "host", "started"}``), or None. Takes nothing."""
        if self._fd is not None or not self.path.exists():
            return None
        info = self._read()
        if info.get("host", socket.gethostname()) != socket.gethostname():
            return info  # another machine's process: it cannot be checked from here, so it is obeyed
        if fcntl is None:
            return info if pid_alive(info.get("pid")) else None
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return info or {"pid": "?", "host": socket.gethostname()}
        finally:
            os.close(fd)  # closing drops the shared lock just taken
        return None

    def refusal(self, holder: dict) -> RunFolderError:
        folder = self.path.parent
        if holder.get("host") not in (None, socket.gethostname()):
            return RunFolderError(
                f"run folder {folder} is locked by {_describe_holder(holder)}, another machine, which cannot be "
                f"checked from here; if that run has ended, delete {self.path} and start again; otherwise wait "
                f"for it, or give this run another --run-name (run_name=...)")
        return RunFolderError(f"run folder {folder} is in use: {_describe_holder(holder)} is training in it "
                              f"({self.path}); wait for it to end or stop it, or give this run another --run-name "
                              f"(run_name=...)")

    def acquire(self) -> dict | None:
        """Take the lock, or raise RunFolderError naming the process that holds it. Returns what a dead
        process's lock file said (its PID, host, start) when this one took it over, else None."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        holder = self.holder()
        if holder is not None:
            raise self.refusal(holder)
        left = self._read() or None
        while True:
            if fcntl is None:
                self.path.unlink(missing_ok=True)  # holder() found its PID dead (or no file)
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:  # another process took it between the check and here
                    raise self.refusal(self._read()) from None
                break
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self.refusal(self._read()) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the owner released (unlinked) the file while this one opened it: try the new one
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        self._fd = fd
        return left

    def release(self) -> None:
        """Drop the lock and delete the file (a run that ended leaves no lock behind)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None


def stale_lock_note(left: dict) -> str:
    return (f"took over {LOCK_FILE} left by {_describe_holder(left)}, a process that is no longer running "
            f"(killed, or out of memory)")


# -- the same experiment ----------------------------------------------------------------------------
def _model(config: dict, methods) -> tuple:
    return (config.get("recipe_spec", {}).get("model"), config.get("model"), config.get("parameters"))


def _methods(config: dict, methods) -> list:
    return [(m.get("name"), json.dumps(m.get("params", {}), sort_keys=True, default=str)) for m in methods or ()]


# (what, how the user sets it, how to read it from a record's config and methods)
EXPERIMENT = (
    ("task", "--task", lambda c, m: c.get("task")),
    ("recipe", "--recipe", lambda c, m: c.get("recipe")),
    ("model", "--model", _model),
    ("duration", "--duration / max_duration", lambda c, m: c.get("max_duration")),
    ("batch size", "--batch-size", lambda c, m: c.get("batch_size")),
    ("methods", "--methods / methods", _methods),
    ("seed", "--seed / seed", lambda c, m: c.get("seed")),
    ("data fraction", "--data-fraction", lambda c, m: c.get("data_fraction")),
    # what trained, resolved (a size left to its default included), not only what was typed
    ("input size", "--image-size / --eval-image-size", lambda c, m: c.get("inputs")),
)
SINCE_LATER = frozenset({"input size"})  # older records lack these: not compared there


# The rest of the run description (the config a Trainer records, data identity included) is compared key by key;
# these keys say where or how fast it runs, or are measurements and labels, not what is trained.
NOT_COMPARED = frozenset({
    "device", "precision_resolved", "bf16_speedup_measured", "train_loader", "world_size", "parallel", "loggers",
    "recipe_spec.reached", "recipe_spec.summary", "recipe_spec.loggers", "recipe_spec.adopted_from",
    "recipe_spec.methods",  # the same methods as ``methods``, compared there
})
COVERED = frozenset({"task", "recipe", "recipe_spec.model", "model", "parameters", "max_duration",
                     "recipe_spec.duration", "batch_size", "recipe_spec.batch_size", "seed", "data_fraction",
                     "inputs"})
FLAGS = {"precision": "--precision", "recipe_spec.precision": "--precision", "eval_interval": "--eval-interval",
         "recipe_spec.eval_interval": "--eval-interval", "target": "--target", "stop_at_target": "--stop-at-target",
         "eval_fraction": "--eval-fraction", "data": "--data / --image-size and the folder's files",
         "task_options": "--image-size / --skip-unreadable / --no-flips / --sizes / --eval-image-size"}


def _flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name in ("recipe_spec", "recipe_spec.optimizer", "recipe_spec.schedule",
                                                 "recipe_spec.augment", "optimizer"):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _flag(key: str) -> str:
    if key in FLAGS:
        return FLAGS[key]
    if key.startswith("recipe_spec.") or key in ("optimizer", "schedules") or key.startswith("optimizer."):
        return "--recipe: the recipe file's own settings"
    return "the run's settings"


def _shown(what: str, value) -> str:
    if what == "model":
        return str(value[0] or value[1])
    if what == "methods":
        return ", ".join(f"{name}({params})" if params != "{}" else name for name, params in value) or "none"
    if what == "input size" and isinstance(value, dict):
        return describe_inputs(value)
    return repr(value)



def experiment_changes(previous: dict, config: dict, methods: list) -> dict[str, str]:
    """What continuing the run recorded in ``previous`` (a RunRecord as a dict: its ``record.json``, or the copy
    its checkpoint holds) with ``config`` and ``methods`` would change: ``{what: "the run has X, this one asks
    for Y (--flag)"}``, empty when none. The whole description is compared (task, recipe and its
    hyperparameters, model, duration, batch size, methods, seed, data and its identity, precision, target,
    ...), except where the run runs (NOT_COMPARED); a key an older record lacks is not compared."""
    before_config, before_methods = previous.get("config") or {}, previous.get("methods") or []
    config, methods = json.loads(json.dumps(config, default=str)), json.loads(json.dumps(methods, default=str))
    before_config = json.loads(json.dumps(before_config, default=str))
    changes = {}
    for what, flag, read in EXPERIMENT:
        before, now = read(before_config, before_methods), read(config, methods)
        if what == "model" and before[0] is None:  # a hand-built Trainer's record: class and size only
            before, now = before[1:], now[1:]
        if before is None and what in SINCE_LATER:
            continue
        if before != now:
            changes[what] = f"{what}: the run has {_shown(what, before)}, this one asks for {_shown(what, now)} ({flag})"
    flat_before, flat_now = _flatten(before_config), _flatten(config)
    for key, before in flat_before.items():
        if key in NOT_COMPARED or key in COVERED or any(key.startswith(k + ".") for k in NOT_COMPARED):
            continue
        now = flat_now.get(key)
        if before != now:
            changes[key] = f"{key}: the run has {before!r}, this one asks for {now!r} ({_flag(key)})"
    return changes


def check_extension(previous: dict, new_duration: str) -> str:
    """``new_duration`` as a longer budget for the run in ``previous``; a note for its record. Refuses a
    shorter budget or one in another unit (whose length against the old one is unknown before training)."""
    from speedkit.core.time import Time

    old = Time.from_string(str((previous.get("config") or {}).get("max_duration")))
    new = Time.from_string(str(new_duration))
    if old.unit != new.unit or new.value <= old.value:
        raise RunFolderError(f"extend_duration (--extend-duration) makes a run longer: the run has {old}, so give a "
                             f"longer --duration in the same unit ({old.unit.value}), got {new}")
    return str(old)


# -- one run's claim on its folder ------------------------------------------------------------------
class RunFolderClaim:
    """The rules above for one run: ``check`` when the run is built (nothing written, so a refusal loses
    nothing), ``begin`` when it starts training (the lock taken, the check repeated under it, an earlier
    run deleted when overwriting), ``end`` when it stops.

    ``checkpoint_folder`` is where the run's checkpoints are (None: somewhere this process cannot list,
    such as a remote ``save_folder``). ``continuing`` is True while the folder's record belongs to the
    earlier run being continued: until its checkpoint is loaded, nothing may replace that record.
    """

    def __init__(self, folder: Path, checkpoint_folder: Path | None, *, autoresume: bool, overwrite: bool,
                 extend_duration: bool, run_dir: Path | None = None):
        self.folder, self.checkpoint_folder, self.run_dir = Path(folder), checkpoint_folder, run_dir
        self.autoresume, self.overwrite, self.extend_duration = autoresume, overwrite, extend_duration
        self.lock = RunLock(folder)
        self.continuing = False
        self.restarting = False  # autoresume of an attempt killed before its first checkpoint: started afresh
        self.for_record: dict = {}  # for the record, once the run owns it: an extended budget, a lock taken over
        self._began = False  # a second fit of the same run owns its folder already

    def check(self, config: dict, methods: list, max_duration: str) -> None:
        """Refuse (RunFolderError) a folder in use, an earlier run that would be lost, or a resume that
        would change the experiment; sets ``continuing``."""
        holder = self.lock.holder()
        if holder is not None:
            raise self.lock.refusal(holder)
        nested = other_runs(self.folder, self.run_dir)
        if nested:
            raise RunFolderError(f"run folder {self.folder} cannot be used: {'; '.join(nested)}, and a run folder "
                                 f"holds one run (--overwrite of the outer one would delete the inner); nothing was "
                                 f"changed. Give this run a --run-name (run_name=...) beside the other run, not "
                                 f"inside or around it, e.g. 'sweep/c' beside 'sweep/a' and 'sweep/b'")
        earlier = earlier_run(self.folder, self.checkpoint_folder)
        self.continuing = self.restarting = False
        if earlier is None or self.overwrite:
            return
        if not self.autoresume:
            raise RunFolderError(f"run folder {self.folder} already holds {earlier}; {CHOICES}")
        if self.checkpoint_folder is not None and not checkpoint_files(self.checkpoint_folder):
            if self._killed_before_first_checkpoint():
                self.restarting = True  # nothing to continue and nothing finished to lose: start it again
                return
            raise RunFolderError(
                f"autoresume (--autoresume): run folder {self.folder} holds {earlier}, but there is no checkpoint "
                f"in {self.checkpoint_folder} to continue from, so nothing was changed; start it again from the "
                f"beginning with --overwrite (overwrite=True), or keep it and give this run a new --run-name. "
                f"(Runs save a checkpoint every --save-interval / save_interval; one stopped sooner has none.)")
        self.continuing = True
        previous = self._previous_record()
        if previous is not None:
            self._check_same_experiment(previous, config, methods, max_duration)

    def _killed_before_first_checkpoint(self) -> bool:
        """The folder holds only an attempt of a run killed before its first checkpoint (no record, or one that
        says it was running): a job controller restarting the same command with autoresume starts it afresh."""
        if not (self.folder / "record.json").exists():
            return True
        previous = self._previous_record()
        return previous is not None and previous.get("status") in ("running", "created")

    def _previous_record(self) -> dict | None:
        try:
            return json.loads((self.folder / "record.json").read_text())
        except (OSError, ValueError):
            return None  # checkpoints without a record: the checkpoint's own checks decide

    def _check_same_experiment(self, previous: dict, config: dict, methods: list, max_duration: str,
                               source: str = "record.json") -> None:
        changes = experiment_changes(previous, config, methods)
        if self.extend_duration:
            old = check_extension(previous, max_duration)
            changes.pop("duration", None)
            self.for_record["extended_duration"] = {"from": old, "to": str(max_duration)}
        if changes:
            hint = (" To train it longer, pass --extend-duration (extend_duration=True) with the longer --duration."
                    if "duration" in changes else "")
            inputs = (previous.get("config") or {}).get("inputs") or {}
            if "input size" in changes and inputs.get("unit") == "px":
                evaluated = inputs.get("eval")
                hint += (f" It trained at {describe_inputs(inputs)}: to continue it, give the sizes it trained at "
                         f"(--image-size {inputs.get('train')}"
                         + (f" --eval-image-size {evaluated}" if evaluated not in (None, inputs.get("train")) else "")
                         + ").")
            raise RunFolderError(f"autoresume (--autoresume): the run in {self.folder} is a different experiment: "
                                 + "; ".join(changes.values()) + f" (as its {source} describes it). Continue it "
                                 "with its own settings, or start this one under another --run-name; nothing was "
                                 "changed." + hint)

    def check_against_checkpoint(self, previous: dict, checkpoint: str, config: dict, methods: list,
                                 max_duration: str) -> None:
        """The same check against the run description the checkpoint to resume from holds (its own copy of the
        record), which is what the resumed weights were trained under, whatever record.json says."""
        self._check_same_experiment(previous, config, methods, max_duration, source=f"checkpoint {checkpoint}")

    def begin(self, config: dict, methods: list, max_duration: str) -> list[str]:
        """Take the lock, check again under it, delete an earlier run when overwriting; returns what to log."""
        left = self.lock.acquire()
        said = [stale_lock_note(left)] if left else []
        if self._began:
            return said
        try:
            self.check(config, methods, max_duration)
        except BaseException:
            self.lock.release()
            raise
        earlier = earlier_run(self.folder, self.checkpoint_folder) if self.overwrite or self.restarting else None
        if earlier is not None:  # asked for: noted in the new record, not warned about
            key = "overwrote" if self.overwrite else "restarted"
            self.for_record[key] = f"deleted {earlier}" + ("" if self.overwrite else ": autoresume found no "
                                                           "checkpoint to continue from, so the run started again")
            clear_run_folder(self.folder, self.checkpoint_folder)
        if left:
            self.for_record["lock_taken_over"] = said[0]
        self._began = True
        return said

    def end(self) -> None:
        self.lock.release()


def record_again(previous: dict, path: str, checkpoint: str):
    """The record of a run that ended, written again at ``path`` from the copy its final ``checkpoint`` holds (a
    kill landed between that checkpoint and the record), naming that checkpoint as its last."""
    finished = RunRecord.from_dict(previous)
    finished.path = path
    finished.notes["last_checkpoint"] = checkpoint
    finished.save()
    return finished
