"""Aten ops per quiet training step of every preset, counted on a CPU, and those of them that launch a kernel.

Each preset trains 7 batches (batch size 8; the seed's tasks at their cpu sizes, batch size 2, on a few generated
files) under a ``SyncCounter``; the count is that of a quiet step (neither logging nor evaluating) past
sequence-length warmup's change of length. Every op costs the host a dispatch; on a GPU those that are not views,
allocations or reads of a value (``launches_a_kernel``) are each about one kernel launch. Muon batches its matrices
as it plans them for a GPU, where each op is a launch (``DISPATCHES_WORTH_FLOPS``) and every iteration runs in
bf16, not as for the CPU the count runs on (whose bf16 policy would split a conv net's larger filters from its
smaller ones). It prints one line per preset with the ratios to its task's baseline, and the JSON of all of them
with ``--out``. ``tests/train/test_step_kernels.py`` checks the same counts::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/count_step_ops.py                 # fashion-mnist and pydocs
    OMP_NUM_THREADS=1 .venv/bin/python scripts/count_step_ops.py --seed-tasks    # also gpt2 and imagenet
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

BUILT_IN_TASKS = ("fashion-mnist", "pydocs")
SEED_TASKS = ("gpt2", "imagenet")


def make_seed_files(root: Path) -> dict[str, Path]:
    """An ImageNet-layout folder of a few JPEGs of varied sizes and a folder of text, under ``root`` (made once)."""
    from PIL import Image

    folders = {"imagenet": root / "imagenet", "gpt2": root / "corpus"}
    if folders["imagenet"].is_dir() and folders["gpt2"].is_dir():
        return folders
    rng = random.Random(0)
    for split, count in (("train", 4), ("val", 1)):
        for c in range(3):
            folder = folders["imagenet"] / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                size = (rng.randint(96, 256), rng.randint(96, 256))
                Image.new("RGB", size, (80 * c, rng.randint(0, 255), 90)).save(folder / f"{i}.JPEG")
    words = "model data step batch token image shard stream epoch train speed method seed layer head the a of".split()
    folders["gpt2"].mkdir(parents=True, exist_ok=True)
    for d in range(6):
        (folders["gpt2"] / f"doc{d}.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)) + "\n")
    return folders


def preset_step_counts(task: str, name: str, root: Path, **overrides) -> dict[str, int]:
    """``{"ops": aten ops, "launches": those that launch a kernel}`` of a steady quiet step of ``task``'s preset
    ``name``; ``root`` holds the run folders and, for the seed's tasks, the generated files and their shards
    (``SPEEDKIT_SHARDS``)."""
    from unittest import mock

    import torch

    import speedkit.optim.muon as muon
    from speedkit.callbacks import SyncCounter
    from speedkit.tasks import make_trainer

    if task in SEED_TASKS:
        os.environ.setdefault("SPEEDKIT_SHARDS", str(root / "shards"))
        options = dict(data=make_seed_files(root / "seed-files")[task], task_options={"sizes": "cpu"},
                       batch_size=2, num_workers=0)
    else:
        options = dict(batch_size=8, data_fraction=0.01, eval_fraction=0.005)
    counter = SyncCounter()
    with (mock.patch.dict(muon.DISPATCHES_WORTH_FLOPS, cpu=muon.DISPATCHES_WORTH_FLOPS["accelerator"]),
          mock.patch.object(muon, "newton_schulz_dtype", lambda *_, **__: torch.bfloat16)):  # Muon as on a GPU
        make_trainer(task, name, duration="7ba", eval_interval="100ba", log_interval=3, device="cpu",
                     run_dir=root / "runs" / f"{task}-{name}", save_checkpoints=False, callbacks=[counter],
                     **{**options, **overrides}).fit()
    ops, launches = counter.quiet_step_ops(), counter.quiet_step_launches()
    if set(ops) != {2, 4, 5} or ops[4] != ops[5]:  # the first checks its batch; 3 and 6 log; 7 ends
        raise RuntimeError(f"{task}:{name}: expected steady quiet steps 2, 4 and 5, got {ops}")
    return {"ops": ops[5], "launches": launches[5]}


def task_presets(task: str, root: Path) -> list[str]:
    from speedkit.tasks import find_task

    if task in SEED_TASKS:
        return list(find_task(task, make_seed_files(root / "seed-files")[task], sizes="cpu").recipes)
    return list(find_task(task).recipes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-tasks", action="store_true", help="also gpt2 and imagenet (cpu sizes)")
    parser.add_argument("--out", help="write the counts as JSON here")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for task in BUILT_IN_TASKS + (SEED_TASKS if args.seed_tasks else ()):
            baseline = None
            for name in task_presets(task, root):
                counts = preset_step_counts(task, name, root)
                baseline = counts if name == "baseline" else baseline
                ratios = {f"{kind}_to_baseline": round(n / baseline[kind], 3) for kind, n in counts.items()
                          if baseline}
                results[f"{task}:{name}"] = {**counts, **ratios}
                print(f"{task}:{name}: {counts['ops']} ops a step, {counts['launches']} launching a kernel"
                      + (f"; {ratios['ops_to_baseline']:.2f}x and {ratios['launches_to_baseline']:.2f}x baseline"
                         if ratios else ""), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
