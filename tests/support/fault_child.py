"""A small real training run that tests/train/test_faults.py starts as a subprocess, kills and starts again.

    python tests/support/fault_child.py RUN_DIR

Fashion-MNIST (2% of the training set: 24 batches of 50 an epoch; 5% of the test set), resnet8 at width 8,
2 epochs, deterministic on CPU, a checkpoint every 5 batches, ``autoresume=True``: running the same command
again after a kill continues from the last checkpoint. The run lives in RUN_DIR/r.

Test-only fault injection, through the environment (the library has no hooks for it):
  SPEEDKIT_TEST_SLOW_SAVE=k    the k-th checkpoint write of this process writes half of its temp file, then
                               sleeps (so the test can SIGKILL it mid-write)
  SPEEDKIT_TEST_BATCH_SLEEP=s  sleep s seconds after every batch (a slow run, so a signal lands mid-run)
"""
from __future__ import annotations

import os
import sys
import time

import torch


def inject_slow_save(k: int) -> None:
    """Make the k-th checkpoint write stall halfway through the real atomic_write_bytes temp file."""
    import speedkit.train.checkpoint.format as checkpoint_module
    from speedkit.record.runs import atomic_write_bytes

    real_fdopen, calls = os.fdopen, {"n": 0}

    class HalfThenSleep:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def write(self, data):
            half = len(data) // 2
            self.f.write(data[:half])
            self.f.flush()
            os.fsync(self.f.fileno())
            time.sleep(120)  # the test kills us here
            return self.f.write(data[half:]) + half

        def __getattr__(self, name):
            return getattr(self.f, name)

    def slow_write(path, data):
        calls["n"] += 1
        if calls["n"] != k:
            return atomic_write_bytes(path, data)
        os.fdopen = lambda fd, *args, **kwargs: HalfThenSleep(real_fdopen(fd, *args, **kwargs))
        try:
            return atomic_write_bytes(path, data)
        finally:
            os.fdopen = real_fdopen

    checkpoint_module.atomic_write_bytes = slow_write


def main(run_dir: str) -> None:
    from speedkit import Callback, Trainer
    from speedkit.data import fashion_mnist_loaders
    from speedkit.models import get_model

    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the same in every process
    if os.environ.get("SPEEDKIT_TEST_SLOW_SAVE"):
        inject_slow_save(int(os.environ["SPEEDKIT_TEST_SLOW_SAVE"]))
    callbacks = []
    if os.environ.get("SPEEDKIT_TEST_BATCH_SLEEP"):
        pause = float(os.environ["SPEEDKIT_TEST_BATCH_SLEEP"])

        class Sleep(Callback):
            def batch_end(self, state, logger):
                time.sleep(pause)

        callbacks.append(Sleep())

    train, test = fashion_mnist_loaders(batch_size=50, data_fraction=0.02, eval_fraction=0.05)
    torch.manual_seed(0)
    trainer = Trainer(get_model("resnet8", width=8), train, eval_dataloader=test, max_duration="2ep",
                      optimizers=lambda p: torch.optim.Adam(p, lr=3e-3), callbacks=callbacks,
                      deterministic=True, device="cpu", log_interval=1, run_dir=run_dir, run_name="r",
                      save_interval="5ba", keep_checkpoints=2, autoresume=True)
    record = trainer.fit()
    print(f"finished: {record.status} at batch {trainer.state.timestamp.batch}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
