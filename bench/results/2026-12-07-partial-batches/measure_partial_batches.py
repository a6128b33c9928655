"""A compiled run's partial last batch, before and after the Trainer ran it eager: `speedkit train` on fashion-mnist
(`plain-bf16`'s methods with torch_compile, one epoch at batch 512: 117 batches of 512 and one of 96, evaluated on
10,000 in batches of 1,024), the code of two source trees interleaved in rounds, each run in a fresh process with
an empty Inductor cache (a machine's first compile, as on a lent GPU).

    python measure_partial_batches.py BEFORE_TREE AFTER_TREE --rounds 2 --out partial_batches.json

A tree is a checkout's root (``git worktree add /tmp/before <commit>``); its ``speedkit`` is imported first."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ARGUMENTS = ["--task", "fashion-mnist", "--recipe", "plain-bf16", "--methods", "channels_last,torch_compile",
             "--duration", "1ep", "--batch-size", "512", "--precision", "fp32", "--eval-interval", "1ep",
             "--device", "cpu", "--overwrite", "--no-progress"]


def run(tree: Path, work: Path, name: str, threads: int) -> dict:
    cache = work / "inductor-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-m", "speedkit", "train", *ARGUMENTS, "--run-dir", str(work / "runs"),
                    "--run-name", name], env=env, check=True, capture_output=True)
    record = json.loads((work / "runs" / name / "record.json").read_text())
    timings = record["timings"]
    return {"train_s": timings["train_s"], "compile_s": timings.get("compile_s"), "eval_s": timings.get("eval_s"),
            "train_s_less_first_compile": timings["train_s"] - (timings.get("compile_s") or 0.0),
            "eval_accuracy": record["final_metrics"].get("eval/accuracy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    from speedkit.record.runs import cpu_name

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        runs = {"before": [], "after": []}
        for round_ in range(args.rounds):
            for arm, tree in (("before", args.before), ("after", args.after)):
                runs[arm].append(run(tree.resolve(), work, f"{arm}-{round_}", args.threads))
                print(arm, round_, runs[arm][-1], flush=True)

    def median(arm: str, key: str) -> float:
        values = sorted(r[key] for r in runs[arm])
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    result = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": {"cpu": cpu_name(), "threads": args.threads,
                          "torch": torch.__version__},
              "speedkit_train": "speedkit train " + " ".join(ARGUMENTS), "runs": runs,
              "median": {arm: {key: median(arm, key) for key in ("train_s", "compile_s", "train_s_less_first_compile")}
                         for arm in runs}}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
