"""Aten ops per quiet training step of every preset, counted on a CPU, and those of them that launch a kernel.

Each preset trains 7 batches (batch size 8; the seed's tasks at their cpu sizes, batch size 2, on a few generated
files) under a ``SyncCounter``; the count is that of a quiet step (neither logging nor evaluating) past
sequence-length warmup's change of length. Every op costs the host a dispatch; on a GPU those that are not views,
allocations or reads of a value are each about one kernel launch, a multi-tensor op that CUDA's fast path does not
take is one per tensor, and a matrix product added to a copy of a tensor two (``kernel_launches``). Muon batches its
matrices as it plans them for a GPU, where each op is a launch (``dispatch_costs``) and every iteration runs in bf16,
not as for the CPU the count runs on (whose bf16 policy would split a conv net's larger filters from its smaller
ones). It prints one line per preset with the ratios to its task's baseline, and the JSON of all of them with
``--out``.
``tests/train/test_step_kernels.py`` checks the same counts::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/count_step_ops.py                 # fashion-mnist and pydocs
    OMP_NUM_THREADS=1 .venv/bin/python scripts/count_step_ops.py --seed-tasks    # also gpt2 and imagenet
    OMP_NUM_THREADS=1 .venv/bin/python scripts/count_step_ops.py --seed-tasks --compiled   # and each step compiled

A dispatch mode keeps torch.compile off, so with ``--compiled`` it also counts the kernels of each preset's step with
its model compiled (``torch_compile`` added to its methods), as on a GPU, from a profile of quiet steps instead
(``profiled_kernels``): inductor's C++ kernels and each op outside the compiled graphs (the optimizer's, the NaN
guard's, the loader's). A CPU's inductor fuses much as CUDA's does, around the same library calls (matmuls,
attention), so the count is a CPU's estimate of a compiled GPU step's launches, which the GPU check's
``kernels_per_step`` measures on the device. It overstates some: a CPU's convolutions cast inside their backward,
its flash attention fills its gradients' buffers, and its inductor leaves random draws (stochastic depth's) to aten
where CUDA's draws them inside its fused kernels. It understates a multi-tensor op off CUDA's fast path, which it
counts once (a profile has no strides). Each preset compiles once (seconds to a minute).
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
    from speedkit.callbacks import SyncCounter
    from speedkit.tasks import make_trainer

    counter = SyncCounter()
    with muon_as_on_a_gpu():
        make_trainer(task, name, duration="7ba", eval_interval="100ba", log_interval=3, device="cpu",
                     run_dir=root / "runs" / f"{task}-{name}", save_checkpoints=False, callbacks=[counter],
                     **{**_run_options(task, root), **overrides}).fit()
    ops, launches = counter.quiet_step_ops(), counter.quiet_step_launches()
    if set(ops) != {2, 4, 5} or ops[4] != ops[5]:  # the first checks its batch; 3 and 6 log; 7 ends
        raise RuntimeError(f"{task}:{name}: expected steady quiet steps 2, 4 and 5, got {ops}")
    return {"ops": ops[5], "launches": launches[5]}


def compiled_step_kernels(task: str, name: str, root: Path) -> int:
    """Kernels of a steady quiet step of ``task``'s preset ``name`` with its model compiled (torch_compile added to
    its methods), from a CPU profile of steps 7 and 8 apart (``profiled_kernels``), which must agree: a step that
    compiled again would not (TorchDynamo recompiles for dynamic shapes once it has seen a second length, which
    sequence-length warmup gives it up to step 4)."""
    import torch
    import torch._dynamo

    from speedkit.callbacks.sync_counter import makes_batches_on_host, profiled_kernels
    from speedkit.core.engine import Callback
    from speedkit.tasks import make_trainer

    class ProfileEachStep(Callback):
        """Profiles each of ``steps`` from where ``SyncCounter`` counts a step: from loading its batch where the
        loader makes it on the device, from the batch loaded where the host makes it."""

        def __init__(self, steps):
            self.steps, self.profiler, self.kernels = steps, None, {}

        def before_dataloader(self, state, logger):
            if not makes_batches_on_host(state.train_dataloader):
                self._start(state)

        def after_dataloader(self, state, logger):
            if self.profiler is None:
                self._start(state)

        def _start(self, state):
            if state.timestamp.batch + 1 in self.steps:
                self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self.profiler.__enter__()

        def batch_end(self, state, logger):
            if self.profiler is not None:
                self.profiler.__exit__(None, None, None)
                self.kernels[state.timestamp.batch] = sum(profiled_kernels(self.profiler.events()).values())
                self.profiler = None

    methods = {**_find_task(task, root).recipes[name].methods, "torch_compile": {}}
    profiled = ProfileEachStep((7, 8))  # 3, 6 and 9 log
    torch._dynamo.reset()
    try:
        with muon_as_on_a_gpu(), profiled_scalar_kernels():
            make_trainer(task, name, duration="9ba", eval_interval="100ba", log_interval=3, device="cpu",
                         run_dir=root / "runs" / f"{task}-{name}-compiled", save_checkpoints=False,
                         callbacks=[profiled], methods=methods, **_run_options(task, root)).fit()
    finally:
        torch._dynamo.reset()  # no graph left cached for a later compile of the same code to count against its limit
    if len(set(profiled.kernels.values())) != 1:
        raise RuntimeError(f"{task}:{name}: compiled steps 7 and 8 differ: {profiled.kernels}")
    return profiled.kernels[8]


def profiled_scalar_kernels():
    """Inductor generates scalar C++ kernels that the profiler names. The count is of kernels, which the scheduler's
    fusion decides before code generation, and scalar code compiles in about two thirds of vectorised code's time.
    Inductor works out, once per process, which vector ISAs it may use, judged under the ``vec_isa_ok`` of the
    time; left to the first compile inside this patch, every later compile in the process would build without them,
    and vectorised code that another process cached would not build at all. So it works them out first."""
    import torch._inductor.config
    import torch._inductor.cpu_vec_isa

    torch._inductor.cpu_vec_isa.valid_vec_isa_list()
    return torch._inductor.config.patch({"cpp.enable_kernel_profile": True, "cpp.vec_isa_ok": False})


def muon_as_on_a_gpu():
    """Muon batches and casts its matrices as on a GPU, where each op is a launch (``dispatch_costs``) and
    every iteration runs in bf16."""
    import contextlib
    from unittest import mock

    import torch

    import speedkit.optim.muon as muon

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict(muon.DISPATCHES_WORTH_FLOPS, cpu=muon.DISPATCHES_WORTH_FLOPS["accelerator"]))
    stack.enter_context(mock.patch.dict(muon.PAD_SHARE, cpu=muon.PAD_SHARE["accelerator"]))
    stack.enter_context(mock.patch.object(muon, "newton_schulz_dtype", lambda *_, **__: torch.bfloat16))
    return stack


def _run_options(task: str, root: Path) -> dict:
    """The data and batch of a count: a sliver of a built-in task's, or the seed task's generated files."""
    if task in SEED_TASKS:
        return dict(data=_seed_files(root)[task], task_options={"sizes": "cpu"}, batch_size=2, num_workers=0)
    return dict(batch_size=8, data_fraction=0.01, eval_fraction=0.005)


def task_presets(task: str, root: Path) -> list[str]:
    return list(_find_task(task, root).recipes)


def _find_task(task: str, root: Path):
    from speedkit.tasks import find_task

    if task in SEED_TASKS:
        return find_task(task, _seed_files(root)[task], sizes="cpu")
    return find_task(task)


def _seed_files(root: Path) -> dict[str, Path]:
    """The seed tasks' generated files under ``root``, and their shards there too (a seed task prepares its shards
    as it is found)."""
    os.environ.setdefault("SPEEDKIT_SHARDS", str(root / "shards"))
    return make_seed_files(root / "seed-files")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-tasks", action="store_true", help="also gpt2 and imagenet (cpu sizes)")
    parser.add_argument("--compiled", action="store_true", help="also the kernels of each step compiled")
    parser.add_argument("--out", help="write the counts as JSON here")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for task in BUILT_IN_TASKS + (SEED_TASKS if args.seed_tasks else ()):
            baseline = None
            for name in task_presets(task, root):
                counts = preset_step_counts(task, name, root)
                if args.compiled:
                    counts["compiled_kernels"] = compiled_step_kernels(task, name, root)
                baseline = counts if name == "baseline" else baseline
                ratios = {f"{kind}_to_baseline": round(n / baseline[kind], 3) for kind, n in counts.items()}
                results[f"{task}:{name}"] = {**counts, **ratios}
                print(f"{task}:{name}: " + ", ".join(f"{kind} {n} ({ratios[kind + '_to_baseline']:.2f}x baseline)"
                                                    for kind, n in counts.items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
