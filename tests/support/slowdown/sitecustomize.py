"""Injected into notebook kernels by tests/cli/test_notebooks.py (this folder on PYTHONPATH): with
SPEEDKIT_TEST_SLOWDOWN=2, every training step of a run that uses speed-up methods takes twice as long, as
if a regression had halved their speed. The notebooks' checks must then fail; that is their teeth."""
import os

_FACTOR = float(os.environ.get("SPEEDKIT_TEST_SLOWDOWN") or 0)

if _FACTOR > 1:
    import time

    from speedkit.train.trainer import Trainer

    _train_step = Trainer._train_step

    def _slow_train_step(self) -> None:
        start = time.perf_counter()
        _train_step(self)
        if self.state.methods:  # the baselines (no methods) keep their speed
            time.sleep((_FACTOR - 1) * (time.perf_counter() - start))

    Trainer._train_step = _slow_train_step
