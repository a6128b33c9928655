"""Time to 92% Fashion-MNIST test accuracy in Lightning: a LightningModule written the way Lightning's docs write
one (bf16 autocast via ``precision="bf16-mixed"``, channels_last), against the same module with the ``hot``
recipe's methods and budget through ``speedkit.hosts.lightning.SpeedkitCallback``.

Protocol (DESIGN.md, "Benchmark protocol"): the two arms run interleaved (A B A B ...), 3 seeds each; the clock
counts training only (a validation pass each half epoch is timed apart and subtracted); data sits in memory as
tensors in both arms, so the ratio measures the methods, not the loader. Writes
``bench/results/2026-12-01-hosts/hosts_lightning_fashion_mnist.json`` with every run and the median ratio. The
baseline's budget (``--baseline-epochs``) should be the shortest that reaches 92% in every seed; sweep it first.

    python bench/hosts/lightning_fashion_mnist.py --seeds 0 1 2 --baseline-epochs 6

Not run for figures on the shared development machine: run it on a quiet one (or the GPU machine).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import torch
import torch.nn.functional as F

from speedkit.data import load_fashion_mnist
from speedkit.data.per_image import alternate_flips, as_augment
from speedkit.hosts.lightning import SpeedkitCallback
from speedkit.methods import build_methods
from speedkit.models import get_model
from speedkit.tasks import get_recipe

TARGET = 0.92
RESULTS = (Path(__file__).resolve().parents[1] / "results" / "2026-12-01-hosts"
           / "hosts_lightning_fashion_mnist.json")


class FashionClassifier(L.LightningModule):
    """The module a Lightning user writes; the two speedkit lines are used only when the callback is there."""

    def __init__(self, lr: float, epochs: float, steps_per_epoch: int, speedkit: bool):
        super().__init__()
        self.model = get_model("resnet8")
        if not speedkit:  # the docs' way; with speedkit, hot's channels_last method does it
            self.model = self.model.to(memory_format=torch.channels_last)
        self.lr, self.total_steps, self.uses_speedkit = lr, int(epochs * steps_per_epoch), speedkit
        self.correct = self.seen = 0

    def forward(self, x):
        return self.model(x if self.uses_speedkit else x.contiguous(memory_format=torch.channels_last))

    def training_step(self, batch, batch_idx):
        if self.uses_speedkit:
            batch = self.speedkit.batch(batch)                                    # speedkit
            return self.speedkit.loss(self(batch[0]), batch)                      # speedkit
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        if self.uses_speedkit:
            batch = self.speedkit.eval_batch(batch)                               # speedkit: channels_last
        x, y = batch
        logits = self(x)
        if self.uses_speedkit:
            logits = self.speedkit.eval_outputs(logits)                           # speedkit: test-time flips
        self.correct += int((logits.argmax(1) == y).sum())
        self.seen += len(y)

    def on_validation_epoch_start(self):
        self.correct = self.seen = 0

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
        if self.uses_speedkit:
            return optimizer  # the recipe's one-cycle schedule comes through the callback
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.lr, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class TimeToTarget(L.Callback):
    """Training seconds (validation excluded) until validation accuracy first reaches the target; then stops."""

    def __init__(self):
        self.train_s, self.reached_s, self._started = 0.0, None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self._started is None:
            self._started = time.perf_counter()

    def on_validation_start(self, trainer, module):
        if self._started is not None:
            self.train_s += time.perf_counter() - self._started
            self._started = None

    def on_validation_end(self, trainer, module):
        accuracy = module.correct / max(module.seen, 1)
        if accuracy >= TARGET and self.reached_s is None:
            self.reached_s = self.train_s
            trainer.should_stop = True


def loaders(batch_size: int, seed: int, augment: dict | None = None):
    """Tensors in memory. ``augment`` is a recipe's: the DataModule's part of it (a Lightning host owns its data),
    here the alternating flip ``hot`` trains with, through the sampler and dataset wrapper speedkit provides."""
    data = load_fashion_mnist()
    normalize = lambda x: ((x.float() / 255.0 - data.mean) / data.std).unsqueeze(1)  # noqa: E731
    train = torch.utils.data.TensorDataset(normalize(data.train_x), data.train_y)
    test = torch.utils.data.TensorDataset(normalize(data.test_x), data.test_y)
    sampler = torch.utils.data.RandomSampler(train, generator=torch.Generator().manual_seed(seed))
    augment = as_augment(augment)
    if augment is not None and (augment.crop_pad or augment.flip not in (None, "alternating")):
        raise ValueError(f"this benchmark's loader does only hot's augmentation (alternating flips), got {augment}")
    if augment is not None and augment.flip == "alternating":
        train, sampler = alternate_flips(train, sampler, seed)                    # speedkit: hot's flips
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, sampler=sampler, drop_last=True),
            torch.utils.data.DataLoader(test, batch_size=1000))


def run(arm: str, seed: int, baseline_epochs: float, precision: str = "bf16-mixed") -> dict:
    L.seed_everything(seed, workers=True)
    recipe = get_recipe("fashion-mnist", "hot")
    speedkit = arm == "hot"
    epochs = float(str(recipe.duration).removesuffix("ep")) if speedkit else baseline_epochs
    train, test = loaders(recipe.batch_size, seed, recipe.augment if speedkit else None)
    module = FashionClassifier(recipe.optimizer["lr"], epochs, len(train), speedkit)
    clock = TimeToTarget()
    callbacks = [clock]
    if speedkit:
        callbacks.insert(0, SpeedkitCallback(build_methods(recipe.methods), schedules=recipe.schedule))
    trainer = L.Trainer(max_steps=int(epochs * len(train)), precision=precision, val_check_interval=0.5,
                        callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        num_sanity_val_steps=0, accelerator="auto", devices=1)
    trainer.fit(module, train, test)
    return {"arm": arm, "seed": seed, "epochs": epochs, "precision": precision, "time_to_target_s": clock.reached_s,
            "train_s": round(clock.train_s, 3), "final_accuracy": module.correct / max(module.seen, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--baseline-epochs", type=float, default=6.0)
    parser.add_argument("--precision", default="bf16-mixed",
                        help="Lightning's precision for both arms: bf16-mixed as its docs write it, or 32-true on a "
                             "CPU that emulates bf16 (`speedkit env` shows the bf16 speed-up)")
    args = parser.parse_args()
    runs = [run(arm, seed, args.baseline_epochs, args.precision)
            for seed in args.seeds for arm in ("baseline", "hot")]  # interleaved
    ratios = [b["time_to_target_s"] / h["time_to_target_s"] for b, h in zip(runs[::2], runs[1::2])
              if b["time_to_target_s"] and h["time_to_target_s"]]
    summary = {"target": TARGET, "runs": runs, "ratios": ratios,
               "median_ratio": statistics.median(ratios) if ratios else None,
               "torch": torch.__version__, "lightning": L.__version__, "threads": torch.get_num_threads(),
               "command": " ".join(["python", "bench/hosts/lightning_fashion_mnist.py", *sys.argv[1:]]),
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("ratios", "median_ratio")}))


if __name__ == "__main__":
    main()
