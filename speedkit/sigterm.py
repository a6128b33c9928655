"""SIGTERM during ``Trainer.fit``: a stop at the next batch boundary, a checkpoint, then exit code 143.

torchrun, Slurm and Kubernetes send SIGTERM, then SIGKILL after a grace period. Only the main thread
can set handlers (a run in a worker thread keeps the default), and a SIGTERM that is ignored
(SIG_IGN) or handled outside Python is left alone.
"""
from __future__ import annotations

import signal
import threading

SIGTERM_REASON = "SIGTERM"
SIGTERM_EXIT_CODE = 128 + int(signal.SIGTERM)  # 143: what shells, Slurm and Kubernetes report for it
NOT_INSTALLED = object()


class SigtermFlag:
    """Sets ``received`` when SIGTERM arrives while installed; the loop reads it at batch boundaries."""

    def __init__(self):
        self.received = False
        self.previous = NOT_INSTALLED

    def install(self) -> None:
        """Route SIGTERM to this flag (main thread only); remembers the previous handler."""
        self.received, self.previous = False, NOT_INSTALLED
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None or previous is signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, self.on_sigterm)
        self.previous = previous

    def on_sigterm(self, signum, frame) -> None:
        # Only a flag: the handler interrupts the main thread anywhere (inside a lock, a log write), so the
        # stop itself is requested at the next batch boundary.
        self.received = True

    def restore(self) -> None:
        if self.previous is not NOT_INSTALLED:
            signal.signal(signal.SIGTERM, self.previous)

    def exit_after_saving(self) -> None:
        """After a SIGTERM was handled by saving: hand it to the previous handler, or exit with code 143.

        The script's code after fit() must not run as if training had finished, and a job controller must
        see a terminated (restartable) job.
        """
        if callable(self.previous):  # someone else's handler (a job launcher's requeue, say) decides
            self.previous(signal.SIGTERM, None)
            return
        raise SystemExit(SIGTERM_EXIT_CODE)
