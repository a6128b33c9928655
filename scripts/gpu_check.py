"""One prepared check of speedkit on one GPU (its first run, on an H200: bench/README.md, "The first GPU run").

    scripts/gpu_check.sh [--out runs/gpu-check] [--steps syncs,seed] [--presets imagenet:hot,gpt2:hot] [--phases 10]
    python scripts/gpu_check.py --device cpu --tiny    # its steps at tiny scale on a CPU (the test runs this)

Steps, run in ``--steps`` order (default: all four, as numbered), each writing into one results folder with
``summary.json`` and ``summary.md`` at its top, rewritten after each step and each seed preset, so a check
stopped at a time limit keeps what it finished:

1. ``syncs``: the ``hot`` presets of both built-in tasks for a few dozen steps with a ``SyncCounter`` and,
   on CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` (every synchronizing CUDA call warns); counts the
   waits in steps between logging intervals (expected: 0), per evaluation (expected: <= 1), the CUDA
   sync warnings, the peak GPU memory and the fraction of the device's dense peak FLOP/s reached.
2. ``seed``: the seed's workloads at their real sizes (the ``gpu`` profiles of tasks ``imagenet`` and ``gpt2``):
   torchvision ResNet-50 at 224 px and GPT-2 124M at 1,024 tokens, each preset for a fixed number of steps on a
   generated ImageNet-layout folder and a generated text corpus, streamed from shards; reports images/s,
   tokens/s, the fraction of the device's dense bf16 peak FLOP/s, the share of time spent waiting for data,
   the peak memory and the host waits between logging steps. With ``--phases N``, each preset also runs N steps
   under torch.profiler: its time by phase of the loop (data and the methods that act on batches, forward,
   backward, ...) and its busiest operators.
3. ``bench``: ``hot`` against ``plain-bf16`` (vision) and ``hot`` against ``tuned`` (language) under the
   ``gpu`` benchmark profile, one seed each.
4. ``notebooks``: the ``gpu`` parameter sets of notebooks 00 and 02 (shortened) and tutorials t7 and t10
   (they need the ``[demo]`` extra).

A step or preset that fails is reported with its error and the others still run. Without a GPU (and without
``--device cpu``) it says so and exits with status 2.
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

from speedkit.core.engine import Callback

NOTEBOOKS = ("00_quickstart", "02_vision_benchmark", "t7_gpu_precision_and_compile", "t10_language_model")
SHORT_NOTEBOOKS = {"02_vision_benchmark": {"duration": "1ep"}}  # "(short)": one epoch, not the set's full budget
BENCH = (("vision", "hot", "plain-bf16"), ("language", "hot", "tuned"))
# The seed's workloads (the seed step): task, the options that set its real sizes, and the throughput it reports.
SEED_TASKS = (("imagenet", {"image_size": 224, "eval_image_size": 224}, "images_per_s"),
              ("gpt2", {}, "tokens_per_s"))
# The seed step's size: steps per preset, batch per task, logging interval (a multiple of it ends the run: the
# steps between are the quiet ones the sync counter checks).
SEED_SIZES = {"gpu": {"steps": 30, "log_interval": 10, "batch_size": {"imagenet": 256, "gpt2": 16},
                     "workers": 8},
              "cpu": {"steps": 3, "log_interval": 3, "batch_size": {"imagenet": 2, "gpt2": 1}, "workers": 0}}


def sync_check(device: str, out: Path, tiny: bool) -> dict:
    """The sync step: host waits, CUDA sync warnings, peak memory and fraction of peak, for both tasks' hot preset."""
    return {task: guarded(lambda: sync_run(task, device, out, tiny)) for task in ("fashion-mnist", "pydocs")}


def sync_run(task: str, device: str, out: Path, tiny: bool) -> dict:
    import torch

    from speedkit.callbacks import SyncCounter
    from speedkit.tasks import make_trainer

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
    return {
        "status": record.status, "waits_in_quiet_steps": report["waits_in_quiet_steps"],
        "steps_with_waits": report["steps_with_waits"], "per_evaluation": report["per_evaluation"],
        "cuda_sync_warnings": len(sync_warnings), "first_sync_warnings": sync_warnings[:5],
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 3) if cuda else None,
        "fraction_of_peak": fractions[-1] if fractions else None,
        "peak_flops": record.environment.get("peak_flops"),
        "ok": record.status == "completed" and report["waits_in_quiet_steps"] == 0
        and all(n <= 1 for n in report["per_evaluation"])}


def make_seed_data(root: Path, images_per_class: int, classes: int = 4, docs: int = 12,
                   words_per_doc: int = 4000) -> dict[str, Path]:
    """A generated ImageNet-layout folder (train/<class>/ and val/<class>/ JPEGs of varied sizes, 96 to 512 px)
    and a generated text corpus, under ``root``; made once (a folder already there is used as it is)."""
    import random

    from PIL import Image

    images, text = root / "imagenet", root / "corpus"
    rng = random.Random(0)
    if not images.is_dir():
        for split, count in (("train", images_per_class), ("val", max(1, images_per_class // 4))):
            for c in range(classes):
                folder = images / split / f"n{c:08d}"
                folder.mkdir(parents=True, exist_ok=True)
                for i in range(count):
                    size = (rng.randint(96, 512), rng.randint(96, 512))
                    Image.new("RGB", size, (60 * c % 256, rng.randint(0, 255), 90)).save(folder / f"{i}.JPEG")
    if not text.is_dir():
        text.mkdir(parents=True)
        words = ("model data step batch token image shard stream epoch train speed method seed layer head width "
                 "the a of and to in is it that for on with as by at from").split()
        for d in range(docs):
            (text / f"doc{d}.txt").write_text(" ".join(rng.choice(words) for _ in range(words_per_doc)) + "\n")
    return {"imagenet": images, "gpt2": text}


def seed_check(device: str, out: Path, profile: str = "gpu", recipes: dict | None = None,
               sizes: dict | None = None, data: dict | None = None, precision: str | None = None,
               progress=None, phase_steps: int = 0) -> dict:
    """The seed step: each preset of the seed's tasks (``recipes``: task -> names; default all) for a fixed number of
    steps at the ``profile``'s sizes; images/s or tokens/s, the fraction of the dense bf16 peak (the measured
    matmul's where the GPU has no spec figure, and on a CPU), host waits between logging steps. ``precision``
    overrides the presets' (a CPU test runs fp32: bf16 is emulated on most CPUs); ``progress(results)`` is called
    after each preset. ``phase_steps``: also that many steps of each preset under torch.profiler, timed by phase
    of the loop, with the busiest operators (where a slow preset's time goes)."""
    import torch

    from speedkit.callbacks.speed_monitor import spec_peak_flops
    from speedkit.tasks import find_task

    size = sizes or SEED_SIZES["gpu" if device.startswith("cuda") else "cpu"]
    made = time.perf_counter()
    data = data or (make_seed_data(out / "seed-data", images_per_class=512, docs=48) if device.startswith("cuda")
                    else make_seed_data(out / "seed-data", images_per_class=4))
    print(f"gpu-check: seed data ready in {time.perf_counter() - made:.1f} s", flush=True)
    cuda = device.startswith("cuda")
    bf16_peak = spec_peak_flops(torch.cuda.get_device_name(), "bf16") if cuda else None
    results = {}
    for task, options, throughput in SEED_TASKS:
        task_options = {"profile": profile, **(options if profile == "gpu" else {})}
        names = recipes.get(task, []) if recipes else list(find_task(task, data[task], **task_options).recipes)
        for name in names:
            results[f"{task}:{name}"] = guarded(lambda: seed_run(task, name, throughput, task_options, device, out,
                                                                 size, data, bf16_peak, precision, phase_steps))
            if progress:
                progress(results)
    return results


class DataWait(Callback):
    """The share of the loop's wall-clock time spent waiting for its next batch, after the first logging interval
    (the loader's workers start in the first, which a run of a few dozen steps would otherwise mostly measure)."""

    def __init__(self, after_batch: int):
        self.after_batch, self.waited, self.start, self.end, self._asked = after_batch, 0.0, None, None, None

    def run_event(self, event, state, logger) -> None:
        now, batch = time.perf_counter(), state.timestamp.batch
        if event.value == "before_dataloader":
            self._asked = now
        elif event.value == "after_dataloader" and batch >= self.after_batch and self.start is not None:
            self.waited += now - self._asked
        elif event.value == "batch_end":
            if batch == self.after_batch:
                self.start = now
            self.end = now

    def share(self) -> float | None:
        return round(self.waited / (self.end - self.start), 4) if self.start and self.end > self.start else None


def seed_run(task: str, name: str, throughput: str, task_options: dict, device: str, out: Path, size: dict,
             data: dict, bf16_peak: tuple | None, precision: str | None, phase_steps: int = 0) -> dict:
    """One preset of the seed step for ``size["steps"]`` steps: its throughput, share of the dense bf16 peak,
    share of time waiting for batches after the first logging interval, peak GPU memory, host waits; with
    ``phase_steps``, a second run of that many steps under torch.profiler (``profile_steps``)."""
    import torch

    from speedkit.callbacks import SyncCounter
    from speedkit.callbacks.phase_timer import profile_steps
    from speedkit.tasks import make_trainer

    def trainer_for(duration: str, callbacks: list, run_name: str):
        return make_trainer(task, name, data=data[task], task_options=task_options, device=device, duration=duration,
                            batch_size=size["batch_size"][task], eval_interval=duration,
                            log_interval=size["log_interval"], num_workers=size["workers"], run_dir=out / "seed",
                            run_name=run_name, **({"precision": precision} if precision else {}),
                            save_checkpoints=False, callbacks=callbacks)

    started = time.perf_counter()
    counter, steps, data_wait = SyncCounter(), size["steps"], DataWait(after_batch=size["log_interval"])
    trainer = trainer_for(f"{steps}ba", [counter, data_wait], f"{task}-{name}")
    cuda = trainer.state.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    record = trainer.fit()
    rows = [row for row in record.steps if "throughput/samples_per_s" in row]
    last = rows[-1] if rows else {}
    flops = last.get("throughput/flops_per_s")
    # on a GPU with a spec figure, its dense bf16 peak; elsewhere the speed monitor's (a matmul measured at the
    # run's precision)
    fraction = flops / bf16_peak[0] if flops and bf16_peak else last.get("throughput/fraction_of_peak")
    report = counter.report()
    # guarded apart: a profile that fails must not cost the preset its throughput figures
    phases = guarded(lambda: profile_steps(lambda duration, callbacks: trainer_for(
        duration, callbacks, f"{task}-{name}-phases"), phase_steps, top=8)) if phase_steps else None
    return {
        "status": record.status, "steps": steps, "batch_size": size["batch_size"][task],
        throughput: last.get("throughput/samples_per_s") if throughput == "images_per_s"
        else last.get("throughput/tokens_per_s"),
        "flops_per_s": flops,
        "fraction_of_bf16_peak" if bf16_peak else "fraction_of_measured_peak": fraction,
        "peak": bf16_peak[1] if bf16_peak else (record.environment.get("peak_flops") or {}).get("source"),
        "data_wait_share": data_wait.share(),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if cuda else None,
        "waits_in_quiet_steps": report["waits_in_quiet_steps"],
        "seconds": round(time.perf_counter() - started, 1),  # set-up included: what sizes the next check
        **({"phases": phases} if phases else {}),
        "ok": record.status == "completed" and report["waits_in_quiet_steps"] == 0 and flops is not None
        and not (phases and "error" in phases)}


def guarded(work) -> dict:
    """``work()``'s result, or what broke (one failing part of the check must not lose the others' figures)."""
    import traceback

    try:
        return work()
    except Exception as error:  # noqa: BLE001 -- reported in the summary, and the check fails
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000],
                "traceback": traceback.format_exc()[-4000:]}


def speedkit_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "speedkit", *args]


def notebook_commands(out: Path, tiny: bool) -> list[list[str]]:
    """The notebook step's commands: one per notebook, so that a short one gets its own overrides."""
    params = "cpu-smoke" if tiny else "gpu"
    commands = []
    for name in NOTEBOOKS:
        overrides = [] if tiny else [a for key, value in SHORT_NOTEBOOKS.get(name, {}).items()
                                     for a in ("-p", key, str(value))]
        commands.append(speedkit_command("notebooks", "run", "--params", params, "--only", name,
                                         "--out", str(out / "notebooks"), *overrides))
    return commands


def bench_commands(device: str, out: Path, tiny: bool) -> list[list[str]]:
    """The bench step's commands: a recipe against its baseline per task, under the gpu profile (cpu at tiny scale)."""
    commands = []
    for task, recipe, baseline in BENCH:
        scale = ["--profile", "cpu", "--device", device, "--duration", "3ba", "--data-fraction", "0.01",
                 "--eval-fraction", "0.01"] if tiny else ["--profile", "gpu"]
        commands.append(speedkit_command("bench", "--task", task, *scale, "--no-figures", "--seeds", "1",
                                         "--recipes", recipe, "--baselines", baseline,
                                         "--out", str(out / "bench" / task),
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
    """summary.json and summary.md, rewritten after each step (a check stopped at its time limit keeps the steps
    it finished)."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    verdict = ("passed" if summary["ok"] else "FAILED") if "ok" in summary else "unfinished"
    lines = [f"# speedkit GPU check: {summary['device_name']}", "",
             f"{verdict} after {summary['seconds']} s; torch {summary['torch']}", ""]
    tables = {"syncs": ("host waits (hot presets)", "task",
                        ("waits_in_quiet_steps", "per_evaluation", "cuda_sync_warnings", "peak_memory_gib",
                         "fraction_of_peak")),
              "seed": ("the seed's workloads (gpu: ResNet-50 at 224 px, GPT-2 124M at 1,024 tokens)", "task:preset",
                       ("images_per_s", "tokens_per_s", "fraction_of_bf16_peak", "data_wait_share",
                        "peak_memory_gib", "waits_in_quiet_steps", "seconds"))}
    for step, (title, key, columns) in tables.items():
        if step not in summary:
            continue
        lines += [f"## {title}", "", "| " + " | ".join((key, *columns)) + " |", "|" + " --- |" * (len(columns) + 1)]
        for name, r in summary[step].items():
            cells = [r.get("error", "")[:80] or _cell(r.get(c, r.get("fraction_of_measured_peak"))
                                                    if c == "fraction_of_bf16_peak" else r.get(c)) for c in columns]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    profiled = {name: r["phases"] for name, r in summary.get("seed", {}).items() if "phases" in r}
    if profiled:
        lines += ["## where the seed presets' time went (under torch.profiler)", ""]
        for name, found in profiled.items():
            if "error" in found:
                lines.append(f"- {name}: {found['error'][:120]}")
                continue
            shares = ", ".join(f"{phase} {p['share']:.0%}" for phase, p in found["phases"].items() if p["share"])
            busiest = ", ".join(f"{op['name']} {op.get('self_device_ms', op['self_cpu_ms']):,.1f} ms"
                                for op in found.get("top_operators", [])[:4])
            lines.append(f"- {name}: {found['steps']} steps in {found['total_s']:.2f} s; {shares}; busiest: {busiest}")
        lines.append("")
    for step in ("notebooks", "bench"):
        if step in summary:
            lines += [f"## {step}", ""] + [f"- exit {r['exit']} in {r['seconds']} s: `{r['command']}`"
                                           for r in summary[step]] + [""]
    (out / "summary.md").write_text("\n".join(lines))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return "" if value is None else str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gpu-check", help="the results folder")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu to exercise its steps")
    parser.add_argument("--tiny", action="store_true", help="tiny scale (a CPU test of the steps)")
    parser.add_argument("--steps", default="syncs,seed,bench,notebooks",
                        help="comma-separated steps, run in the order given")
    parser.add_argument("--presets", default=None,
                        help="the seed step's presets, e.g. imagenet:mild,gpt2:hot (default: every preset of both)")
    parser.add_argument("--phases", type=int, default=0, metavar="STEPS",
                        help="the seed step also runs each preset STEPS steps under torch.profiler and reports its "
                             "time by phase of the loop and its busiest operators (default 0: not)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if (out / "summary.json").exists():  # its runs' folders would be refused only after minutes of device time
        parser.error(f"--out {out} holds an earlier check (summary.json), whose runs are kept; give this check "
                     f"its own folder, e.g. --out {out}-2")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); nothing was checked. "
              "Run it on a machine with a GPU, or pass --device cpu --tiny to exercise its steps", file=sys.stderr)
        return 2
    steps = args.steps.split(",")
    unknown = set(steps) - {"syncs", "seed", "bench", "notebooks"}
    if unknown:
        parser.error(f"--steps: unknown {sorted(unknown)}; choose from syncs, seed, bench, notebooks")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    start = time.perf_counter()
    summary = {"device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
               "torch": torch.__version__, "device": args.device, "tiny": args.tiny, "seconds": 0}
    presets = {}
    for item in (args.presets or "").split(","):
        if item:
            task, _, name = item.partition(":")
            presets.setdefault(task, []).append(name)

    def seed_progress(results: dict) -> None:
        write_summary(out, {**summary, "seed": results, "seconds": round(time.perf_counter() - start, 1)})

    run_step = {
        "syncs": lambda: sync_check(args.device, out, args.tiny),
        # tiny: the cpu profiles' narrow models, a few steps
        "seed": lambda: seed_check(args.device, out, "cpu" if args.tiny else "gpu", recipes=presets or None,
                                   sizes=SEED_SIZES["cpu"] if args.tiny else None, progress=seed_progress,
                                   phase_steps=args.phases),
        "notebooks": lambda: run_commands(notebook_commands(out, args.tiny), log),
        "bench": lambda: run_commands(bench_commands(args.device, out, args.tiny), log)}
    for step in steps:
        result = guarded(run_step[step])
        summary[step] = result if "error" not in result else {step: result}
        summary["seconds"] = round(time.perf_counter() - start, 1)
        write_summary(out, summary)
    summary["ok"] = all(r["ok"] if "ok" in r else r["exit"] == 0 for step in steps
                        for r in (summary[step].values() if isinstance(summary[step], dict) else summary[step]))
    write_summary(out, summary)
    print((out / "summary.md").read_text())
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
