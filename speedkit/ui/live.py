"""Training off the kernel's main thread, with throttled progress reports.

Jupyter handles widget events (a Stop click) only while no cell is executing, so a run started
from a button trains on a worker thread and the kernel stays free. A second thread wakes every
``interval`` seconds and hands the live RunRecord to ``on_progress``; the training loop itself never
touches a widget, so drawing costs training only the GIL time of those few updates a second.
"""
from __future__ import annotations

import threading
import traceback
from typing import Callable

from speedkit.record.runs import RunRecord


class BackgroundRun:
    """``trainer.fit()`` on a worker thread; ``stop()`` ends it at the next batch with a checkpoint."""

    def __init__(self, trainer, on_progress: Callable | None = None, on_finish: Callable | None = None,
                 interval: float = 0.5):
        if interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval}")
        self.trainer, self.interval = trainer, interval
        self.on_progress, self.on_finish = on_progress, on_finish
        self.error: BaseException | None = None
        self.callback_errors: list[str] = []
        self._done = threading.Event()
        self._worker = threading.Thread(target=self._train, name=f"speedkit-{trainer.run_name}", daemon=True)
        self._reporter = threading.Thread(target=self._report, name="speedkit-progress", daemon=True)

    @property
    def record(self) -> RunRecord:
        return self.trainer.record

    @property
    def running(self) -> bool:
        # not just is_alive(): on_finish runs while the worker thread may still be returning
        return self._worker.is_alive() and not self._done.is_set()

    def start(self) -> "BackgroundRun":
        self._worker.start()
        if self.on_progress is not None:
            self._reporter.start()
        return self

    def stop(self, reason: str = "stopped by user") -> None:
        self.trainer.stop(reason)

    def wait(self, timeout: float | None = None) -> RunRecord:
        """Block until the run has ended (and its final report was made); re-raise a training error."""
        self._worker.join(timeout)
        if self._worker.is_alive():
            raise TimeoutError(f"run {self.trainer.run_name} still training after {timeout}s")
        if self._reporter.is_alive():
            self._reporter.join()
        if self.error is not None:
            raise self.error
        return self.record

    def _train(self) -> None:
        try:
            self.trainer.fit()
        except BaseException as e:  # the Trainer has already marked the record failed and saved it
            self.error = e
        finally:
            self._done.set()
            if self.on_progress is None:
                self._call(self.on_finish)

    def _report(self) -> None:
        while not self._done.wait(self.interval):
            self._call(self.on_progress)
        self._call(self.on_progress)
        self._call(self.on_finish)

    def _call(self, fn: Callable | None) -> None:
        """Run a UI callback; its errors are kept, never allowed to kill training or the reporter."""
        if fn is None:
            return
        try:
            fn(self)
        except Exception:
            self.callback_errors.append(traceback.format_exc())
