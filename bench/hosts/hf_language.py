"""Time to 3.30 validation bits per byte on the Python-docs corpus in the Hugging Face Trainer: transformers'
GPT-2 (gpt-nano's sizes, from a config) with a learning-rate-tuned AdamW baseline, against
``speedkit.hosts.hf.SpeedkitTrainer`` with the ``hot`` language recipe's methods and budget (rotary, QK-norm,
ReLU^2, Muon, sequence-length warmup; 250 batches of 32).

Protocol (DESIGN.md, "Benchmark protocol"): first ``--sweep`` the baseline's learning rate (one seed each, the
same budget), then run the best baseline and the recipe interleaved (A B A B ...), 3 seeds each. The clock
counts training only: evaluation (every ``--eval-steps``) is timed apart and subtracted. Writes
``bench/results/2026-12-01-hosts/hosts_hf_language.json`` with every run and the median ratio baseline/recipe.

    python bench/hosts/hf_language.py --sweep 1e-3 2e-3 4e-3 8e-3 --seeds 0 1 2
    python bench/hosts/hf_language.py --sweep 1e-3 --baseline-steps 600   # the rate the pydocs task's sweep picked

Not run for figures on the shared development machine: run it on a quiet one (or the GPU machine).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from speedkit.data.text import load_text_corpus
from speedkit.hosts.hf import SpeedkitTrainer
from speedkit.methods import build_methods
from speedkit.models import get_model
from speedkit.tasks import get_recipe

TARGET_BPB = 3.30
SEQUENCE = 256
RESULTS = Path(__file__).resolve().parents[1] / "results" / "2026-12-01-hosts" / "hosts_hf_language.json"


class Sequences(torch.utils.data.Dataset):
    """Bytes cut into sequences, the Hugging Face way: labels = input_ids (the model shifts them)."""

    def __init__(self, data: torch.Tensor, limit: int | None = None):
        count = len(data) // SEQUENCE if limit is None else min(limit, len(data) // SEQUENCE)
        self.rows = data[: count * SEQUENCE].long().view(count, SEQUENCE)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class TimeToTarget(transformers.TrainerCallback):
    """Training seconds (evaluation excluded) until eval bits per byte first reach the target; then stops."""

    def __init__(self):
        self.train_s, self.reached_s, self.best_bpb, self._started = 0.0, None, math.inf, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._started is None:
            self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_evaluate and self._started is not None:  # evaluation follows: stop the clock
            self.train_s += time.perf_counter() - self._started
            self._started = None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        bpb = metrics["eval_loss"] / math.log(2)
        self.best_bpb = min(self.best_bpb, bpb)
        if bpb <= TARGET_BPB and self.reached_s is None:
            self.reached_s = self.train_s
            control.should_training_stop = True


def run(arm: str, seed: int, lr: float, steps: int, eval_steps: int) -> dict:
    recipe = get_recipe("pydocs", "hot")
    corpus = load_text_corpus()
    train, val = Sequences(corpus.train), Sequences(corpus.val, limit=64)
    torch.manual_seed(seed)
    model = get_model("hf:gpt2-nano").model  # transformers' GPT2LMHeadModel, computing its own loss
    clock = TimeToTarget()
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=recipe.batch_size,
        per_device_eval_batch_size=32, learning_rate=lr, weight_decay=0.1, warmup_steps=max(1, steps // 20),
        lr_scheduler_type="linear", eval_strategy="steps", eval_steps=eval_steps, save_strategy="no",
        logging_steps=eval_steps, report_to=[], bf16=torch.cuda.is_available(), seed=seed,
        disable_tqdm=True)
    common = dict(model=model, args=args, train_dataset=train, eval_dataset=val, callbacks=[clock])
    if arm == "hot":
        trainer = SpeedkitTrainer(**common, methods=build_methods(recipe.methods))
    else:
        trainer = transformers.Trainer(**common)
    trainer.train()
    return {"arm": arm, "seed": seed, "lr": lr, "steps": steps, "time_to_target_s": clock.reached_s,
            "train_s": round(clock.train_s, 3), "best_bpb": round(clock.best_bpb, 4)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sweep", type=float, nargs="*", default=[1e-3, 2e-3, 4e-3, 8e-3],
                        help="baseline learning rates to try first (one seed each); one rate: use it, no sweep")
    parser.add_argument("--baseline-steps", type=int, default=500)
    parser.add_argument("--eval-steps", type=int, default=25)
    args = parser.parse_args()
    recipe = get_recipe("pydocs", "hot")
    hot_steps = int(str(recipe.duration).removesuffix("ba"))
    if len(args.sweep) == 1:  # a learning rate tuned elsewhere (the pydocs task's own sweep): no sweep
        sweep, best_lr = [], args.sweep[0]
    else:
        sweep = [run("baseline", args.seeds[0], lr, args.baseline_steps, args.eval_steps) for lr in args.sweep]
        reached = [r for r in sweep if r["time_to_target_s"]]
        best_lr = min(reached, key=lambda r: r["time_to_target_s"])["lr"] if reached else \
            min(sweep, key=lambda r: r["best_bpb"])["lr"]
    runs = []
    for seed in args.seeds:  # interleaved: baseline, recipe, baseline, recipe, ...
        runs.append(run("baseline", seed, best_lr, args.baseline_steps, args.eval_steps))
        runs.append(run("hot", seed, recipe.optimizer["lr"], hot_steps, args.eval_steps))
    ratios = [b["time_to_target_s"] / h["time_to_target_s"] for b, h in zip(runs[::2], runs[1::2])
              if b["time_to_target_s"] and h["time_to_target_s"]]
    summary = {"target_bpb": TARGET_BPB, "sweep": sweep, "baseline_lr": best_lr, "runs": runs, "ratios": ratios,
               "median_ratio": statistics.median(ratios) if ratios else None, "torch": torch.__version__,
               "transformers": transformers.__version__, "threads": torch.get_num_threads(),
               "command": " ".join(["python", "bench/hosts/hf_language.py", *sys.argv[1:]]),
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("baseline_lr", "ratios", "median_ratio")}))


if __name__ == "__main__":
    main()
