"""``speedkit ARGS`` as a user runs it, with test-only faults injected through the environment (the library has
no hooks for them); tests/cli/test_fault_matrix.py starts it as a real process and sends it real signals.

    python tests/support/fault_cli.py train --duration 12ba ...

  SPEEDKIT_TEST_MARKS=DIR         write DIR/batch-N after each training batch and DIR/eval-N when an evaluation
                                  after batch N starts, so a test knows the moment to send a signal
  SPEEDKIT_TEST_BATCH_SLEEP=s     sleep s seconds after every training batch (a signal lands mid-epoch)
  SPEEDKIT_TEST_EVAL_SLEEP=s      sleep s seconds inside every evaluation (a signal lands during one)
  SPEEDKIT_TEST_EVAL_SLEEP_AT=N   ... only inside the evaluation after batch N (the one a test signals in; the
                                  earlier ones would only be waited through)
  SPEEDKIT_TEST_SLOW_SAVE=k       the k-th checkpoint write stalls halfway (tests/support/fault_child.py)
  SPEEDKIT_TEST_KILL_AFTER=WHAT   SIGKILL this process right after writing a checkpoint: WHAT=final (the one
                                  whose record says the run ended) or target (one written after the target
                                  was reached, before the run ended)
Sleeping changes no number a run computes, so a slowed run ends equal to one that was not.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def _mark(name: str) -> None:
    folder = os.environ.get("SPEEDKIT_TEST_MARKS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).touch()


def install() -> None:
    from speedkit.train.trainer import Trainer

    batch_sleep = float(os.environ.get("SPEEDKIT_TEST_BATCH_SLEEP") or 0)
    eval_sleep = float(os.environ.get("SPEEDKIT_TEST_EVAL_SLEEP") or 0)
    eval_sleep_at = os.environ.get("SPEEDKIT_TEST_EVAL_SLEEP_AT")
    step, evaluate = Trainer._train_step, Trainer.eval

    def slow_step(self):
        step(self)
        _mark(f"batch-{self.state.timestamp.batch}")
        if batch_sleep:
            time.sleep(batch_sleep)

    def slow_eval(self, evaluators=None):
        _mark(f"eval-{self.state.timestamp.batch}")
        if eval_sleep and eval_sleep_at in (None, str(self.state.timestamp.batch)):
            time.sleep(eval_sleep)
        return evaluate(self, evaluators)

    Trainer._train_step, Trainer.eval = slow_step, slow_eval

    if os.environ.get("SPEEDKIT_TEST_SLOW_SAVE"):
        from fault_child import inject_slow_save

        inject_slow_save(int(os.environ["SPEEDKIT_TEST_SLOW_SAVE"]))

    kill_after = os.environ.get("SPEEDKIT_TEST_KILL_AFTER")
    if kill_after:
        import json

        import speedkit.train.checkpoint.checkpointer as checkpointer
        from speedkit.train.checkpoint import format as checkpoint_format

        write = checkpoint_format.write

        def write_then_die(path, contents):
            result = write(path, contents)
            record = json.loads(contents.record)
            ended = record.get("status") in ("completed", "target_reached")
            reached = any((state or {}).get("reached_at") for state in contents.callbacks.values()
                          if isinstance(state, dict))
            if (kill_after == "final" and ended) or (kill_after == "target" and reached and not ended):
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        checkpointer.checkpoint_format.write = write_then_die


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    install()
    from speedkit.cli.main import main

    sys.exit(main(sys.argv[1:]))
