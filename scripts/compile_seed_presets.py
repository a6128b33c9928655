"""Each seed preset at its task's ``gpu`` sizes (ResNet-50, GPT-2 124M), compiled with Inductor on this machine's CPU
for a few steps at batch 2: whether Inductor compiles it, with how many graph breaks and graphs, and the compile's
seconds. The GPU checks compile these presets first on the device; their CPU rehearsal (``--tiny``) runs the
``cpu`` sizes with TorchDynamo's eager backend, which captures the graphs but generates no code. This generates it
(for a CPU, not Triton's kernels) on the models and methods the device runs, so a lowering that fails fails here.
Minutes a preset on 2 cores (ResNet-50's compile most)::

    OMP_NUM_THREADS=2 .venv/bin/python scripts/compile_seed_presets.py --out FILE            # every seed preset
    OMP_NUM_THREADS=2 .venv/bin/python scripts/compile_seed_presets.py imagenet:hot gpt2:hot  # some

``scripts/gpu_check.sh rehearse`` runs it on the device's torch with ``--with-presets``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from count_step_ops import make_seed_files  # noqa: E402 (the scripts folder, as this script's own)
from gpu_check import dynamo_counts, fresh_dynamo  # noqa: E402
from gpu_throughput import SEED_PRESETS  # noqa: E402


def compile_preset(preset: str, files: dict[str, Path], work: Path, steps: int) -> dict:
    """``preset`` trained ``steps`` batches of 2 at its task's gpu sizes with TorchDynamo's counters fresh."""
    from torch._dynamo.utils import counters

    from speedkit.tasks import make_trainer

    task, name = preset.split(":")
    fresh_dynamo()
    started = time.perf_counter()
    try:
        record = make_trainer(task, name, data=files[task], task_options={"sizes": "gpu"}, batch_size=2,
                              num_workers=0, duration=f"{steps}ba", eval_interval="1000ba", log_interval=steps,
                              device="cpu", run_dir=work / "runs", run_name=preset.replace(":", "-"),
                              overwrite=True, save_checkpoints=False, progress_bar=False).fit()
        result = {"status": record.status, "methods": sorted(record.method_names),
                  "compile_s": record.timings.get("compile_s")}
    except Exception as error:  # noqa: BLE001 -- a preset that fails to compile is the finding; the rest still run
        result = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:1000]}
    return {**result, "seconds": round(time.perf_counter() - started, 1), **dynamo_counts(),
            "graph_break_reasons": sorted(counters["graph_break"])[:5]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", default=list(SEED_PRESETS), help="task:preset (default: all seed ones)")
    parser.add_argument("--steps", type=int, default=4, help="batches each (default 4)")
    parser.add_argument("--work", default="/tmp/speedkit-compile-seed-presets", help="generated files and runs")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    from speedkit.record.runs import environment

    work = Path(args.work)
    os.environ.setdefault("SPEEDKIT_SHARDS", str(work / "shards"))
    files = make_seed_files(work / "seed-files")
    results = {"command": "python scripts/compile_seed_presets.py " + " ".join(argv or sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d"), "machine": environment("cpu"), "steps": args.steps,
               "presets": {}}
    for preset in args.presets:
        results["presets"][preset] = outcome = compile_preset(preset, files, work, args.steps)
        print(preset, json.dumps(outcome), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    failed = [p for p, r in results["presets"].items() if r["status"] == "failed" or r["graph_breaks"]]
    print(f"compile-seed-presets: {len(args.presets) - len(failed)} of {len(args.presets)} compiled whole"
          + (f"; not: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
