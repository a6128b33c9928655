"""Mixed precision as a method: run forward passes (and the loss) under ``torch.autocast``.

bf16 halves memory traffic and uses the fast matrix units of recent GPUs and CPUs (AVX-512 BF16 /
AMX); without them a CPU emulates bf16 and is slower, so ``precision="auto"`` times both first. The
benchmark's ``plain-bf16`` against ``plain`` measures it (bench/results/summary.json). bf16 keeps fp32's
exponent range, so it needs no loss scaling; fp16 (GPUs only) does, and this method then also installs a
GradScaler. Weights and optimizer state stay fp32.

``Trainer(precision="bf16")`` does the same thing; this method exists so mixed precision can be
toggled like any other method (explorer, recipes). With both given, the method's dtype wins.
"""
from __future__ import annotations

import torch

from speedkit.core.devices import autocast_factory, make_grad_scaler
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard


def check_autocast_dtype(dtype: str, device: torch.device) -> None:
    """Refuse combinations the device cannot run well, with the fix in the message."""
    if dtype == "fp16" and device.type == "cpu":
        raise ValueError("autocast dtype='fp16' is for GPUs (CPU fp16 kernels are slow and need loss scaling); "
                         "on a CPU use dtype='bf16'")


def enable_autocast(state, dtype: str = "bf16") -> None:
    """Set ``state.autocast`` (and for fp16 a GradScaler) for ``dtype`` on ``state.device``."""
    check_autocast_dtype(dtype, state.device)
    state.autocast = autocast_factory(dtype, state.device)
    if dtype == "fp16":
        if state.grad_scaler is None:
            state.grad_scaler = make_grad_scaler("fp16", state.device)
    else:
        state.grad_scaler = None  # bf16 needs no loss scaling
    state.precision = dtype


class Autocast(Method):
    CARD = MethodCard(
        name="autocast",
        summary="Mixed precision: forward and loss under torch.autocast in bf16 (or fp16 with loss scaling on GPU).",
        domain="any",
        events=(Event.FIT_START,),
        reads=("model",),
        writes=("precision",),
        hparams=(HParam("dtype", str, "bf16", choices=("bf16", "fp16"),
                        help="bf16: CPU and recent GPUs, no scaler; fp16: GPUs, with a GradScaler"),),
        requirements=("fp16 only on GPU (CUDA/MPS); bf16 pays off on CPUs with AVX-512 BF16/AMX and on Ampere+ GPUs",
                      "same as Trainer(precision=...): the method's dtype replaces the Trainer's"),
        effect="about 2x GPU throughput (PyTorch AMP docs); on a CPU only with AVX-512 BF16 or AMX units",
        source="Micikevicius et al. 2018 'Mixed Precision Training'; PyTorch AMP docs; measured here: "
               "bench/results/summary.json (plain-bf16 against plain)",
    )

    def __init__(self, dtype: str = "bf16"):
        super().__init__(dtype=dtype)

    def apply(self, event, state, logger):
        enable_autocast(state, self.params["dtype"])
        logger.log_note("autocast", self.params["dtype"])
        logger.log_text(f"autocast: forward passes in {self.params['dtype']} on {state.device.type}")
