"""Signals during ``Trainer.fit``: SIGTERM stops at the next batch boundary with a checkpoint, then exit code
143; Ctrl-C (SIGINT) never leaves a half-done step in a checkpoint.

SIGTERM: torchrun, Slurm and Kubernetes send it, then SIGKILL after a grace period. Only the main thread
can set handlers (a run in a worker thread keeps the default), and a SIGTERM that is ignored
(SIG_IGN) or handled outside Python is left alone.

SIGINT: a step changes the weights, the optimizer state, the schedules, methods' state and the batch counter one
after another; a KeyboardInterrupt between two of them would save a state that no batch boundary ever had
(the update without the counter: a resume repeats the batch). So:

- The first Ctrl-C inside a step (forward, backward, the optimizer step, BATCH_END) is held until the step
  and its BATCH_END are through, then raised there: the checkpoint is the state after that whole batch. The
  same holds for an evaluation (EMA and SWA swap their average into the model for it) and a checkpoint write.
- A second Ctrl-C inside the same step raises at once (a hung step must stay interruptible), and so does a
  KeyboardInterrupt raised by code. Before the batch is counted the state is then half-done, so the Trainer
  writes no checkpoint from it: the last checkpoint stays the one to resume from, and the record says so.

Only the main thread can set handlers (a run in a worker thread is stopped with ``Trainer.stop``), and a
SIGINT handler other than Python's default (someone else's) is left alone.
"""
from __future__ import annotations

import contextlib
import signal
import threading

SIGTERM_REASON = "SIGTERM"
SIGNAL_REASONS = ("SIGTERM", "SIGHUP")  # stops that suspend a run (no final evaluation, no FIT_END)
SIGTERM_EXIT_CODE = 128 + int(signal.SIGTERM)  # 143: what shells, Slurm and Kubernetes report for it
NOT_INSTALLED = object()


class SigtermFlag:
    """Sets ``received`` when SIGTERM (or SIGHUP) arrives while installed; the loop reads it at batch boundaries.

    SIGHUP is what a closed terminal or a dropped SSH connection sends: handled as SIGTERM is (a checkpoint at
    the next batch boundary, the record, then exit code 129), it loses nothing instead of up to a save interval.
    ``reason`` names the signal that came ("SIGTERM" or "SIGHUP").
    """

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self):
        self.received = False
        self.reason = SIGTERM_REASON
        self.previous = NOT_INSTALLED  # SIGTERM's previous handler
        self._previous: dict = {}

    def install(self) -> None:
        """Route SIGTERM and SIGHUP to this flag (main thread only); remembers the previous handlers."""
        self.received, self.previous, self._previous, self.reason = False, NOT_INSTALLED, {}, SIGTERM_REASON
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            previous = signal.getsignal(signum)
            if previous is None or previous is signal.SIG_IGN:  # ignored (nohup) or handled outside Python
                continue
            signal.signal(signum, self.on_sigterm)
            self._previous[signum] = previous
        self.previous = self._previous.get(signal.SIGTERM, NOT_INSTALLED)

    def on_sigterm(self, signum, frame) -> None:
        # Only a flag: the handler interrupts the main thread anywhere (inside a lock, a log write), so the
        # stop itself is requested at the next batch boundary.
        if not self.received:
            self.reason = signal.Signals(signum).name
            self._signum = signum
        self.received = True

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 143 for SIGTERM, 129 for SIGHUP, what shells and job controllers expect."""
        return 128 + int(getattr(self, "_signum", signal.SIGTERM))

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def exit_after_saving(self) -> None:
        """After a SIGTERM (SIGHUP) was handled by saving: hand it to the previous handler, or exit with code
        143 (129).

        The script's code after fit() must not run as if training had finished, and a job controller must
        see a terminated (restartable) job.
        """
        signum = getattr(self, "_signum", signal.SIGTERM)
        previous = self.previous if signum == signal.SIGTERM else NOT_INSTALLED
        if callable(previous) and previous is not NOT_INSTALLED:  # someone else's handler (a requeue) decides
            previous(signum, None)
            return
        raise SystemExit(self.exit_code)


@contextlib.contextmanager
def installed(*handlers):
    """Each of ``handlers`` (a SigtermFlag, a StepInterrupts) installed for the block, restored after it."""
    for handler in handlers:
        handler.install()
    try:
        yield
    finally:
        for handler in reversed(handlers):
            handler.restore()


class StepInterrupts:
    """``with interrupts.step(state):`` around one training step; ``may_save`` after a KeyboardInterrupt.

    The SIGINT handler is installed once per fit (``install``/``restore``), not per step: a step only sets
    a flag, so the loop's path has no system call on it. Outside a step the handler raises at once, as
    Python's default handler does.
    """

    def __init__(self):
        self.pending = False
        self._batch_at_start: int | None = None  # set while a step runs; None between steps
        self._state = None
        self._depth = 0  # steps open now (an evaluation inside a held call counts as one)
        self._previous = NOT_INSTALLED

    def install(self) -> None:
        """Route SIGINT to this object for the fit (main thread, and only over Python's default handler)."""
        self._previous, self._depth, self.pending = NOT_INSTALLED, 0, False
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def restore(self) -> None:
        if self._previous is not NOT_INSTALLED:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = NOT_INSTALLED

    @contextlib.contextmanager
    def step(self, state):
        self._state, self._batch_at_start, self.pending = state, state.timestamp.batch, False
        self._in_held = self._in_held_left = False
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        self._batch_at_start = None  # only when the step ended normally: an exception leaves it set
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt  # the Ctrl-C held during the step, now at a batch boundary

    def held(self, state, fn, *args):
        """``fn(*args)`` as one step: a Ctrl-C during it is raised when it returns."""
        with self.step(state):
            self._in_held = True  # an evaluation or a checkpoint write, after the batch was counted
            try:
                return fn(*args)
            finally:
                self._in_held_left = self._in_held
                self._in_held = False

    def _on_sigint(self, signum, frame) -> None:
        if self._depth == 0 or self.pending:  # between steps, or the second Ctrl-C: now
            raise KeyboardInterrupt
        self.pending = True

    def mid_step(self) -> bool:
        """A KeyboardInterrupt came out of a step before its batch was counted (or out of an evaluation)."""
        return self._batch_at_start is not None and self._state.timestamp.batch == self._batch_at_start

    def may_save(self, logger) -> bool:
        """Whether the state may be checkpointed after a KeyboardInterrupt; if not, the record and log say why."""
        if not self.mid_step():
            return True
        if getattr(self, "_in_held_left", False):
            note = (f"interrupted during an evaluation or a checkpoint write after batch {self._batch_at_start} (a "
                    f"second Ctrl-C, or a KeyboardInterrupt raised by code): averaging methods (EMA, SWA) may have "
                    f"their average swapped into the model then, so no checkpoint was written from it; the last "
                    f"checkpoint is the one to resume from")
        else:
            note = (f"interrupted inside the step of batch {self._batch_at_start + 1}, before it was counted (a "
                    f"second Ctrl-C, or a KeyboardInterrupt raised by code): its weights may hold part of an "
                    f"update, so no checkpoint was written from them; the last checkpoint is the one to resume from")
        logger.log_note("interrupted_mid_step", note)
        logger.log_text(note)
        return False
