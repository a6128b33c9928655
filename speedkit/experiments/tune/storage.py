"""Where a search lives: an Optuna storage (a journal file or a database) holding what it proposed and measured on
its own seed, which of the baseline plan's and the confirmation's runs finished (the runs themselves are RunRecords
in the run folder) and the confirmation's plan, and the bookkeeping of processes that work on one study (which
worker holds a trial, trials a dead worker left behind, how much search time earlier runs used).
"""
from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

from speedkit.record.run_folder import pid_alive

STALE_LOCK_S = 5


def optuna_module():
    try:
        import optuna
    except ImportError:
        raise ImportError("speedkit tune needs Optuna: pip install 'torch-speedkit[tune]' (or pip install 'optuna>=4')") from None
    return optuna


def storage_url(storage: str | os.PathLike | None, out_dir: Path) -> str:
    """A database URL as given, ``sqlite:///`` for ``*.db``/``*.sqlite`` paths, else a journal file path."""
    if storage is None:
        return str((out_dir / "study.journal").resolve())
    text = str(storage)
    if "://" in text:
        return text
    path = Path(text).resolve()
    return f"sqlite:///{path}" if path.suffix in (".db", ".sqlite", ".sqlite3") else str(path)


@functools.lru_cache(maxsize=16)
def open_storage(url: str):
    """The Optuna storage at ``url``, one object per process (a database checks its schema when opened)."""
    optuna = optuna_module()
    if "://" in url:
        return optuna.storages.RDBStorage(url)
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    # A write holds the lock for milliseconds; one left by a killed process is taken over after 5 s (Optuna's
    # default waits 30 s, which a resumed search would spend doing nothing).
    lock = JournalFileSymlinkLock(url, grace_period=STALE_LOCK_S)
    return optuna.storages.JournalStorage(JournalFileBackend(url, lock_obj=lock))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def fail_dead_trials(study, storage, out_dir=None) -> list[int]:
    """Mark RUNNING trials whose worker process on this machine is gone as FAIL; re-queue their settings.

    A killed search leaves its in-flight trial RUNNING for ever; its finished trials are untouched.
    Trials of live processes (another worker on the same study) and of other machines are left alone.
    A trial not yet marked with its worker was made by a process killed while it held the start lock (a live
    one marks its trial before letting go: ``FolderLock.releasing``), or by one making it now: with ``out_dir``,
    such trials are failed while this process holds that lock itself, so none of them can be a live one's.
    """
    gate = FolderLock(out_dir, START_LOCK) if out_dir is not None else None
    if gate is not None and not gate.try_acquire():
        gate = None  # another process is starting a trial: its unmarked trial may be live
    try:
        return _fail_dead(study, storage, unmarked_are_dead=gate is not None)
    finally:
        if gate is not None:
            gate.release()


def _fail_dead(study, storage, unmarked_are_dead: bool) -> list[int]:
    optuna = optuna_module()
    host, study_id = socket.gethostname(), storage.get_study_id_from_name(study.study_name)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = str(trial.user_attrs.get("worker", ""))
        owner_host, _, pid = owner.rpartition(":")
        unmarked_and_dead = not owner and unmarked_are_dead
        if not unmarked_and_dead and (owner_host != host or not pid.isdigit() or pid_alive(pid)):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_system_attr(trial_id, "failed_because", "its worker process died")
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        requeue(study, trial)
        failed.append(trial.number)
    return failed


# what a queued trial was given to say what it is (its seed, where it came from); a retry keeps them
QUEUED_ATTRS = ("seed", "repeat_of", "start_from", "move", "proposed")


def requeue(study, trial) -> None:
    """Queue ``trial`` to run again: the settings it had drawn, or those it was queued with where it was cut
    short before drawing them (a queued repeat must not be lost); what it was queued as; which trial it retries.
    A sampler's trial cut short before it drew anything has nothing to repeat."""
    params = trial.params or trial.system_attrs.get("fixed_params") or {}
    if params:
        attrs = {k: trial.user_attrs[k] for k in QUEUED_ATTRS if k in trial.user_attrs}
        study.enqueue_trial(params, user_attrs={**attrs, "retry_of": trial.number})


def finished_trials(study, states=("COMPLETE", "PRUNED")) -> list:
    optuna = optuna_module()
    return study.get_trials(deepcopy=False, states=tuple(getattr(optuna.trial.TrialState, s) for s in states))


def spent_before_s(storage_text: str, study_name: str) -> float:
    """Search time earlier calls used: the wall clock their baseline plan's runs, finished trials and confirmation
    runs (the plan's ``measured``) spanned. Runs at once on several workers count once, and a confirmation run
    while the other workers waited counts in full (dividing the trials' summed time by the workers undercounted a
    two-worker search's time)."""
    optuna = optuna_module()
    storage = open_storage(storage_text)
    if study_name not in {s.study_name for s in optuna.get_all_study_summaries(storage)}:  # opening made the file
        return 0.0
    study = optuna.load_study(study_name=study_name, storage=storage)
    runs = [*study.user_attrs.get(BASELINE_RUNS, []), *read_plan(study).get("measured", [])]
    spans = [tuple(run["span"]) for run in runs]
    spans += [(trial.datetime_start.timestamp(), trial.datetime_complete.timestamp())
              for trial in study.get_trials(deepcopy=False) if trial.datetime_start and trial.datetime_complete]
    return covered_seconds(spans)


def covered_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


# -- several processes on one output folder ------------------------------------------------------------
# Two `speedkit tune` commands on one --out (or workers it started) share the study, and must give one answer:
# a trial is started (counted against --max-trials/--max-baseline-trials) by one process at a time, and the
# winner is decided, confirmed and written by one process at a time, after every search trial has ended; the
# next process then reads the same plan and the same finished trials and writes the same recipe.yaml.
class FolderLock:
    """An ``flock`` on ``out_dir/name``, blocking; the kernel drops it when the process dies however it dies."""

    def __init__(self, out_dir: str | os.PathLike, name: str):
        self.path = Path(out_dir) / name
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: one process per output folder
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd

    def try_acquire(self) -> bool:
        """Take the lock if no other process holds it; False (nothing held) if one does."""
        if self._fd is not None:
            return True
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: one process per output folder
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the flock

    def releasing(self, objective):
        """``objective`` that first marks its trial with this worker and then releases the lock: held while Optuna
        creates the trial, not while it runs. A trial found unmarked while the lock is free is a dead process's."""
        def run(trial):
            trial.set_user_attr("worker", worker_id())
            self.release()
            return objective(trial)
        return run

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


START_LOCK, ANSWER_LOCK = ".tune-start.lock", ".tune-answer.lock"
BASELINE_LOCK = ".tune-baseline.lock"  # held by the one process that runs the baseline plan
BASELINE_RUNS = "baseline_runs"  # the search study's list of the baseline plan's finished runs
PLAN = "confirmation_plan"  # the search study's user attribute holding it


def read_plan(search_study) -> dict:
    """What the confirmation decided (``confirm.plan_confirmation``, the final budget search), which of its runs
    finished as measurements (``measured``: run id and span), and the limits the search was closed at
    (``search.answer_decided``): ``{}`` before any process decided. It lives with the search study, so a new study
    (another name, a deleted storage) starts with none."""
    return dict(search_study.user_attrs.get(PLAN, {}))


def update_plan(search_study, **changes) -> None:
    """Write ``changes`` into the plan; only the process holding the answer lock writes it."""
    search_study.set_user_attr(PLAN, {**read_plan(search_study), **changes})


def started_trials(study) -> int:
    """Trials finished or running now: what a trial count limit counts (a running one will finish)."""
    return len(finished_trials(study, states=("COMPLETE", "PRUNED", "RUNNING")))


def wait_for_running_trials(study, storage, should_stop=None, poll_s: float = 1.0, out_dir=None) -> None:
    """Until no trial of ``study`` is running (another process's: this one's have ended); a dead process's trial
    is failed and re-queued (``fail_dead_trials``, with ``out_dir`` the search's folder) instead of waited for."""
    import time

    optuna = optuna_module()
    while not (should_stop and should_stop()):
        fail_dead_trials(study, storage, out_dir)
        if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            return
        time.sleep(poll_s)
