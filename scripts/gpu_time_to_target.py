"""The time-to-target check (``scripts/gpu_check.sh time-to-target``; at most about 9 minutes of a lent GPU).

Its parts, top to bottom, each writing ``time-to-target.json`` as it finishes (``scripts/gpu_check.py`` runs them):

1. ``fashion-mnist`` and ``pydocs``: ``speedkit bench --profile gpu --seeds 3`` (in the check's process), ``hot``
   against the task's strongest baseline (``plain-bf16``; ``tuned``), as a user runs the benchmark; each seed's
   time to the target and the paired speed-ups, from the benchmark's summary.
2. ``gpt2``: GPT-2 124M ``hot`` against ``baseline`` (the task's ``gpu`` sizes, batch 32 x 1,024 tokens, one seed)
   on token shards of text the device machine has (its Python's standard library and /usr/share/doc), with a BPE
   trained there; each run at most about 3 minutes. The target, by a rule fixed before the runs: the baseline's
   last evaluation loss plus 0.05, which it holds at its end; each arm's time is when it first reaches it.
3. ``imagenet``: ``mild`` against ``plain-bf16`` with ResNet-50 at each recipe's published sizes scaled as the
   task's ``cpu`` sizes scale them (64 and 80 px, batch 64 and the learning rate with it), compiled as at the
   ``gpu`` sizes, at their whole epoch budgets (36 and 90), on the shard set
   carried to the device (``.gpu-carry/imagenet-shards``, made by ``scripts/gpu_check.sh prepare IMAGE_FOLDER``);
   target: the baseline's last accuracy less 0.01. Without the shard set it is skipped, with the reason.

Times are training time to the target (evaluation apart), from each run's RunRecord; the speed-up of a pair is
the baseline's time over the recipe's (``speedkit.experiments.measure``). Each is also given less the run's first
compile (``less_compile``): a cold compile can be most of a GPU run's seconds to the target. Its CPU rehearsal
(``--device cpu --tiny``, in CI) runs the same benchmark profile and compiled GPT-2 arms for a batch or a few, on a
sliver of the data, the ``imagenet`` part on a tiny shard set.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

from gpu_throughput import compile_backend, compiled_methods

ROOT = Path(__file__).resolve().parents[1]
CARRIED_IMAGENET = ROOT / ".gpu-carry" / "imagenet-shards"


@dataclasses.dataclass(frozen=True)
class Settings:
    budget_s: float
    bench_profile: str
    bench_seeds: int
    bench_scale: tuple[str, ...]  # extra `speedkit bench` arguments (tiny: a few batches of a sliver of the data)
    corpus_bytes: int
    vocab: int
    context: int
    task_sizes: str
    gpt2_batch: int
    gpt2_durations: dict  # arm -> budget
    gpt2_eval_interval: str
    imagenet_sizes: str  # the imagenet task's sizes (cpu: scaled to the carried 96-px shards)
    imagenet_batch: int
    imagenet_durations: dict
    imagenet_model: str
    precision: str | None
    workers: int
    compile_backend: str  # what torch.compile runs with (tiny: "eager", as the throughput check's tiny mode)


FULL = Settings(budget_s=530, bench_profile="gpu", bench_seeds=3, bench_scale=(), corpus_bytes=48_000_000,
                vocab=50_257, context=1024, task_sizes="gpu", gpt2_batch=32,
                gpt2_durations={"baseline": "700ba", "hot": "350ba"}, gpt2_eval_interval="50ba",
                imagenet_sizes="cpu", imagenet_batch=64, imagenet_durations={"plain-bf16": "90ep", "mild": "36ep"},
                imagenet_model="resnet50", precision=None, workers=min(12, os.cpu_count() or 1),
                compile_backend="inductor")
# The tiny rehearsal runs the GPU's benchmark profile and compiled GPT-2 arms too, on a sliver of the data, with the
# eager backend (gpu_throughput.TINY says why): what the device would run, but the code generation.
TINY = Settings(budget_s=600, bench_profile="gpu", bench_seeds=1,
                bench_scale=("--duration", "1ba", "--data-fraction", "0.01", "--eval-fraction", "0.01"),
                corpus_bytes=150_000, vocab=360, context=64, task_sizes="cpu", gpt2_batch=2,
                gpt2_durations={"baseline": "4ba", "hot": "2ba"}, gpt2_eval_interval="2ba", imagenet_sizes="cpu",
                imagenet_batch=4,
                imagenet_durations={"plain-bf16": "2ba", "mild": "1ba"}, imagenet_model="resnet18",
                precision="fp32", workers=0, compile_backend="eager")
# the bench tasks: recipe against each task's strongest baseline (bench/README.md)
BENCH = (("fashion-mnist", "hot", "plain-bf16"), ("pydocs", "hot", "tuned"))


def settings(tiny: bool) -> Settings:
    return TINY if tiny else FULL


def run(results, s: Settings, device: str, only: set | None = None) -> None:
    work = Path(os.environ.get("SPEEDKIT_GPU_CHECK_WORK", "/tmp/speedkit-gpu-check")) / "time-to-target"
    os.environ.setdefault("SPEEDKIT_SHARDS", str(work / "shard-cache"))

    def part(name, fn, needs_s=0.0):
        return results.part(name, fn, needs_s) if only is None or name in only else None

    names = (*[task for task, _, _ in BENCH], "gpt2", "imagenet")
    results.plan([name for name in names if only is None or name in only])

    from speedkit.data.streaming.shards import is_shard_folder

    imagenet_shards = Path(os.environ.get("SPEEDKIT_GPU_CHECK_IMAGENET", CARRIED_IMAGENET))
    with compile_backend(s.compile_backend):
        for task, recipe, baseline in BENCH:
            # three seeds of two compiled arms: each arm's cold compiles in the first seed (training's graph and
            # evaluation's), Inductor's cache for the seeds after it
            part(task, lambda: bench(task, recipe, baseline, s, device, work), 150)
        part("gpt2", lambda: gpt2_to_target(s, device, work), 200)
        if is_shard_folder(imagenet_shards):
            # two compiles of ResNet-50 an arm (training's graph and evaluation's), then 90 and 36 short epochs
            part("imagenet", lambda: imagenet_to_target(imagenet_shards, s, device, work), 240)
        elif only is None or "imagenet" in only:
            results.skip("imagenet", f"no shard set at {imagenet_shards}: run `scripts/gpu_check.sh prepare "
                                     f"IMAGE_FOLDER` before the lease and carry .gpu-carry (bench/README.md, GPU "
                                     f"section)")


# -- 1. the benchmark's own runs ----------------------------------------------------------------------------

def bench(task: str, recipe: str, baseline: str, s: Settings, device: str, work: Path) -> dict:
    """``speedkit bench`` (in this process: a second one would pay for torch's import again); each seed's times and
    the paired speed-ups from its summary."""
    from speedkit.cli.main import main as speedkit

    out = work / task
    arguments = ["bench", "--task", task, "--profile", s.bench_profile, "--device", device, "--seeds",
                 str(s.bench_seeds), "--recipes", recipe, "--baselines", baseline, *s.bench_scale, "--no-figures",
                 "--out", str(out), "--run-dir", str(out / "runs")]
    command = "speedkit " + " ".join(arguments)
    try:
        code = speedkit(arguments)
    except SystemExit as refused:  # argparse's refusal of an argument: this part fails, the others still run
        code = refused.code
    if code != 0:
        return {"ok": False, "command": command, "error": f"exit status {code}"}
    summary = next(iter(json.loads((out / "summary.json").read_text()).values()))
    arms = {name: _bench_arm(summary["baselines" if name == baseline else "recipes"][name])
            for name in (baseline, recipe)}
    ratio, apart = summary.get("speedup_median"), less_compile(arms, baseline, recipe)
    return {"ok": True, "command": command, "target": summary["target"], "seeds": summary["seeds"],
            "strongest_baseline": summary["strongest_baseline"], "arms": arms,
            "speedup_median": ratio, "speedup_by_seed": summary["recipes"][recipe].get("speedup"), **apart,
            "headline": f"{recipe} against {baseline}: reached {arms[recipe]['reached']}/{len(summary['seeds'])}, "
                        f"median speed-up {_rounded(ratio)} ({_rounded(apart['speedup_less_compile_median'])} "
                        f"less the first batch's compile)"}


def less_compile(arms: dict, baseline: str, recipe: str) -> dict:
    """Each seed's time to target less its first batch's compile, and the speed-ups so. A run's training clock
    counts the compile (``record.timings['compile_s']``, the first batch's time); on a GPU, where a run to the target
    takes seconds and a cold compile tens of them, it can be most of a time to target, where the speed-up records
    (modded-nanogpt's, airbench's) time after their warm-up: both figures are reported."""
    def seconds(arm: dict) -> list:
        compiles = arm["compile_s"] or [None] * len(arm["time_to_target_s"])
        return [None if t is None else t - (c or 0.0) for t, c in zip(arm["time_to_target_s"], compiles)]

    times = {name: seconds(arms[name]) for name in (baseline, recipe)}
    ratios = [b / r if b is not None and r else None for b, r in zip(times[baseline], times[recipe])]
    paired = [x for x in ratios if x is not None]  # a seed that missed the target drops its pair, as in bench
    median = statistics.median(paired) if paired else None
    return {"time_to_target_less_compile_s": times, "speedup_less_compile_by_seed": ratios,
            "speedup_less_compile_median": median}


def _rounded(value: float | None):
    return value if value is None else round(value, 2)


def _bench_arm(arm: dict) -> dict:
    keys = ("time_to_target_s", "final_metric", "train_s", "eval_s", "setup_s", "compile_s", "budget", "reached",
            "median_time_to_target_s", "flops_fraction_of_peak")
    return {key: arm.get(key) for key in keys}


# -- 2. GPT-2 124M to a loss target ------------------------------------------------------------------------

def gpt2_to_target(s: Settings, device: str, work: Path) -> dict:
    from gpu_throughput import device_text

    from speedkit.data.streaming.prepare import prepare_text

    from speedkit.data.streaming.shards import read_shards

    shards = work / "token-shards"
    if not shards.is_dir():
        device_text(work / "text", s.corpus_bytes)
        prepare_text(work / "text", shards, vocab_size=s.vocab, block=s.context, workers=os.cpu_count() or 1,
                     progress=False)
    manifest = read_shards(shards).manifest
    records = {arm: _fit("gpt2", arm, shards, s.task_sizes, s, device, work, batch_size=s.gpt2_batch,
                         duration=duration, eval_interval=s.gpt2_eval_interval, compiled=True)
               for arm, duration in s.gpt2_durations.items()}
    # the rule, fixed before the runs: the baseline's last evaluation loss, plus 0.05
    target = _last(records["baseline"], "eval/loss") + 0.05
    return {**_pair(records, s.gpt2_durations, "baseline", "hot", "eval/loss", target,
                    "the baseline's last eval/loss + 0.05"),
            "corpus": {"vocab_size": manifest["vocab_size"], "tokens": manifest.get("tokens"), "batch": s.gpt2_batch,
                       "context": s.context}}


# -- 3. imagenet mild against plain-bf16 at whole epoch budgets ------------------------------------------------

def imagenet_to_target(shards: Path, s: Settings, device: str, work: Path) -> dict:
    records = {arm: _fit("imagenet", arm, shards, s.imagenet_sizes, s, device, work, batch_size=s.imagenet_batch,
                         duration=duration, model=s.imagenet_model, compiled=True)
               for arm, duration in s.imagenet_durations.items()}
    target = _last(records["plain-bf16"], "eval/accuracy") - 0.01
    return _pair(records, s.imagenet_durations, "plain-bf16", "mild", "eval/accuracy", target,
                 "the baseline's last eval/accuracy - 0.01")


def _fit(task: str, arm: str, data: Path, sizes: str, s: Settings, device: str, work: Path, compiled: bool = False,
         **request):
    """One arm through the measuring core's ``fit`` (set-up time recorded apart), as the benchmark runs it;
    ``compiled``: with ``gpu_throughput.compiled_methods``."""
    from speedkit.experiments.measure import MEASURED_RUN, fit
    from speedkit.tasks.request import RunRequest

    options = {**({"precision": s.precision} if s.precision else {}), **request}
    if compiled:
        options["methods"] = compiled_methods(task, arm, data, sizes)
    return fit(RunRequest.build(task, arm, data=str(data), task_options={"sizes": sizes}, device=device,
                                num_workers=s.workers, run_dir=work / "runs", run_name=f"{task}-{arm}",
                                **MEASURED_RUN, **options))


def _last(record, metric: str) -> float:
    values = [row[metric] for row in record.evals if row.get(metric) is not None]
    if not values:
        raise RuntimeError(f"{record.config.get('run_name', 'the baseline')} logged no {metric}")
    return values[-1]


def _pair(records: dict, budgets: dict, baseline: str, recipe: str, metric: str, target: float, rule: str) -> dict:
    from speedkit.experiments.measure import Measurement

    times = {arm: [record.time_to(metric, target)] for arm, record in records.items()}
    measured = Measurement.read_back(times, {arm: [_last(r, metric)] for arm, r in records.items()}, [baseline])
    ratio = measured.ratios(recipe)[0]
    arms = {arm: {"time_to_target_s": times[arm][0], "final": _last(record, metric), "status": record.status,
                  "train_s": record.timings.get("train_s"), "eval_s": record.timings.get("eval_s"),
                  "setup_s": record.timings.get("setup_s"), "compile_s": record.timings.get("compile_s"),
                  "budget": budgets[arm], "model": record.config.get("model"),
                  "methods": sorted(record.method_names)}
            for arm, record in records.items()}
    apart = less_compile({arm: {"time_to_target_s": [a["time_to_target_s"]], "compile_s": [a["compile_s"]]}
                          for arm, a in arms.items()}, baseline, recipe)
    return {"ok": all(r.status == "completed" for r in records.values()), "metric": metric, "target": target,
            "rule": rule, "arms": arms, "speedup": ratio, "speedup_less_compile": apart["speedup_less_compile_median"],
            "time_to_target_less_compile_s": apart["time_to_target_less_compile_s"],
            "headline": f"{recipe} against {baseline} to {metric} {target:.4g}: "
                        f"{'not reached' if ratio is None else f'{ratio:.2f}x'} "
                        f"({_rounded(apart['speedup_less_compile_median'])}x less the first batch's compile)"}
