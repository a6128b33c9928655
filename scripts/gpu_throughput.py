"""The throughput check (``scripts/gpu_check.sh throughput``; at most about 5 minutes of a lent GPU).

Its parts, top to bottom, each writing ``throughput.json`` as it finishes (``scripts/gpu_check.py`` runs them):

1. ``peak``: the measured dense matmul rate, what every ``fraction_of_peak`` divides by.
2. ``data``: made on the device machine: textured JPEGs of varied sizes (random smooth noise, stripes and grain,
   encoded with ``torchvision.io.encode_jpeg``) in an ImageNet-layout folder, prepared into shards; and a token
   corpus from text the machine has (its Python's standard library and /usr/share/doc), with a BPE trained there
   to GPT-2's vocabulary size (50,257; speedkit's GPT pads its head to 50,304 rows itself).
3. ``vision-compiled``, ``language-compiled`` (and last, ``vision-eager``, ``language-eager``): a bare torch loop
   against speedkit's Trainer on the same model, batch (already on the device: the model-only rate) and fused
   optimizer, for ResNet-50 at 176 and 224 px and GPT-2 124M; compiled runs report their compile time apart and
   the frames TorchDynamo compiled, and the bare ResNet-50 says what a new input shape costs (176 -> 224).
4. ``preset NAME``: each seed preset (tasks ``imagenet`` and ``gpt2``, ``gpu`` sizes) through ``make_trainer`` on
   the generated data, end to end: throughput, fraction of the peak, the host's share of time waiting for data.
   Each stops after its timed steps and two more profiled with torch.profiler (the kernels a step launches, as
   the preset runs, compiled), so a preset runs its own schedule (progressive resizing keeps its first size, as it
   would for the first fifth of a real run), not one squeezed into a few dozen steps. A preset whose profiled
   step launched more than 1.3x its task baseline's kernels is marked ``unmet`` once both have run. The tiny
   rehearsal's presets (``cpu`` sizes) compile too, with its backend, so their graph breaks are counted before a
   GPU's are.
5. ``loader``: the imagenet task's streaming loader alone (CPU workers), and JPEG decode on the GPU
   (``torchvision.io.decode_jpeg`` on the device, batched) where there is one.
6. ``counts``: each seed preset again for a few steps with a ``SyncCounter`` (host syncs, blocking host-to-device
   copies, the aten ops of each quiet step and the kernel launches among them, eager: torch.compile does not
   compile under the counter's dispatch mode; each preset's ops over its baseline's are reported, not judged) and,
   on CUDA, torch's sync debug mode: counted apart, never in a timed run.
7. ``muon``: a Muon step over the hidden matrices of ResNet-8, ResNet-50 and GPT-2 124M, its matrices batched as
   planned for the device (small ones of different shapes padded to one) against one batch per shape and against
   one batch for all: whether the plan's constant (``DISPATCHES_WORTH_FLOPS``) holds on the device; and as planned
   with the update compiled, as ``torch_compile`` runs it in a preset, against the same plan eager.

The order is what the goals need first, so a time budget that runs out leaves out the least (``gpu_check.py
next`` runs what it left out at the next lease on the same code).
Every timed run records what was attached to torch while it was timed (``nothing_attached``: no dispatch mode,
no torch-function mode, no profiler), and is timed with CUDA events after warm-up (on a CPU, perf_counter).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import shutil
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import speedkit.optim.muon as muon
from gpu_check import StepClock, dynamo_counts, fresh_dynamo
from speedkit.core.engine import Callback

# the pairs the goals compare first (mild against plain-bf16, hot against baseline), then the others
SEED_PRESETS = ("imagenet:plain-bf16", "imagenet:mild", "gpt2:baseline", "gpt2:hot", "imagenet:baseline",
                "imagenet:medium", "imagenet:hot", "gpt2:composer")


@dataclasses.dataclass(frozen=True)
class Settings:
    budget_s: float  # the parts still to run are skipped, with the reason, once this is spent
    images: int  # training JPEGs (validation: a twentieth more)
    classes: int
    image_sides: tuple[int, int]  # each side of a JPEG drawn from this range
    short_side: int  # what the shards store
    corpus_bytes: int
    vocab: int
    context: int
    vision_model: str
    language_model: str
    vision_batch: int
    language_batch: int  # sequences of `context` tokens
    sizes: tuple[int, int]  # ResNet's two image sizes
    warmup: int  # steps before the timed ones (after the compile)
    steps: int  # timed steps
    compile_backend: str
    precision: str
    task_sizes: str  # the seed tasks' sizes (cpu, gpu) the presets run at
    presets: tuple[str, ...]
    workers: int
    loader_batches: int
    peak_size: int
    count_steps: int
    profiled_steps: int  # after a preset's timed steps, the steps whose kernels are counted
    muon_models: tuple[str, ...]  # whose hidden matrices the muon part steps Muon over


FULL = Settings(budget_s=285, images=12_000, classes=100, image_sides=(160, 500), short_side=256,
                corpus_bytes=12_000_000, vocab=50_257, context=1024, vision_model="resnet50",
                language_model="gpt2-124m", vision_batch=256, language_batch=32, sizes=(176, 224), warmup=5,
                steps=20, compile_backend="inductor", precision="bf16", task_sizes="gpu", presets=SEED_PRESETS,
                workers=min(12, os.cpu_count() or 1), loader_batches=20, peak_size=8192, count_steps=8,
                profiled_steps=2, muon_models=("resnet8", "resnet50", "gpt2-124m"))
# A CPU's tiny rehearsal of every part (tests/cli/test_gpu_check.py). Inductor's C++ code generation takes minutes
# on 2 cores, so tiny compiled runs use the "eager" backend: TorchDynamo still captures the frames (counted), only
# the code generation is left to the GPU run. Its vocabulary is not a multiple of 64, so the GPT's head is padded,
# as at GPT-2's 50,257.
TINY = Settings(budget_s=600, images=24, classes=3, image_sides=(40, 96), short_side=48, corpus_bytes=150_000,
                vocab=360, context=64, vision_model="resnet18", language_model="gpt-nano", vision_batch=4,
                language_batch=2, sizes=(32, 40), warmup=2, steps=3, compile_backend="eager", precision="fp32",
                task_sizes="cpu", presets=("imagenet:hot", "gpt2:hot"), workers=0, loader_batches=3,
                peak_size=256, count_steps=6, profiled_steps=2,
                muon_models=("resnet8", "gpt-nano"))  # not the ResNet-18: seconds a Muon step on a CPU


def settings(tiny: bool) -> Settings:
    return TINY if tiny else FULL


def run(results, s: Settings, device: str, only: set | None = None) -> None:
    """The parts in order of what the goals need first (the compiled loops, then the presets the goals pair), so a
    budget that runs out leaves out the least; ``only``: those parts (and the peak and data they need)."""
    work = Path(os.environ.get("SPEEDKIT_GPU_CHECK_WORK", "/tmp/speedkit-gpu-check")) / "throughput"
    os.environ.setdefault("SPEEDKIT_SHARDS", str(work / "shard-cache"))

    def wanted(name: str) -> bool:
        return only is None or name in only or name.split(" ")[0] in only

    def part(name, fn, needs_s=0.0):
        return results.part(name, fn, needs_s) if wanted(name) else None

    presets = [f"preset {preset}" for preset in s.presets]
    results.plan([name for name in ("peak", "data", "vision-compiled", "language-compiled", *presets, "vision-eager",
                                    "language-eager", "loader", "counts", "muon")
                  if name in ("peak", "data") or wanted(name)])
    needs_data = only is None or any(n.split(" ")[0] in ("loader", "preset", "counts") for n in only)
    peak = results.part("peak", lambda: measure_peak(device, s), 10) or {}
    if not needs_data:
        results.skip("data", "no part of this run needs it")
    data = (results.part("data", lambda: make_data(work, device, s), 60) if needs_data else None) or {}
    flops_peak = peak.get("flops_per_s")
    with compile_backend(s.compile_backend):
        for kind in ("vision", "language"):
            part(f"{kind}-compiled", lambda: bare_against_trainer(kind, True, s, device, work, flops_peak),
                 150 if kind == "vision" else 80)  # a cold Inductor compile (and the ResNet's second size)
        for preset in s.presets:
            task = preset.split(":")[0]
            if data.get(task):
                part(f"preset {preset}", lambda: preset_throughput(preset, data, s, device, work, flops_peak), 45)
            elif wanted(f"preset {preset}"):
                results.skip(f"preset {preset}", f"no {task} data (the data part did not run or failed)",
                             retry=True)
        for name, unmet in unmet_in_kernels(results.data["parts"]).items():
            results.add_unmet(name, unmet)
        for kind in ("vision", "language"):
            part(f"{kind}-eager", lambda: bare_against_trainer(kind, False, s, device, work, flops_peak), 25)
        if data:
            part("loader", lambda: loader_alone(data, s, device), 20)
            part("counts", lambda: count_all(data, s, device, work), 60)
        part("muon", lambda: muon_batches(s, device), 40)  # three compiles of the update


@contextlib.contextmanager
def compile_backend(backend: str):
    """``torch.compile`` and ``nn.Module.compile`` with ``backend`` inside (the Trainer's TorchCompile and GPT's
    compiled loss call them); inductor, torch's default, needs no change."""
    if backend == "inductor":
        yield
        return
    saved = torch.compile, torch.nn.Module.compile
    torch.compile = functools.partial(torch.compile, backend=backend)
    torch.nn.Module.compile = functools.partialmethod(torch.nn.Module.compile, backend=backend)
    try:
        yield
    finally:
        torch.compile, torch.nn.Module.compile = saved


# -- 1. peak ----------------------------------------------------------------------------------------------

def measure_peak(device: str, s: Settings) -> dict:
    from speedkit.callbacks import matmul_peak_flops

    dtype = torch.bfloat16 if s.precision == "bf16" else torch.float32
    flops = matmul_peak_flops(torch.device(device).type, dtype, size=s.peak_size)
    return {"ok": True, "flops_per_s": flops, "dtype": str(dtype), "matmul": f"{s.peak_size}^3, random data",
            "headline": f"{flops / 1e12:,.1f} TFLOP/s measured ({dtype}, {s.peak_size}^3 matmul)"}


# -- 2. data ----------------------------------------------------------------------------------------------

def textured_image(height: int, width: int, label: int, classes: int, generator, device) -> torch.Tensor:
    """A uint8 [3, H, W] image: smooth colour noise, stripes whose frequency and angle follow the class, and
    grain (so it compresses like a photograph, not like a flat colour)."""
    noise = torch.rand(1, 3, height // 24 + 2, width // 24 + 2, generator=generator, device=device)
    smooth = F.interpolate(noise, size=(height, width), mode="bicubic", align_corners=False)[0]
    y = torch.linspace(0, 1, height, device=device)[:, None]
    x = torch.linspace(0, 1, width, device=device)[None, :]
    angle, frequency = math.pi * label / classes, 3 + 20 * label / classes
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * frequency * (x * math.cos(angle) + y * math.sin(angle)))
    grain = torch.rand(3, height, width, generator=generator, device=device)
    return ((0.6 * smooth + 0.3 * stripes + 0.1 * grain).clamp(0, 1) * 255).to(torch.uint8)


def write_jpegs(folder: Path, count: int, classes: int, sides: tuple[int, int], device, seed: int) -> int:
    """``count`` textured JPEGs of varied sizes in ``folder/<class>/``, made and encoded on ``device`` in
    batches; returns the bytes written."""
    from torchvision.io import encode_jpeg

    rng, written = random.Random(seed), 0
    generator = torch.Generator(device=device).manual_seed(seed)
    for label in range(classes):
        (folder / f"n{label:08d}").mkdir(parents=True, exist_ok=True)
    for start in range(0, count, 64):
        labels = [i % classes for i in range(start, min(count, start + 64))]
        images = [textured_image(rng.randint(*sides), rng.randint(*sides), label, classes, generator, device)
                  for label in labels]
        for i, (label, encoded) in enumerate(zip(labels, encode_jpeg(images, quality=90))):
            data = encoded.cpu().numpy().tobytes()
            (folder / f"n{label:08d}" / f"{start + i}.JPEG").write_bytes(data)
            written += len(data)
    return written


def device_text(folder: Path, limit: int) -> int:
    """Text this machine has (its Python's standard library, /usr/share/doc) copied into ``folder`` as .txt files,
    up to ``limit`` bytes; returns the bytes copied."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for base in (Path(os.__file__).parent, Path("/usr/share/doc")):
        for path in sorted(base.rglob("*")):
            if path.suffix not in (".py", ".txt", ".rst", ".md") or "site-packages" in path.parts:
                continue
            try:
                text = path.read_bytes()
            except OSError:
                continue
            if not text or b"\0" in text[:4096]:
                continue
            (folder / f"{total:012d}.txt").write_bytes(text)
            total += len(text)
            if total >= limit:
                return total
    return total


def make_data(work: Path, device: str, s: Settings) -> dict:
    """The generated ImageNet-layout folder and its shards, and the token shards of the machine's own text; those
    an earlier run on this machine made to the same settings where it finished them (a rerun on a warm machine
    would otherwise write new JPEGs over the ones its shards were prepared from, which the prepare refuses)."""
    from speedkit.data.streaming.prepare import prepare_images, prepare_text
    from speedkit.data.streaming.shards import read_shards

    made, wanted = work / "data.json", {name: getattr(s, name) for name in _DATA_SETTINGS}
    if made.is_file():
        earlier = json.loads(made.read_text())
        if earlier.pop("settings", None) == json.loads(json.dumps(wanted)):
            return {**earlier, "reused": True, "headline": "reused this machine's: " + earlier["headline"]}
    made.unlink(missing_ok=True)
    for folder in ("images", "image-shards", "text", "token-shards"):  # a run stopped while making them
        shutil.rmtree(work / folder, ignore_errors=True)
    workers = os.cpu_count() or 1
    started = time.perf_counter()
    folder = work / "images"
    jpeg_bytes = write_jpegs(folder / "train", s.images, s.classes, s.image_sides, device, seed=0)
    jpeg_bytes += write_jpegs(folder / "val", max(s.classes, s.images // 20), s.classes, s.image_sides, device, 1)
    made_s = time.perf_counter() - started
    prepare_images(folder, work / "image-shards", short_side=s.short_side, workers=workers, progress=False)
    images_s = time.perf_counter() - started
    text_bytes = device_text(work / "text", s.corpus_bytes)
    prepare_text(work / "text", work / "token-shards", vocab_size=s.vocab, block=s.context, workers=workers,
                 progress=False)
    tokens = read_shards(work / "token-shards").manifest
    data = {"ok": True, "images": str(work / "image-shards"), "image_folder": str(folder),
            "imagenet": str(work / "image-shards"), "gpt2": str(work / "token-shards"),
            "jpegs": s.images, "jpeg_mib": round(jpeg_bytes / 2 ** 20, 1), "jpegs_made_s": round(made_s, 1),
            "shards_s": round(images_s - made_s, 1), "text_mib": round(text_bytes / 2 ** 20, 1),
            "vocab_size": int(tokens["vocab_size"]), "tokens": tokens.get("tokens"),
            "tokens_s": round(time.perf_counter() - started - images_s, 1),
            "headline": f"{s.images:,} JPEGs ({jpeg_bytes / 2 ** 20:,.0f} MiB) in {made_s:.0f} s; "
                        f"{text_bytes / 2 ** 20:.0f} MiB of text, BPE vocabulary {tokens['vocab_size']}"}
    made.write_text(json.dumps({**data, "settings": wanted}))
    return data


# What the generated data depends on: data made to other settings is made again.
_DATA_SETTINGS = ("images", "classes", "image_sides", "short_side", "corpus_bytes", "vocab", "context")


# -- 3. a bare loop against the Trainer --------------------------------------------------------------------

class SameBatch:
    """``steps`` batches, each the one batch already on the device (the model-only rate: no loader)."""

    def __init__(self, batch, steps: int):
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return (self.batch for _ in range(self.steps))


def make_model(kind: str, s: Settings, device: str) -> torch.nn.Module:
    """torchvision's ResNet (channels_last, as a GPU engineer lays it out) or speedkit's GPT at GPT-2's sizes."""
    import torchvision

    from speedkit.models import get_model

    if kind == "vision":
        model = getattr(torchvision.models, s.vision_model)(num_classes=1000)
        return model.to(device, memory_format=torch.channels_last)
    return get_model(s.language_model, vocab_size=s.vocab, block_size=s.context).to(device)


def make_batch(kind: str, s: Settings, device: str, size: int) -> tuple:
    """One batch on the device: images of ``size`` px, or windows of ``size`` tokens."""
    if kind == "vision":
        images = torch.randn(s.vision_batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
        return images, torch.randint(0, 1000, (s.vision_batch,), device=device)
    tokens = torch.randint(0, s.vocab, (s.language_batch, size + 1), device=device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_optimizer(kind: str, model: torch.nn.Module, device: str) -> torch.optim.Optimizer:
    """SGD for the ResNet, AdamW for the GPT, fused on CUDA (one kernel for the whole update), else foreach."""
    kernels = {"fused": True} if torch.device(device).type == "cuda" else {"foreach": True}
    if kind == "vision":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **kernels)
    return torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **kernels)


def flops_per_sample(model, inputs) -> float | None:
    from speedkit.callbacks import count_training_flops_per_sample

    try:
        return count_training_flops_per_sample(model, inputs[:2])
    except Exception:  # noqa: BLE001 -- a model the counter cannot run gets no fraction of peak, not a failure
        return None


def rates(timed: dict, batch, flops: float | None, peak: float | None) -> dict:
    samples = batch[0].shape[0]
    out = {"samples_per_s": samples / timed["step_s"]}
    if batch[0].dim() == 2:
        out["tokens_per_s"] = samples * batch[0].shape[1] / timed["step_s"]
    if flops and peak:
        out["fraction_of_peak"] = flops * out["samples_per_s"] / peak
    return out


def bare_loop(model, batch, optimizer, s: Settings, device: str) -> dict:
    """The loop a GPU engineer writes: autocast, forward, the model's loss, backward, step; timed after warm-up."""
    from speedkit.train.parts import make_loss

    loss_fn = make_loss(model, None)  # the model's own loss where it has one: the same the Trainer computes
    clock = StepClock(device, s.warmup)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=s.precision == "bf16")
    first = None
    for step in range(s.warmup + s.steps):
        started = time.perf_counter()
        with autocast:
            loss = loss_fn(model(batch[0]), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0:
            _synchronize(device)
            first = time.perf_counter() - started
        clock.tick()
    return {**clock.result(), "first_step_s": first}


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class TimedSteps(Callback):
    """Ticks a ``StepClock`` after each of the first ``last`` steps (None: every step), and notes the host's time
    waiting for batches and the inputs' shape in the timed steps."""

    def __init__(self, clock: StepClock, last: int | None = None):
        self.clock, self.last = clock, last
        self.waited, self.asked, self.window, self.inputs = 0.0, None, [], None

    def _timing(self, state) -> bool:  # whether the step under way is one of the timed
        return self.last is None or state.timestamp.batch < self.last

    def before_dataloader(self, state, logger):
        self.asked = time.perf_counter()

    def after_dataloader(self, state, logger):
        if self.clock.marks and self._timing(state):  # a timed step's wait
            self.waited += time.perf_counter() - self.asked

    def before_forward(self, state, logger):
        from speedkit.core.batch import batch_inputs

        if self._timing(state):
            self.inputs = batch_inputs(state.batch)

    def batch_end(self, state, logger):
        if self.last is not None and state.timestamp.batch > self.last:
            return
        self.clock.tick()
        if self.clock.marks:
            self.window = [self.window[0] if self.window else time.perf_counter(), time.perf_counter()]

    def data_wait_share(self) -> float | None:
        if len(self.window) < 2 or self.window[1] <= self.window[0]:
            return None
        return round(self.waited / (self.window[1] - self.window[0]), 4)


def trainer_run(model, batch, optimizer, kind: str, compiled: bool, s: Settings, device: str, work: Path) -> dict:
    """The same model (a ResNet already channels_last), batch and optimizer through speedkit's Trainer, with its
    TorchCompile where compiled."""
    from speedkit.methods import TorchCompile
    from speedkit.train.trainer import Trainer

    steps = s.warmup + s.steps
    clock = StepClock(device, s.warmup)
    methods = [TorchCompile()] if compiled else []
    trainer = Trainer(model, SameBatch(batch, steps), max_duration=f"{steps}ba", optimizers=optimizer,
                      methods=methods, callbacks=[TimedSteps(clock)], precision=s.precision, device=device,
                      log_interval=steps, run_dir=work / "runs", run_name=f"trainer-{kind}-{compiled}",
                      save_checkpoints=False, progress_bar=False, overwrite=True)
    record = trainer.fit()
    return {**clock.result(), "status": record.status, "compile_s": record.timings.get("compile_s")}


def bare_against_trainer(kind: str, compiled: bool, s: Settings, device: str, work: Path, peak: float | None) -> dict:
    """For each size (ResNet: 176 and 224 px; GPT-2: its context), the bare loop, then the Trainer on a model of its
    own; compiled, the bare model keeps its compiled code from one size to the next, so the second size's first
    step is what a new input shape costs."""
    torch.backends.cudnn.benchmark = True  # what a GPU engineer sets for fixed shapes; recorded per run
    sizes = s.sizes if kind == "vision" else (s.context,)
    out = {"compile_backend": s.compile_backend if compiled else None, "sizes": {}}
    fresh_dynamo()
    bare_model = make_model(kind, s, device)
    if kind == "language":  # the tokens' vocabulary, and the head's rows the model pads it to
        out["vocab"] = {"vocab_size": bare_model.config.vocab_size, "head_rows": bare_model.lm_head.out_features}
    flops = {size: flops_per_sample(bare_model, make_batch(kind, s, device, size)[0]) for size in sizes}
    if compiled:
        bare_model.compile(dynamic=False)
    for size in sizes:
        batch = make_batch(kind, s, device, size)
        optimizer = make_optimizer(kind, bare_model, device)
        before = dynamo_counts()
        _reset_memory(device)
        bare = bare_loop(bare_model, batch, optimizer, s, device)
        bare.update(rates(bare, batch, flops[size], peak), dynamo=_delta(before, dynamo_counts()),
                    peak_memory_gib=_peak_memory(device))
        if compiled:
            bare["compile_s"] = bare["first_step_s"] - bare["step_s"]
        del optimizer
        model = make_model(kind, s, device)  # the Trainer's own (compiled: its own compile, cached by the bare's)
        before = dynamo_counts()
        _reset_memory(device)
        trainer = trainer_run(model, batch, make_optimizer(kind, model, device), kind, compiled, s, device, work)
        trainer.update(rates(trainer, batch, flops[size], peak), dynamo=_delta(before, dynamo_counts()),
                       peak_memory_gib=_peak_memory(device), of_bare=bare["step_s"] / trainer["step_s"])
        del model
        out["sizes"][size] = {"bare": bare, "trainer": trainer, "flops_per_sample": flops[size],
                              "cudnn_benchmark": torch.backends.cudnn.benchmark}
    if len(sizes) > 1:
        second = out["sizes"][sizes[1]]["bare"]
        out["new_shape"] = {"from": sizes[0], "to": sizes[1], "first_step_s": second["first_step_s"],
                            "cost_s": second["first_step_s"] - second["step_s"],
                            "recompiled_graphs": second["dynamo"]["unique_graphs"] if compiled else None}
    runs = [r for size in out["sizes"].values() for r in (size["bare"], size["trainer"])]
    out["ok"] = all(r["nothing_attached"] for r in runs) and (not compiled or all(r["dynamo"]["frames"] > 0
                                                                                 for r in runs))
    first = out["sizes"][sizes[0]]
    unit = "tokens_per_s" if kind == "language" else "samples_per_s"
    out["headline"] = (f"at {sizes[0]}: bare {first['bare'][unit]:,.0f}/s, Trainer {first['trainer'][unit]:,.0f}/s "
                       f"({first['trainer']['of_bare']:.3f} of bare); fraction of peak "
                       f"{first['bare'].get('fraction_of_peak', float('nan')):.3f}"
                       + (f"; new shape {out['new_shape']['cost_s']:.1f} s" if "new_shape" in out else ""))
    return out


def _delta(before: dict, after: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


def _reset_memory(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_memory(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if torch.device(device).type == "cuda" else None


# -- 4. each seed preset end to end -----------------------------------------------------------------------

def compiled_methods(task: str, recipe: str, data, sizes: str) -> dict:
    """The methods of ``task``'s ``recipe`` at ``sizes`` with ``torch_compile`` among them, as the seed tasks' ``gpu``
    sizes have it: the tiny rehearsals' runs (``cpu`` sizes) compile too, with their backend."""
    from speedkit.tasks import find_task

    return {"torch_compile": {}, **find_task(task, data, sizes=sizes).recipes[recipe].methods}


def preset_trainer(preset: str, data: dict, s: Settings, device: str, work: Path, callbacks: list, run_name: str,
                   log_interval: int = 10_000, compiled: bool = False):
    """The Trainer of ``preset`` on the check's data; ``compiled``: with ``compiled_methods``."""
    from speedkit.tasks import make_trainer

    task, name = preset.split(":")
    batch = s.vision_batch if task == "imagenet" else s.language_batch
    methods = compiled_methods(task, name, data[task], s.task_sizes) if compiled else None
    trainer = make_trainer(task, name, data=data[task], task_options={"sizes": s.task_sizes}, device=device,
                           batch_size=batch, num_workers=s.workers, log_interval=log_interval, run_dir=work / "runs",
                           run_name=run_name, save_checkpoints=False, progress_bar=False, overwrite=True,
                           callbacks=callbacks, methods=methods,
                           **({"precision": "fp32"} if s.precision == "fp32" else {}))
    # These runs measure training steps. A stopped run evaluates its final weights, and compiled, that is an
    # evaluation graph compiled for each preset (tens of seconds of the lease) that no part reports.
    trainer.state.evaluators = []
    return trainer


class StopAfter(Callback):
    def __init__(self, steps: int):
        self.steps = steps

    def batch_end(self, state, logger):
        if state.timestamp.batch >= self.steps:
            state.request_stop("the check's steps are done")


class ProfiledSteps(Callback):
    """Profiles ``steps`` steps from step ``first`` on (after the timed ones, never during them) with torch.profiler,
    from loading each batch to its optimizer step: the kernels a step launches as the preset runs (compiled where
    its recipe compiles), which the counts part cannot see (its dispatch mode keeps torch.compile off)."""

    def __init__(self, first: int, steps: int, device: str):
        self.first, self.steps, self.cuda = first, steps, torch.device(device).type == "cuda"
        self.profiler, self.counts = None, None

    def before_dataloader(self, state, logger):
        if state.timestamp.batch + 1 == self.first and self.profiler is None and self.counts is None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            try:
                self.profiler = profile(activities=activities)
                self.profiler.__enter__()
            except Exception as error:  # noqa: BLE001 -- a profiler that cannot start must not lose the timing
                self.profiler, self.counts = None, {"error": f"{type(error).__name__}: {error}"[:300]}

    def batch_end(self, state, logger):
        if self.profiler is not None and state.timestamp.batch >= self.first + self.steps - 1:
            self._finish(state.timestamp.batch - self.first + 1)

    def fit_end(self, state, logger):
        if self.profiler is not None:  # the run ended before its profiled steps did
            self._finish(max(1, state.timestamp.batch - self.first + 1))

    def stop(self) -> None:
        """Turns off a profiler that a run left on by failing inside its profiled steps (no ``fit_end`` comes then),
        so that it does not go on profiling, and slowing, every part after it."""
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.__exit__(None, None, None)

    def _finish(self, steps: int) -> None:
        _synchronize("cuda" if self.cuda else "cpu")
        profiler, self.profiler = self.profiler, None
        try:
            profiler.__exit__(None, None, None)
            self.counts = kernels_per_step(profiler.events(), steps, self.cuda)
        except Exception as error:  # noqa: BLE001 -- as above
            self.counts = {"error": f"{type(error).__name__}: {error}"[:300]}


# The CUDA runtime's and driver's kernel launches, as the profiler names them on the host.
_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def kernels_per_step(events, steps: int, cuda: bool) -> dict:
    """What a profiled step launched: on CUDA, the kernels the device ran and its copies and fills, and the launch
    calls the host made (a CUDA graph's launch counts once); on a CPU, the tiny rehearsal's stand-in, the kernels
    a GPU would launch for the same ops (``profiled_kernels``: inductor's where the step is compiled, a multi-tensor
    op once), counting, without loader workers, the loader's too."""
    from torch.autograd import DeviceType

    from speedkit.callbacks.sync_counter import profiled_kernels

    if cuda:
        device = [e for e in events if e.device_type == DeviceType.CUDA]
        if not device:
            return {"error": "the profiler saw no device activity (CUPTI unavailable?)"}
        copies = sum(e.name.startswith(("Memcpy", "Memset")) for e in device)
        return {"device_kernels": round((len(device) - copies) / steps, 1),
                "device_copies_and_fills": round(copies / steps, 1),
                "host_launches": round(sum(e.name in _LAUNCHES for e in events) / steps, 1)}
    return {"kernels": round(sum(profiled_kernels(events).values()) / steps, 1)}


def preset_throughput(preset: str, data: dict, s: Settings, device: str, work: Path, peak: float | None) -> dict:
    """One seed preset through make_trainer on the generated data, stopped after its timed steps and a few
    profiled ones."""
    timed = s.warmup + s.steps
    clock = StepClock(device, s.warmup)
    timed_steps = TimedSteps(clock, last=timed)
    profiled = ProfiledSteps(timed + 1, s.profiled_steps, device)
    fresh_dynamo()
    trainer = preset_trainer(preset, data, s, device, work, [timed_steps, profiled,
                                                             StopAfter(timed + s.profiled_steps)],
                             preset.replace(":", "-"), compiled=True)
    _reset_memory(device)
    try:
        record = trainer.fit()
    finally:
        profiled.stop()
    timing = clock.result()
    inputs = timed_steps.inputs
    per_step = {"samples_per_s": inputs.shape[0] / timing["step_s"]}
    if preset.startswith("gpt2"):
        per_step["tokens_per_s"] = inputs.shape[0] * inputs.shape[1] / timing["step_s"]
    flops = flops_per_sample(trainer.state.model, inputs)
    fraction = flops * per_step["samples_per_s"] / peak if flops and peak else None
    unit = "tokens_per_s" if preset.startswith("gpt2") else "samples_per_s"
    kernels, dynamo = profiled.counts or {}, dynamo_counts()
    unmet = [f"{dynamo['graph_breaks']} graph breaks (none allowed)"] if dynamo["graph_breaks"] else []
    return {"ok": timing["nothing_attached"], "unmet": unmet, "status": record.status,
            "evaluations": len(record.evals), **timing, **per_step,
            "input_shape": list(inputs.shape), "flops_per_sample": flops, "fraction_of_peak": fraction,
            "data_wait_share": timed_steps.data_wait_share(), "peak_memory_gib": _peak_memory(device),
            "compile_s": record.timings.get("compile_s"), "dynamo": dynamo,
            "methods": sorted(record.method_names), "kernels_per_step": kernels,
            "headline": f"{per_step[unit]:,.0f} {unit.replace('_per_s', '')}/s, fraction of peak "
                        f"{fraction if fraction is not None else float('nan'):.3f}, data wait "
                        f"{timed_steps.data_wait_share()}, kernels a step {kernels}"}


# -- 5. the loader alone --------------------------------------------------------------------------------------

def loader_alone(data: dict, s: Settings, device: str) -> dict:
    """The imagenet task's training loader on its own: decoding and cropping in its CPU workers (built for the
    CPU, so the library's own choice of decoding on a CUDA device does not take over), then as the task builds it
    for ``device`` (on CUDA: the workers read bytes and the GPU decodes them), and torchvision's batched JPEG decode
    on the GPU from the same files' bytes in memory, the decoder's own rate."""
    cpu = task_loader(data, s, "cpu")
    on_device = task_loader(data, s, device) if torch.device(device).type == "cuda" else {
        "skipped": "no GPU: the task's loader decodes in its CPU workers here, timed above"}
    gpu = gpu_decode(Path(data["image_folder"]) / "train", s, device)
    headline = f"CPU workers ({s.workers}): {cpu['images_per_s']:,.0f} images/s; " + (
        f"the task's loader on {device} (decode_on_device={on_device['decode_on_device']}): "
        f"{on_device['images_per_s']:,.0f} images/s; " if "images_per_s" in on_device else "") + (
        f"GPU decode alone: {gpu['images_per_s']:,.0f} images/s" if "images_per_s" in gpu else gpu["skipped"])
    return {"ok": True, "cpu_workers": cpu, "task_loader_on_device": on_device, "gpu_decode": gpu,
            "headline": headline}


def task_loader(data: dict, s: Settings, device: str) -> dict:
    """Images a second from the imagenet task's training loader built for ``device``, after its workers start."""
    from speedkit.tasks import find_task
    from speedkit.tasks.task import DataRequest

    task = find_task("imagenet", data["imagenet"], sizes=s.task_sizes)
    recipe = task.recipes["plain-bf16"]
    loader = task.train_data(DataRequest(batch_size=s.vision_batch, device=torch.device(device), recipe=recipe,
                                         num_workers=s.workers))
    batches = iter(loader)
    next(batches)  # the workers start
    _synchronize(device)
    started, count = time.perf_counter(), 0
    for _ in range(s.loader_batches):
        images = next(batches)[0]
        count += images.shape[0]
    _synchronize(device)
    return {"images_per_s": count / (time.perf_counter() - started), "workers": s.workers,
            "batch": s.vision_batch, "image_size": int(images.shape[-1]), "loader": type(loader).__name__,
            "persistent_workers": getattr(loader, "persistent_workers", None), "dtype": str(images.dtype),
            "decode_on_device": getattr(loader, "decode_on_device", False)}


def gpu_decode(folder: Path, s: Settings, device: str) -> dict:
    """``decode_batches`` on the GPU; on a CPU, why not."""
    if torch.device(device).type != "cuda":
        return {"skipped": "no GPU: torchvision.io.decode_jpeg decodes on CUDA devices only"}
    return decode_batches(folder, s, device)


def decode_batches(folder: Path, s: Settings, device: str) -> dict:
    """Batches of the JPEG files' bytes (read into memory first) decoded by ``torchvision.io.decode_jpeg`` on
    ``device`` and resized to the first training size, timed after one warm-up batch (tests run it on a CPU)."""
    from torchvision.io import decode_jpeg, read_file

    files = sorted(folder.rglob("*.JPEG"))[: s.vision_batch * (s.loader_batches + 1)]
    encoded = [read_file(str(path)) for path in files]
    chunks = [encoded[i:i + s.vision_batch] for i in range(0, len(encoded), s.vision_batch)]
    size = s.sizes[0]
    clock = StepClock(device, warmup=1)
    for chunk in chunks:
        decoded = decode_jpeg(chunk, device=device)
        batch = torch.stack([F.interpolate(image[None].float(), size=(size, size), mode="bilinear",
                                           antialias=True)[0] for image in decoded])
        clock.tick()
    timed = clock.result()
    return {"images_per_s": s.vision_batch / timed["step_s"], "image_size": size, "timer": timed["timer"],
            "what": f"decode_jpeg(device={device!r}) of a batch of files' bytes in memory, resized per image",
            "batch_shape": list(batch.shape)}


# -- 6. host syncs and blocking copies, counted apart ---------------------------------------------------------

def guarded(work) -> dict:
    """``work()``, or its error (one preset that cannot be counted must not lose the others' counts)."""
    try:
        return work()
    except Exception as error:  # noqa: BLE001 -- recorded in the part's results
        return {"error": f"{type(error).__name__}: {error}"[:1000]}


def count_all(data: dict, s: Settings, device: str, work: Path) -> dict:
    counted = {preset: guarded(lambda: count_syncs(preset, data, s, device, work)) for preset in s.presets}
    waits = ", ".join(f"{p} {c['waits_in_quiet_steps']}/{c['by_kind'].get('host_to_device', 0)}"
                      if "error" not in c else f"{p} failed" for p, c in counted.items())
    return {"ok": not any("error" in c for c in counted.values()), "presets": counted,
            "unmet": unmet_in_counts(counted), "eager_ops_against_baseline": eager_ops_against_baseline(counted),
            "headline": f"host waits in quiet steps / blocking host-to-device copies, whole run: {waits}"}


def unmet_in_counts(counted: dict) -> list[str]:
    """What the counted presets fall short of: a host wait or a blocking host-to-device copy in a quiet step."""
    return [f"{preset}: {counts['waits_in_quiet_steps']} host waits or blocking host-to-device copies in quiet steps "
            f"(none allowed)" for preset, counts in counted.items()
            if "error" not in counts and counts["waits_in_quiet_steps"]]


def eager_ops_against_baseline(counted: dict) -> dict[str, float]:
    """Each counted preset's aten ops a quiet step over its task baseline's (where that was counted too), as the
    counter sees them: eager, the host's dispatches. Reported, not judged: the gpu profiles compile every preset,
    so the step a GPU runs is the compiled one, which each preset part profiles (``unmet_in_kernels``)."""
    def ops(preset: str) -> float | None:
        steps = counted.get(preset, {}).get("quiet_step_ops")
        return statistics.median(steps.values()) if steps else None

    ratios = {}
    for preset in counted:
        baseline = ops(preset.split(":")[0] + ":baseline")
        if baseline and ops(preset):
            ratios[preset] = round(ops(preset) / baseline, 2)
    return ratios


KERNELS_BOUND = 1.3  # a preset's compiled step launches at most this times its task baseline's kernels (issue 54)


def step_launches(part: dict) -> float | None:
    """A preset part's kernels a compiled step: the host's launches on CUDA, the CPU profile's kernels on a CPU."""
    kernels = part.get("kernels_per_step") or {}
    return kernels.get("host_launches", kernels.get("kernels"))


def unmet_in_kernels(parts: dict) -> dict[str, list[str]]:
    """The preset parts whose compiled step launched more than ``KERNELS_BOUND`` times the kernels of their task
    baseline's part, where both were profiled in this run: a step of many small kernels leaves a GPU waiting on
    the host, however fast each kernel is."""
    found = {}
    for name, part in parts.items():
        if not name.startswith("preset "):
            continue
        task, _, recipe = name.removeprefix("preset ").partition(":")
        if recipe == "baseline":
            continue
        launches, baseline = step_launches(part), step_launches(parts.get(f"preset {task}:baseline", {}))
        if launches and baseline and launches > KERNELS_BOUND * baseline:
            found[name] = [f"{launches / baseline:.2f}x its baseline's kernels a compiled step "
                           f"(at most {KERNELS_BOUND}x)"]
    return found


def count_syncs(preset: str, data: dict, s: Settings, device: str, work: Path) -> dict:
    """A short run of ``preset`` with a SyncCounter (and on CUDA torch's sync debug mode, each synchronizing call a
    warning): its report, never a timed run's."""
    from speedkit.callbacks import SyncCounter

    counter, cuda = SyncCounter(), torch.device(device).type == "cuda"
    trainer = preset_trainer(preset, data, s, device, work, [counter, StopAfter(s.count_steps)],
                             preset.replace(":", "-") + "-counted", log_interval=max(1, s.count_steps // 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.fit()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    syncing = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]
    return {**counter.report(), "cuda_sync_warnings": len(syncing), "first_sync_warnings": syncing[:3],
            "quiet_step_ops": counter.quiet_step_ops(), "quiet_step_launches": counter.quiet_step_launches()}


def muon_batches(s: Settings, device: str) -> dict:
    """A Muon step (random gradients) over each model's hidden matrices, timed three ways: batched as planned for
    the device, one batch per shape (padding worth nothing), one padded batch for all (padding worth everything);
    and as planned with its update compiled, as ``torch_compile`` runs it in a preset (after a compile apart)."""
    import torchvision

    from speedkit.methods.muon import muon_parameter_names
    from speedkit.models import get_model

    models = {}
    for name in s.muon_models:
        if hasattr(torchvision.models, name):
            model = getattr(torchvision.models, name)(num_classes=1000)
        else:
            model = get_model(name, vocab_size=s.vocab) if name.startswith("gpt") else get_model(name)
        names = set(muon_parameter_names(model))
        models[name] = [tuple(p.shape) for n, p in model.named_parameters() if n in names]
    plans = {"planned": (None, False), "by_shape": ((0.0, 0.0), False), "one_batch": ((1e30, 0.0), False),
             "planned_compiled": (None, True)}  # ((worth_flops, pad share) or the device's own, compiled)
    timed = {name: {plan: muon_step(shapes, costs, s, device, compiled) for plan, (costs, compiled) in plans.items()}
             for name, shapes in models.items()}
    headline = "; ".join(f"{name}: planned {t['planned']['step_s'] * 1e3:.2f} ms ({t['planned']['batches']} batches), "
                         f"compiled {t['planned_compiled']['step_s'] * 1e3:.2f} ms, "
                         f"by shape {t['by_shape']['step_s'] * 1e3:.2f} ms ({t['by_shape']['batches']}), "
                         f"one batch {t['one_batch']['step_s'] * 1e3:.2f} ms" for name, t in timed.items())
    return {"ok": True, "models": timed, "dispatches_worth_flops": dict(muon.DISPATCHES_WORTH_FLOPS),
            "pad_share": dict(muon.PAD_SHARE),
            "headline": f"a Muon step: {headline}"}


def muon_step(shapes: list[tuple], costs: tuple[float, float] | None, s: Settings, device: str,
              compiled: bool = False) -> dict:
    """Seconds a Muon step over matrices of ``shapes``, planned with ``costs`` (what an iteration's dispatches are
    worth in arithmetic, and a padded matrix's share of them) in place of the device's own (None), and how many
    batched iterations that plan runs; ``compiled``: with its update compiled (``Muon.compile_update``), the
    compile in the warm-up steps and its graphs counted."""
    from unittest import mock

    params = [torch.nn.Parameter(torch.randn(shape, device=device)) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = muon.Muon(params, lr=0.02)
    if compiled:
        fresh_dynamo()
        optimizer.compile_update()
    key = muon.device_kind(torch.device(device))
    worth, pad_share = costs or muon.dispatch_costs(torch.device(device))
    with mock.patch.dict(muon.DISPATCHES_WORTH_FLOPS, {key: worth}), mock.patch.dict(muon.PAD_SHARE, {key: pad_share}):
        batches = sum(1 for _ in muon.iteration_batches([p.grad for p in params], 5))
        clock = StepClock(device, s.warmup)
        for _ in range(s.warmup + s.steps):
            optimizer.step()
            clock.tick()
        return {**clock.result(), "batches": batches, "matrices": len(shapes),
                **({"dynamo": dynamo_counts()} if compiled else {})}
