"""Muon (Keller Jordan, 2024; the optimizer of the modded-nanogpt and airbench speed-runs).

MomentUm Orthogonalized by Newton-Schulz: SGD with (Nesterov) momentum whose update for each
matrix-shaped parameter is replaced by the nearest semi-orthogonal matrix ``U V^T`` (from the SVD
``U S V^T`` of the update), found cheaply with five iterations of a quintic Newton-Schulz map. Every
direction of the update then moves by about the same amount, instead of a few dominant directions
taking most of the step. modded-nanogpt measured about 1.5x the sample efficiency of AdamW on GPT-2.

Use it for hidden weight matrices only (conv filters flattened to ``[out, in * kh * kw]``); embeddings,
the output head, biases and gains or norm scales of any shape (QK-norm's per-head ``[H, D]`` gains) belong with
AdamW or SGD. A module that owns a matrix-shaped gain marks it with :func:`mark_not_a_matrix`, so that
``speedkit.methods.muon`` leaves it with the user's optimizer.
"""
from __future__ import annotations

import torch

from speedkit.core.devices import cpu_has_fast_bf16

_NOT_A_MATRIX = "_speedkit_not_a_matrix"


def mark_not_a_matrix(parameter: torch.nn.Parameter) -> torch.nn.Parameter:
    """Mark a parameter with 2 or more dimensions that is not a weight matrix (a gain, a scale, a table) so
    that Muon's partition leaves it with the user's optimizer; returns the parameter."""
    setattr(parameter, _NOT_A_MATRIX, True)
    return parameter


def is_marked_not_a_matrix(parameter: torch.Tensor) -> bool:
    """Whether :func:`mark_not_a_matrix` marked ``parameter``."""
    return bool(getattr(parameter, _NOT_A_MATRIX, False))


# Quintic coefficients chosen (by Keller Jordan) to push all singular values in (0, 1] quickly towards 1;
# they land in roughly [0.7, 1.2] rather than exactly 1, which works as well in practice.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)

# On a CPU whose bf16 matmuls are fast (AMX, AVX-512 BF16), bf16 pays from about this many entries up; below
# it the casts cost more than the faster matmuls save. The timings per shape behind it are data:
# bench/results/2026-12-03-muon-step/muon_step.json (measured by measure_muon_step.py beside it).
CPU_BF16_MIN_ENTRIES = 65536


def newton_schulz_dtype(G: torch.Tensor) -> torch.dtype:
    """The dtype the iteration runs in by default: bf16 on CUDA, and on a CPU for large matrices where
    bf16 autocast measured faster than fp32 (``cpu_has_fast_bf16``); fp32 otherwise. bf16 is stable here
    because the map is self-correcting (modded-nanogpt runs it in bf16)."""
    if G.is_cuda:
        return torch.bfloat16
    if G.device.type == "cpu" and G.size(-2) * G.size(-1) >= CPU_BF16_MIN_ENTRIES:
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    return torch.float32


def zeropower_via_newtonschulz(G: torch.Tensor, steps: int = 5, eps: float = 1e-7,
                               dtype: torch.dtype | None = None) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with the singular vectors of ``G`` (``U V^T``).

    ``G`` is ``[..., rows, cols]``. The iteration runs in ``dtype`` (default: ``newton_schulz_dtype``)
    and the result has ``G``'s dtype.
    """
    if G.dim() < 2:
        raise ValueError(f"Newton-Schulz orthogonalization needs a matrix, got shape {tuple(G.shape)}")
    a, b, c = NS_COEFFICIENTS
    if dtype is None:
        dtype = newton_schulz_dtype(G)
    X = G.to(dtype)
    if X.dim() > 3:  # baddbmm takes one batch dimension
        X = X.flatten(0, -3)
    tall = G.size(-2) > G.size(-1)
    if tall:  # iterate on the wide orientation: X @ X^T is then the smaller Gram matrix
        X = X.mT
    # Scale so the spectral norm is at most 1 (Frobenius norm bounds it), where the iteration converges.
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    # X <- a X + (b A + c A^2) X with A = X X^T, in three matmuls that also do the scaling and the sums:
    # on a CPU the small matrices of a conv net cost more in per-op overhead than in arithmetic.
    batched = X.dim() == 3
    multiply, multiply_add = (torch.bmm, torch.baddbmm) if batched else (torch.mm, torch.addmm)
    for _ in range(steps):
        A = multiply(X, X.mT)
        B = multiply_add(A, A, A, beta=b, alpha=c)
        X = multiply_add(X, B, X, beta=a)
    if tall:
        X = X.mT
    return X.reshape(G.shape).to(G.dtype)


class Muon(torch.optim.Optimizer):
    """Muon for parameters with 2 or more dimensions (those with more are flattened after the first).

    Per step, for each parameter ``W`` with gradient ``g``: ``buf = momentum * buf + g``; the update
    direction is ``g + momentum * buf`` (Nesterov) or ``buf``; it is orthogonalized with ``ns_steps``
    Newton-Schulz iterations and applied as ``W -= lr * max(1, rows / cols) ** 0.5 * O``, after a
    decoupled weight decay ``W *= 1 - lr * weight_decay``. The matrices of one shape (a transformer's layers repeat
    a few) are orthogonalized together, in one batched iteration; the state is a momentum buffer per parameter.
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0):
        if lr < 0:
            raise ValueError(f"Muon lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon momentum must be in [0, 1), got {momentum}")
        if int(ns_steps) != ns_steps or ns_steps < 1:
            raise ValueError(f"Muon ns_steps must be a whole number >= 1, got {ns_steps}")
        if weight_decay < 0:
            raise ValueError(f"Muon weight_decay must be >= 0, got {weight_decay}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=int(ns_steps),
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() < 2:
                    raise ValueError(f"Muon only takes matrices and conv filters; got a parameter of shape "
                                     f"{tuple(p.shape)}: give 1-D parameters (biases, norms) to AdamW/SGD")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        grads = [p.grad for p in params]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        # The elementwise work in a few multi-tensor ops: per parameter, its dispatch would cost more than its
        # arithmetic for a small conv net's filters.
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, grads)
        updates = torch._foreach_add(grads, buffers, alpha=momentum) if group["nesterov"] else buffers
        if wd:
            torch._foreach_mul_(params, 1.0 - lr * wd)  # a tensor lr (``FollowSchedule``'s) too, read on the device
        for same_shape, same_shape_updates in _by_shape(params, updates):
            # One batched iteration for all the matrices of a shape: a transformer's layers repeat the same few
            # shapes, so its step runs a handful of iterations rather than one per matrix.
            if len(same_shape) == 1:  # alone in its shape: the unbatched iteration, without stacking
                update = same_shape_updates[0]
                matrix = update.reshape(update.size(0), -1)
                orthos = [zeropower_via_newtonschulz(matrix, steps=group["ns_steps"]).view_as(update)]
            else:
                stacked = torch.stack(same_shape_updates)
                matrix = stacked.reshape(len(same_shape), stacked.size(1), -1)
                orthos = zeropower_via_newtonschulz(matrix, steps=group["ns_steps"]).view_as(stacked).unbind(0)
            rows, cols = matrix.shape[-2:]
            step = -lr * max(1.0, rows / cols) ** 0.5
            if isinstance(step, torch.Tensor):  # a tensor lr, as a capturable or compiled optimizer keeps it
                torch._foreach_add_(same_shape, torch._foreach_mul(orthos, step))
            else:
                torch._foreach_add_(same_shape, orthos, alpha=step)


def _by_shape(params: list[torch.Tensor], updates: list[torch.Tensor]):
    """``(params, updates)`` lists, one pair per shape, dtype and device, in the order each first appears."""
    groups: dict = {}
    for p, update in zip(params, updates):
        same = groups.setdefault((tuple(update.shape), update.dtype, update.device), ([], []))
        same[0].append(p)
        same[1].append(update)
    return groups.values()
