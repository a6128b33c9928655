"""How a batch is split into microbatches, and ``microbatch_size="auto"``: halve on out-of-memory.

With ``"auto"`` the first step tries the whole batch; when it runs out of memory the partial step is
dropped, the microbatch halved (kept for the rest of the run, in the checkpoint's state of this component
so that a resumed run continues with it, and reported in ``record.notes["auto_microbatch"]``) and the batch
retried. The gradient is the same whole-batch gradient either way.
"""
from __future__ import annotations

from typing import Callable

import torch

from speedkit.core.batch import batch_size
from speedkit.train.batches import microbatches
from speedkit.train.checks import is_out_of_memory


class Microbatching:
    """The microbatch size of a run: fixed, from ``grad_accum``, or found on out-of-memory (``"auto"``)."""

    def __init__(self, microbatch_size: int | str | None, grad_accum: int = 1):
        self.auto = microbatch_size == "auto"
        self.size: int | None = None if self.auto else microbatch_size  # "auto": the whole batch first
        self.grad_accum = grad_accum
        self.reductions: list[dict] = []  # each halving: {"batch", "from", "to"}

    def settle(self, samples_per_batch: int | None, world: int) -> None:
        """``grad_accum`` steps per batch become a microbatch size, once the batch size is known."""
        if self.size is None and not self.auto and self.grad_accum > 1 and samples_per_batch:
            self.size = -(-(samples_per_batch // world) // self.grad_accum)

    def state_dict(self) -> dict:
        """What a resumed ``"auto"`` run continues with: the size its earlier part settled on, and how."""
        return {"size": self.size, "reductions": list(self.reductions)} if self.auto and self.reductions else {}

    def load_state_dict(self, state: dict) -> None:
        """A resumed ``"auto"`` run keeps the microbatch size its earlier part settled on (same numerics, no
        retries); a fixed size is the run's own argument."""
        if self.auto and state.get("size"):
            self.size = int(state["size"])
            self.reductions = list(state.get("reductions", []))

    def report(self) -> dict:
        """What the record notes of the halvings (``notes["auto_microbatch"]``)."""
        return {"microbatch_size": self.size, "reductions": list(self.reductions)}

    def run(self, step: Callable[[list], torch.Tensor], state, logger) -> tuple[torch.Tensor, list]:
        """``step(microbatches)`` on ``state.batch`` split into microbatches, retried with halved ones
        after an out-of-memory error in ``"auto"`` mode; returns (its result, the microbatches)."""
        full_batch = state.batch
        while True:
            parts = microbatches(full_batch, self.size)
            state.num_microbatches = len(parts)
            try:
                return step(parts), parts
            except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
                if not (self.auto and is_out_of_memory(e)):
                    raise
                size = self.size or batch_size(full_batch)
                if size <= 1:
                    raise torch.OutOfMemoryError(
                        f"out of memory at batch {state.timestamp.batch} even with microbatches of 1 sample "
                        f"(microbatch_size='auto'): one sample's activations, the model and its optimizer state "
                        f"do not fit on {state.device}. Use a smaller model or sequence length, "
                        f"precision='bf16', or a device with more memory") from e
                error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            # Out of the except block, so the traceback's frames (and the activations they hold) are freed.
            self._halve(state, full_batch, size, error, logger)

    def _halve(self, state, full_batch, size: int, error: str, logger) -> None:
        """After an out-of-memory error: drop the partial step, halve the microbatch, and note it."""
        state.batch, state.outputs, state.loss = full_batch, None, None
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)  # the retried batch accumulates its gradient from zero
        state.model.zero_grad(set_to_none=True)
        if state.device.type == "cuda":
            torch.cuda.empty_cache()
        self.size = size // 2  # kept for the rest of the run
        self.reductions.append({"batch": state.timestamp.batch, "from": size, "to": self.size})
        logger.log_note("auto_microbatch", self.report())
        logger.log_text(f"out of memory at batch {state.timestamp.batch} with microbatches of {size} "
                        f"samples ({error}); retrying the batch with microbatches of {self.size}")
