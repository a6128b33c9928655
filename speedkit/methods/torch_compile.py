"""torch.compile as a method: compile the model's forward at fit start.

TorchDynamo captures the forward as graphs and Inductor fuses their elementwise work into generated
kernels (Triton on GPU, C++/OpenMP on CPU). ``nn.Module.compile`` compiles in place, so the module,
its parameter names and its state-dict keys stay what they were (checkpoints and other methods are
unaffected). The first batch pays for the compilation (tens of seconds on a CPU); its wall time is
reported as ``record.timings["compile_s"]`` so benchmarks can report it apart. A graph is guarded on its
input's shape: speedkit's Trainer runs a partial last batch (an epoch's, an evaluation's) eager rather than
compile a graph for it (``speedkit.train.batches.PartialBatchesEager``); in a loop of your own it compiles one.

CUDA graphs come with ``mode="reduce-overhead"`` (and ``"max-autotune"``): the compiled step is recorded
once and replayed as one launch, which removes the per-kernel launch cost that dominates small models on a
GPU (the step must then not read the device: speedkit's loop does not between logging intervals). They
exist only on CUDA: on another device those modes compile without them (``"default"`` and
``"max-autotune-no-cudagraphs"``), and the run's log says so.

It acts at FIT_START, after every INIT surgery; a method that changes the model at FIT_START must
run before it (``runs_after``). Muon's update (``speedkit.optim.muon.Muon.compile_update``) is compiled too, where
``muon`` is on: eager, its multi-tensor ops, pads, casts and norms are a launch each (a matrix each off CUDA's
multi-tensor fast path) around the Newton-Schulz matmuls, compiled a few fused kernels.
"""
from __future__ import annotations

import time

import torch

from speedkit.core.devices import synchronize
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard
from speedkit.optim.muon import Muon

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


CUDA_GRAPH_MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def mode_for_device(mode: str, device: torch.device) -> tuple[str, str | None]:
    """The compile mode to use on ``device``, and a note when it differs from ``mode`` (CUDA graphs are CUDA's)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode in CUDA_GRAPH_MODES and device.type != "cuda":
        fallback = CUDA_GRAPH_MODES[mode]
        return fallback, (f"torch_compile: mode={mode!r} uses CUDA graphs, which exist only on CUDA; compiling with "
                          f"mode={fallback!r} on {device.type}")
    return mode, None


def compile_model(model: torch.nn.Module, mode: str = "default", dynamic: bool | None = None,
                  fullgraph: bool = False) -> torch.nn.Module:
    """Compile ``model``'s forward in place (``nn.Module.compile``) and return it."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    model.compile(mode=None if mode == "default" else mode, dynamic=dynamic, fullgraph=fullgraph)
    return model


class TorchCompile(Method):
    CARD = MethodCard(
        name="torch_compile",
        summary="Compile the model (and Muon's update) with torch.compile at fit start; the first batch's time is "
                "reported as compile_s.",
        domain="any",
        events=(Event.FIT_START, Event.BATCH_START, Event.BATCH_END),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("mode", str, "default", choices=MODES,
                   help="Inductor's optimisation level; reduce-overhead adds CUDA graphs (CUDA only)"),
            HParam("dynamic", object, None, choices=(None, True, False),
                   help="dynamic shapes: None lets torch decide, True avoids recompiles when shapes vary"),
            HParam("fullgraph", bool, False, help="fail on graph breaks instead of falling back to eager"),
        ),
        requirements=("a C++ compiler on CPU, Triton on GPU",
                      "a first batch that is slower by the compile (record.timings['compile_s'])",
                      "varying input shapes (progressive resizing, sequence-length warmup) cause recompiles"),
        runs_after=("patch_whitening", "muon"),
        effect="fused kernels and, on CUDA, fewer launches: PyTorch 2 reports about 1.4x training speed-up on an A100 "
               "across its benchmark suites; small on a CPU, after a compile that the first batch pays",
        source="PyTorch 2 (Ansel et al. 2024); measured here: "
               "bench/results/2026-12-03-design-notes/design_notes.json (torch_compile)",
    )

    def __init__(self, mode: str = "default", dynamic: bool | None = None, fullgraph: bool = False):
        super().__init__(mode=mode, dynamic=dynamic, fullgraph=fullgraph)
        self._first_batch: int | None = None
        self._started: float | None = None

    def match(self, event, state) -> bool:
        if event in (Event.BATCH_START, Event.BATCH_END):
            return self._first_batch is not None
        return event is Event.FIT_START

    def apply(self, event, state, logger):
        if event is Event.FIT_START:
            mode, note = mode_for_device(self.params["mode"], state.device)
            if note:
                logger.log_text(note)
            compile_model(state.model, mode, self.params["dynamic"], self.params["fullgraph"])
            muons = [optimizer for optimizer in state.optimizers if isinstance(optimizer, Muon)]
            for muon in muons:
                muon.compile_update()
            self._first_batch = state.timestamp.batch
            logger.log_text(f"torch_compile: model{' and Muon update' if muons else ''} compiled (mode={mode}); "
                            f"the first batch includes the compilation")
        elif event is Event.BATCH_START:
            synchronize(state.device)
            self._started = time.perf_counter()
        elif self._started is not None:  # BATCH_END of the first batch (timestamp already advanced)
            synchronize(state.device)
            seconds = time.perf_counter() - self._started
            logger.log_timing("compile_s", seconds)
            logger.log_text(f"torch_compile: first batch (with compilation) took {seconds:.1f} s")
            self._first_batch, self._started = None, None
