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

# What the dispatches of one Newton-Schulz iteration (about 20 ops) are worth in arithmetic: matrices of different
# shapes are padded with zeros into one batched iteration where that adds no more work than this. On a CPU an
# iteration of a small matrix takes about 60 us and the iterations of a conv net's larger filters run at about
# 100 GFLOP/s (bench/results/2026-12-03-muon-step/); on a GPU thirty launches of several microseconds each are worth
# billions of operations of batched bf16 matmuls, an estimate that the GPU throughput check's `muon` part measures.
DISPATCHES_WORTH_FLOPS = {"cpu": 5e6, "accelerator": 5e9}
# A padded matrix's own dispatches as a share of an iteration's (its batch's), by the same kinds of device. On a CPU
# every op costs one: a padded matrix's copy into the batch and the slices and views of its block into and out of it,
# about a fifth of an iteration's. On a GPU what costs is a kernel launch: a padded matrix's copy into the batch and
# its own add to its weights (the views of a padded batch send the optimizer's one multi-tensor add down CUDA's slow
# path, a kernel per tensor), 2 of an iteration's about 30 (five steps of three products, two of which copy what
# they add to first, the norm, the casts and the add; ``speedkit.callbacks.sync_counter.kernel_launches`` counts
# them).
PAD_SHARE = {"cpu": 0.2, "accelerator": 2 / 30}


def newton_schulz_dtype(G: torch.Tensor, entries: int | None = None) -> torch.dtype:
    """The dtype the iteration runs in by default: bf16 on CUDA, and on a CPU for large matrices where
    bf16 autocast measured faster than fp32 (``cpu_has_fast_bf16``); fp32 otherwise. bf16 is stable here
    because the map is self-correcting (modded-nanogpt runs it in bf16). ``entries``: of one matrix, where ``G``
    is not the matrix or a batch of them (a conv filter before it is flattened)."""
    if G.is_cuda:
        return torch.bfloat16
    if entries is None:
        entries = G.size(-2) * G.size(-1)
    if G.device.type == "cpu" and entries >= CPU_BF16_MIN_ENTRIES:
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
    a few) are orthogonalized together, in one batched iteration, and so are small matrices of different shapes (a
    conv net's filters) padded to one where that costs less than their dispatches (``plan_batches``); the state is
    a momentum buffer per parameter. ``compile_update`` compiles the update (``torch_compile`` does where it is on).
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
        self._plans: dict[tuple, list] = {}  # which matrices iterate together, by what the step's updates are
        self._update = muon_update  # compile_update() puts a compiled one in its place
        self._lr_tensors: dict[int, torch.Tensor] = {}  # a compiled update's learning rates, by group
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

    def compile_update(self) -> None:
        """Run each step's update compiled (``torch.compile``): its multi-tensor ops, pads, casts, norms and adds
        fused around the Newton-Schulz matmuls, in a few kernels where eager launches one per op (and, off CUDA's
        multi-tensor fast path, per matrix). The learning rate goes in as a tensor on the device, so that a schedule
        changing it does not compile the update again; the first step pays for the compile."""
        self._update = torch.compile(muon_update)

    @property
    def compiled(self) -> bool:
        """Whether each step's update runs compiled (``compile_update``)."""
        return self._update is not muon_update

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        grads = [p.grad for p in params]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        lr = group["lr"]
        if self.compiled and not isinstance(lr, torch.Tensor):
            # a number in a compiled graph is a constant of it: a new one would compile the graph again
            if id(group) not in self._lr_tensors:
                self._lr_tensors[id(group)] = torch.empty((), device=params[0].device)
            lr = self._lr_tensors[id(group)].fill_(lr)
        self._update(params, grads, buffers, self._plan(grads, group["ns_steps"]), lr, group["momentum"],
                     group["nesterov"], group["weight_decay"], group["ns_steps"])

    def _plan(self, updates: list[torch.Tensor], steps: int) -> list:
        """``(batch, dtype, {update scale: positions in the batch})`` for each of ``iteration_batches``, planned
        once for the updates' shapes, dtypes and devices (their gradients'): on a GPU, a plan made at every step
        would cost the host about a millisecond for ResNet-50's filters."""
        key = (steps, *((u.shape, u.dtype, u.device) for u in updates))
        if key not in self._plans:
            self._plans[key] = [(batch, dtype, _by_scale([updates[i] for i in batch]))
                                for batch, dtype in iteration_batches(updates, steps)]
        return self._plans[key]


def muon_update(params: list[torch.Tensor], grads: list[torch.Tensor], buffers: list[torch.Tensor], plan: list,
                lr: float | torch.Tensor, momentum: float, nesterov: bool, weight_decay: float, steps: int) -> None:
    """One Muon step of ``params`` in place (``Muon``'s docstring says what it computes): the momentum ``buffers``
    updated with ``grads``, the weight decay, and each batch of ``plan`` (``Muon._plan``) orthogonalized together and
    added. The elementwise work is in multi-tensor ops: per parameter, a dispatch would cost more than its arithmetic
    for a small conv net's filters."""
    torch._foreach_mul_(buffers, momentum)
    torch._foreach_add_(buffers, grads)
    updates = torch._foreach_add(grads, buffers, alpha=momentum) if nesterov else buffers
    if weight_decay:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)  # a tensor lr too, read on the device
    for batch, dtype, by_scale in plan:
        orthos = orthogonalize_together([updates[i] for i in batch], steps, dtype)
        for scale, positions in by_scale.items():
            same_params, same_orthos = [params[batch[k]] for k in positions], [orthos[k] for k in positions]
            step = -lr * scale
            if isinstance(step, torch.Tensor):  # a tensor lr: ``FollowSchedule``'s, or a compiled update's
                torch._foreach_add_(same_params, torch._foreach_mul(same_orthos, step))
            else:
                torch._foreach_add_(same_params, same_orthos, alpha=step)


def _by_scale(matrices: list[torch.Tensor]) -> dict[float, list[int]]:
    """Positions of ``matrices`` by the scale of their update, ``max(1, rows / cols) ** 0.5``."""
    by_scale: dict[float, list[int]] = {}
    for k, matrix in enumerate(matrices):
        rows, cols = matrix_shape(matrix)
        by_scale.setdefault(max(1.0, rows / cols) ** 0.5, []).append(k)
    return by_scale


def matrix_shape(tensor: torch.Tensor) -> tuple[int, int]:
    """``[rows, cols]`` of ``tensor`` as Muon's matrix: a conv filter's dimensions after the first flattened."""
    return tensor.size(0), tensor.numel() // max(1, tensor.size(0))


def newton_schulz_flops(rows: int, cols: int, steps: int = 5) -> int:
    """Floating-point operations of ``steps`` Newton-Schulz iterations on a ``[rows, cols]`` matrix (in its wide
    orientation, as ``zeropower_via_newtonschulz`` runs it): three matmuls an iteration."""
    short, long = sorted((rows, cols))
    return steps * (4 * short * short * long + 2 * short ** 3)


def device_kind(device: torch.device) -> str:
    """The key of ``device`` in ``DISPATCHES_WORTH_FLOPS`` and ``PAD_SHARE``: ``"cpu"`` or ``"accelerator"``."""
    return "cpu" if device.type == "cpu" else "accelerator"


def dispatch_costs(device: torch.device) -> tuple[float, float]:
    """What an iteration's dispatches cost on ``device`` in arithmetic (``DISPATCHES_WORTH_FLOPS``) and a padded
    matrix's share of them (``PAD_SHARE``)."""
    kind = device_kind(device)
    return DISPATCHES_WORTH_FLOPS[kind], PAD_SHARE[kind]


def plan_batches(shapes: list[tuple[int, int]], worth_flops: float, pad_share: float,
                 steps: int = 5) -> list[list[int]]:
    """Which matrices (their ``[rows, cols]``) run one Newton-Schulz iteration together, as lists of indices.

    The matrices of one shape in the wide orientation always do. A shape's matrices join a batch of another, padded
    with zeros to its largest rows and columns, where what that adds costs no more than their own iteration's
    dispatches (``worth_flops`` in arithmetic): the arithmetic beyond their own and the batch's, and the dispatches
    of each matrix newly padded (``pad_share`` of a batch's). Shapes of more work a matrix go first, so a batch's
    padded shape is mostly its first's.
    """
    same_shape: dict[tuple[int, int], list[int]] = {}
    for i, shape in enumerate(shapes):
        same_shape.setdefault(tuple(sorted(shape)), []).append(i)
    batches: list[tuple[list[tuple[int, int]], int, int]] = []  # (wide shapes, padded rows, padded cols)
    for shape in sorted(same_shape, key=lambda shape: -newton_schulz_flops(*shape, steps)):
        count, (rows, cols) = len(same_shape[shape]), shape
        for b, (members, padded_rows, padded_cols) in enumerate(batches):
            grown = (max(rows, padded_rows), max(cols, padded_cols))
            held = sum(len(same_shape[member]) for member in members)
            added_flops = ((held + count) * newton_schulz_flops(*grown, steps)
                           - held * newton_schulz_flops(padded_rows, padded_cols, steps)
                           - count * newton_schulz_flops(rows, cols, steps))
            unpadded = (padded_rows, padded_cols)  # the batch's matrices of its padded shape, not padded yet
            newly_padded = ((count if shape != grown else 0)
                            + (len(same_shape[unpadded]) if unpadded in members and unpadded != grown else 0))
            if added_flops + newly_padded * pad_share * worth_flops <= worth_flops:
                batches[b] = (members + [shape], *grown)
                break
        else:
            batches.append(([shape], rows, cols))
    return sorted(sorted(i for member in members for i in same_shape[member]) for members, _, _ in batches)


def orthogonalize_together(tensors: list[torch.Tensor], steps: int = 5,
                           dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """``zeropower_via_newtonschulz`` of each tensor as a matrix (``matrix_shape``), in one batched iteration; the
    results have the tensors' shapes, dtype and, for tensors of one shape, strides (a channels_last filter's too).

    Matrices of other shapes are turned to their wide orientation and padded with zeros to one shape. The padding
    changes nothing: rows and columns of zeros add nothing to the norm and stay zero under
    ``X <- aX + (bA + cA^2)X`` with ``A = X X^T``, so each matrix's block is what its own iteration gives (up to
    the order of a matmul's sums).
    """
    if len(tensors) == 1:
        t = tensors[0]
        ortho = zeropower_via_newtonschulz(t if t.dim() == 2 else t.reshape(matrix_shape(t)), steps=steps, dtype=dtype)
        return [ortho if t.dim() == 2 else ortho.view_as(t)]
    if len({t.shape for t in tensors}) == 1:
        return _orthogonalize_one_shape(tensors, steps, dtype)
    return _orthogonalize_padded(tensors, steps, dtype)


def _orthogonalize_one_shape(tensors: list[torch.Tensor], steps: int, dtype: torch.dtype | None) -> list:
    """Tensors of one shape stacked as they are, one view to the matrices, and the results cast back into one
    buffer laid out as the first tensor is (one kernel): the optimizer's multi-tensor add of the results to the
    weights then runs as one kernel on CUDA, where a result of other strides (a transposed tall matrix, a contiguous
    one for a channels_last filter) would send it down its slow path of a kernel per matrix
    (``speedkit.callbacks.sync_counter.foreach_fast_path``)."""
    stacked = torch.stack(tensors)  # each tensor's layout kept in its slice (a channels_last filter's too)
    matrices = stacked if stacked.dim() == 3 else stacked.reshape(len(tensors), *matrix_shape(tensors[0]))
    dtype = newton_schulz_dtype(matrices) if dtype is None else dtype
    orthos = zeropower_via_newtonschulz(matrices.to(dtype), steps=steps, dtype=dtype)  # left in the iteration's dtype
    laid_out = torch.empty_like(stacked)
    return list(laid_out.copy_(orthos if orthos.dim() == stacked.dim() else orthos.reshape(stacked.shape)).unbind(0))


def _orthogonalize_padded(tensors: list[torch.Tensor], steps: int, dtype: torch.dtype | None) -> list:
    """Matrices of other shapes in their wide orientation, in one batch: stacked where they have one wide shape (a
    matrix and others of its transposed shape), else each copied into the corner of a batch of zeros in the
    iteration's dtype (one fill, and a copy a matrix that also casts it and flattens a filter in whatever layout it
    has, where a pad would be a fill and a copy and the stack another copy). The results are views into the batch
    cast back once, in the tensors' shapes."""
    shapes = [matrix_shape(t) for t in tensors]
    rows = max(min(shape) for shape in shapes)
    cols = max(max(shape) for shape in shapes)
    if dtype is None:
        dtype = newton_schulz_dtype(tensors[0], entries=rows * cols)
    if all(sorted(shape) == [rows, cols] for shape in shapes):
        matrices = [t if t.dim() == 2 else t.reshape(shape) for t, shape in zip(tensors, shapes)]
        batch = torch.stack([m.mT if m.size(0) > m.size(1) else m for m in matrices])
    else:
        batch = tensors[0].new_zeros((len(tensors), rows, cols), dtype=dtype)
        for corner, t, shape in zip(batch, tensors, shapes):
            _as_shaped(_matrix_in(corner, shape), t).copy_(t)
    blocks = zeropower_via_newtonschulz(batch, steps=steps, dtype=dtype).to(tensors[0].dtype)
    return [_as_shaped(_matrix_in(block, shape), t) for block, t, shape in zip(blocks, tensors, shapes)]


def _as_shaped(matrix: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``matrix`` (a view of ``t``'s matrix shape) viewed in ``t``'s shape."""
    return matrix if matrix.shape == t.shape else matrix.view(t.shape)


def _matrix_in(corner: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The ``[rows, cols]`` matrix that ``corner`` (one of a batch's matrices) holds in its top left in its wide
    orientation, as a ``[rows, cols]`` view."""
    rows, cols = shape
    short, long = min(shape), max(shape)
    wide = corner if corner.shape == (short, long) else corner[:short, :long]  # each slice is a dispatch
    return wide.mT if rows > cols else wide


def iteration_batches(tensors: list[torch.Tensor], steps: int):
    """``(indices, Newton-Schulz dtype)`` for each batch of ``tensors`` that runs one iteration: matrices of one
    device, dtype and iteration dtype, planned by ``plan_batches`` with what dispatches cost on that device."""
    kinds: dict = {}
    for i, t in enumerate(tensors):
        kinds.setdefault((t.device, t.dtype, newton_schulz_dtype(t, entries=t.numel())), []).append(i)
    for (device, _, dtype), members in kinds.items():
        shapes = [matrix_shape(tensors[i]) for i in members]
        for batch in plan_batches(shapes, *dispatch_costs(device), steps):
            yield [members[i] for i in batch], dtype
