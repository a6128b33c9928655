"""One prepared check of speedkit on one GPU (at most about 8 minutes on an H100-class GPU).

    scripts/gpu_check.sh [--out runs/gpu-check]        # on a machine with a CUDA GPU
    python scripts/gpu_check.py --device cpu --tiny    # its steps at tiny scale on a CPU (the test runs this)

Steps, each writing into one results folder, with ``summary.json`` and ``summary.md`` at its top:

1. ``syncs``: the ``hot`` presets of both built-in tasks for a few dozen steps with a ``SyncCounter`` and,
   on CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` (every synchronizing CUDA call warns); counts the
   waits in steps between logging intervals (expected: 0), per evaluation (expected: <= 1), the CUDA
   sync warnings, the peak GPU memory and the fraction of the device's dense peak FLOP/s reached.
2. ``notebooks``: the ``gpu`` parameter sets of notebooks 00 and 02 (shortened) and tutorials t7 and t10.
3. ``bench``: ``hot`` against ``plain-bf16`` (vision) and ``hot`` against ``tuned`` (language) under the
   ``gpu`` benchmark profile, one seed each.

Without a GPU (and without ``--device cpu``) it says so and exits with status 2. The figures it prints
have not been measured yet: no GPU has been lent to this project when it was written.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

NOTEBOOKS = ("00_quickstart", "02_vision_benchmark", "t7_gpu_precision_and_compile", "t10_language_model")
SHORT_NOTEBOOKS = {"02_vision_benchmark": {"duration": "1ep"}}  # "(short)": one epoch, not the set's full budget
BENCH = (("vision", "hot", "plain-bf16"), ("language", "hot", "tuned"))


def sync_check(device: str, out: Path, tiny: bool) -> dict:
    """Step 1: host waits, CUDA sync warnings, peak memory and fraction of peak, for both tasks' hot preset."""
    import torch

    from speedkit.callbacks import SyncCounter
    from speedkit.tasks import make_trainer

    results = {}
    for task in ("fashion-mnist", "pydocs"):
        counter = SyncCounter()
        size = dict(duration="7ba", batch_size=8, data_fraction=0.01, eval_fraction=0.005, eval_interval="3ba",
                    log_interval=3) if tiny else dict(duration="60ba", eval_interval="30ba", log_interval=10)
        trainer = make_trainer(task, "hot", device=device, run_dir=out / "syncs", run_name=task,
                               save_checkpoints=False, callbacks=[counter], **size)
        cuda = trainer.state.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                record = trainer.fit()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        sync_warnings = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]
        fractions = [row["throughput/fraction_of_peak"] for row in record.steps if "throughput/fraction_of_peak" in row]
        report = counter.report()
        results[task] = {
            "status": record.status, "waits_in_quiet_steps": report["waits_in_quiet_steps"],
            "steps_with_waits": report["steps_with_waits"], "per_evaluation": report["per_evaluation"],
            "cuda_sync_warnings": len(sync_warnings), "first_sync_warnings": sync_warnings[:5],
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 3) if cuda else None,
            "fraction_of_peak": fractions[-1] if fractions else None,
            "peak_flops": record.environment.get("peak_flops"),
            "ok": record.status == "completed" and report["waits_in_quiet_steps"] == 0
            and all(n <= 1 for n in report["per_evaluation"])}
    return results


def speedkit_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "speedkit", *args]


def notebook_commands(out: Path, tiny: bool) -> list[list[str]]:
    """Step 2's commands: one per notebook, so that a short one gets its own overrides."""
    params = "cpu-smoke" if tiny else "gpu"
    commands = []
    for name in NOTEBOOKS:
        overrides = [] if tiny else [a for key, value in SHORT_NOTEBOOKS.get(name, {}).items()
                                     for a in ("-p", key, str(value))]
        commands.append(speedkit_command("notebooks", "run", "--params", params, "--only", name,
                                         "--out", str(out / "notebooks"), *overrides))
    return commands


def bench_commands(device: str, out: Path, tiny: bool) -> list[list[str]]:
    """Step 3's commands: a recipe against its baseline per task, under the gpu profile (cpu at tiny scale)."""
    commands = []
    for task, recipe, baseline in BENCH:
        scale = ["--profile", "cpu", "--device", device, "--duration", "3ba", "--data-fraction", "0.01",
                 "--eval-fraction", "0.01", "--no-figures"] if tiny else ["--profile", "gpu"]
        commands.append(speedkit_command("bench", task, *scale, "--seeds", "1", "--recipes", recipe,
                                         "--baselines", baseline, "--out", str(out / "bench" / task),
                                         "--run-dir", str(out / "bench" / task / "runs")))
    return commands


def run_commands(commands: list[list[str]], log: Path) -> list[dict]:
    results = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("a") as stream:
        for command in commands:
            start = time.perf_counter()
            stream.write("$ " + " ".join(command) + "\n")
            stream.flush()
            code = subprocess.call(command, stdout=stream, stderr=subprocess.STDOUT, env=env)
            results.append({"command": " ".join(command[2:]), "exit": code,
                            "seconds": round(time.perf_counter() - start, 1)})
    return results


def write_summary(out: Path, summary: dict) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    lines = [f"# speedkit GPU check: {summary['device_name']}", "",
             f"{'passed' if summary['ok'] else 'FAILED'} in {summary['seconds']} s; torch {summary['torch']}", "",
             "## host waits (hot presets)", "",
             "| task | waits in quiet steps | per evaluation | CUDA sync warnings | peak memory GiB | "
             "fraction of peak |", "| --- | --- | --- | --- | --- | --- |"]
    for task, r in summary.get("syncs", {}).items():
        lines.append(f"| {task} | {r['waits_in_quiet_steps']} | {r['per_evaluation']} | {r['cuda_sync_warnings']} | "
                     f"{r['peak_memory_gib']} | {r['fraction_of_peak']} |")
    for step in ("notebooks", "bench"):
        lines += ["", f"## {step}", ""]
        lines += [f"- exit {r['exit']} in {r['seconds']} s: `{r['command']}`" for r in summary.get(step, [])]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gpu-check", help="the results folder")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu to exercise its steps")
    parser.add_argument("--tiny", action="store_true", help="tiny scale (a CPU test of the steps)")
    parser.add_argument("--steps", default="syncs,notebooks,bench", help="comma-separated steps to run")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); nothing was checked. "
              "Run it on a machine with a GPU, or pass --device cpu --tiny to exercise its steps", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = set(args.steps.split(","))
    start = time.perf_counter()
    summary = {"device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
               "torch": torch.__version__, "device": args.device, "tiny": args.tiny}
    if "syncs" in steps:
        summary["syncs"] = sync_check(args.device, out, args.tiny)
    log = out / "commands.log"
    if "notebooks" in steps:
        summary["notebooks"] = run_commands(notebook_commands(out, args.tiny), log)
    if "bench" in steps:
        summary["bench"] = run_commands(bench_commands(args.device, out, args.tiny), log)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    summary["ok"] = (all(r["ok"] for r in summary.get("syncs", {}).values())
                     and all(r["exit"] == 0 for step in ("notebooks", "bench") for r in summary.get(step, [])))
    write_summary(out, summary)
    print((out / "summary.md").read_text())
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
