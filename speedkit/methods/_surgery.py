"""Model surgery helpers shared by methods: find modules (and residual blocks) by structure, replace them with
a report, and the small pieces several surgeries share (adopting parameters, low-precision norms)."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import torch
import torch.nn as nn

from speedkit.core.method import SurgeryReport


def named_children_recursive(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, nn.Module]]:
    """(parent name, parent, child attribute, child) for every module below ``model``, parents first."""
    for parent_name, parent in model.named_modules():
        for attr, child in parent.named_children():
            yield parent_name, parent, attr, child


def replace_modules(model: nn.Module, matches: Callable[[str, nn.Module], bool],
                    build: Callable[[str, nn.Module], nn.Module], report: SurgeryReport, kind: str) -> SurgeryReport:
    """Replace every module for which ``matches(full_name, module)`` with ``build(full_name, module)``.

    Matching is by structure (a predicate over the module), never by one library's classes. The
    replacement keeps the attribute name, so state dicts keep their keys where the new module has the
    same parameters. Modules inside a replaced module are not visited again.
    """
    targets = []
    replaced_prefixes: list[str] = []
    for parent_name, parent, attr, child in list(named_children_recursive(model)):
        full = f"{parent_name}.{attr}" if parent_name else attr
        if any(full.startswith(p + ".") for p in replaced_prefixes):
            continue
        if matches(full, child):
            targets.append((parent, attr, full, child))
            replaced_prefixes.append(full)
    for parent, attr, full, child in targets:
        new = build(full, child)
        setattr(parent, attr, new)
        report.add(kind, f"{full}: {type(child).__name__} -> {type(new).__name__}")
    return report


# ---------------------------------------------------------------------------------------------
# Residual blocks, found by structure
#
# The residual-block protocol (what ``find_residual_blocks`` recognises)
# ----------------------------------------------------------------------
# A residual block is a module whose forward is ``relu(branch(x) + shortcut(x))``. Two shapes are
# recognised, neither by class:
#
#   * speedkit's protocol (see speedkit/models/resnet.py): the module has children ``branch`` and
#     ``shortcut``. The branch output is the output of ``branch``; its last norm is the last
#     module inside ``branch`` that has a ``weight`` and running statistics (a BatchNorm).
#   * torchvision's shape: the module has ``conv1, bn1, conv2, bn2`` (BasicBlock) or also
#     ``conv3, bn3`` (Bottleneck), and an optional ``downsample``; its own forward adds the
#     identity (or ``downsample(x)``) to the output of the last bn and applies a ReLU. The branch
#     output is the output of the last bn.
#
# Every candidate is checked by running it once (eval mode, no grad, a small input made with its own
# random generator, so the global RNG stream is untouched): with the branch output zeroed by a hook
# the block must return ``relu(shortcut(x))``. A module that only looks like a block (no addition,
# a different activation) fails the check and is not reported.
#
# What a method can do with a ``ResidualBlock``:
#   * scale or zero the branch: ``block.scale_branch(s)`` installs a forward hook on ``branch_end``
#     that multiplies the branch output by ``s`` (a number or a tensor broadcastable to the output,
#     e.g. [B, 1, 1, 1] per sample); ``None`` switches it off. The hook is a picklable, deep-copyable
#     object, so copies of the model (EMA, SWA) carry their own.
#   * skip the branch entirely: ``block.skipped_output(x)`` is ``relu(shortcut(x))`` without running
#     the branch (stochastic depth uses it to save the compute of dropped blocks).
#   * zero-init the branch: ``block.last_norm.weight`` is the scale of the last norm of the branch.
# ---------------------------------------------------------------------------------------------

class BranchScale:
    """Forward hook that multiplies a module's output by ``scale`` (None: leave it alone)."""

    def __init__(self):
        self.scale = None

    def __call__(self, module, inputs, output):
        if self.scale is None:
            return output
        scale = self.scale
        if isinstance(scale, torch.Tensor):
            scale = scale.to(output.dtype)
        return output * scale


@dataclasses.dataclass(eq=False)
class ResidualBlock:
    """One residual block found in a model, and the handles to act on its branch."""

    name: str                  # its name in model.named_modules()
    module: nn.Module          # the block itself
    kind: str                  # "protocol" (branch/shortcut) or "torchvision" (conv/bn/downsample)
    branch_end: nn.Module      # the module whose output is the branch's output
    last_norm: nn.Module | None  # the last norm layer of the branch (its weight is the branch's scale)
    depth: int = 0             # 0-based position among the model's blocks, in module order

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """What the block adds to its branch: the shortcut / downsample of ``x``, or ``x`` itself."""
        if self.kind == "protocol":
            return self.module.shortcut(x)
        downsample = getattr(self.module, "downsample", None)
        return downsample(x) if downsample is not None else x

    def skipped_output(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output with its branch dropped: relu(shortcut(x)), without running the branch."""
        return torch.relu(self.shortcut(x))

    def branch_scale(self) -> BranchScale:
        """The block's branch scaling hook, installed on first use (one per block)."""
        for hook in self.branch_end._forward_hooks.values():
            if isinstance(hook, BranchScale):
                return hook
        hook = BranchScale()
        self.branch_end.register_forward_hook(hook)
        return hook

    def scale_branch(self, scale) -> None:
        """Multiply the branch output by ``scale`` from now on (a number, a broadcastable tensor, or None)."""
        self.branch_scale().scale = scale


def _is_norm_with_scale(module: nn.Module) -> bool:
    return (isinstance(module, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm))
            and getattr(module, "weight", None) is not None)


def _protocol_block(name: str, module: nn.Module) -> ResidualBlock | None:
    branch, shortcut = getattr(module, "branch", None), getattr(module, "shortcut", None)
    if not isinstance(branch, nn.Module) or not isinstance(shortcut, nn.Module):
        return None
    norms = [m for m in branch.modules() if _is_norm_with_scale(m)]
    return ResidualBlock(name, module, "protocol", branch, norms[-1] if norms else None)


def _torchvision_block(name: str, module: nn.Module) -> ResidualBlock | None:
    def has(*attrs):
        return all(isinstance(getattr(module, a, None), nn.Module) for a in attrs)

    if not has("conv1", "bn1", "conv2", "bn2"):
        return None
    last_bn = module.bn3 if has("conv3", "bn3") else module.bn2
    return ResidualBlock(name, module, "torchvision", last_bn, last_bn if _is_norm_with_scale(last_bn) else None)


def _input_channels(module: nn.Module) -> int | None:
    for m in module.modules():
        channels = getattr(m, "in_channels", None)
        if isinstance(channels, int):
            return channels
    return None


@torch.no_grad()
def _behaves_like_residual(block: ResidualBlock, size: int = 8) -> bool:
    """Run the block once with its branch zeroed: a residual block then returns relu(shortcut(x))."""
    channels = _input_channels(block.module)
    first = next(block.module.parameters(), None)
    if channels is None or first is None:
        return False
    x = torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(0))
    x = x.to(device=first.device, dtype=first.dtype)
    modes = [(m, m.training) for m in block.module.modules()]
    # a temporary hook, not the block's BranchScale: a module that fails the check keeps no hook
    handle = block.branch_end.register_forward_hook(lambda module, inputs, output: torch.zeros_like(output))
    block.module.eval()
    try:
        out = block.module(x)
        expected = block.skipped_output(x)
    except Exception:  # a module that only looks like a block (other input shapes, other signature)
        return False
    finally:
        handle.remove()
        for m, mode in modes:
            m.training = mode
    return out.shape == expected.shape and torch.allclose(out.float(), expected.float(), atol=1e-4, rtol=1e-3)


def find_residual_blocks(model: nn.Module) -> list[ResidualBlock]:
    """Every residual block of ``model`` in module order, found by structure (see the protocol above).

    Blocks inside a found block are not searched (a block's branch is one unit). Each returned block
    carries its ``depth`` (0-based, in module order), which stochastic depth uses for its linear rule.
    """
    blocks: list[ResidualBlock] = []
    found_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in found_prefixes):
            continue
        candidate = _protocol_block(name, module) or _torchvision_block(name, module)
        if candidate is not None and _behaves_like_residual(candidate):
            candidate.depth = len(blocks)
            blocks.append(candidate)
            found_prefixes.append(name)
    return blocks


# ---------------------------------------------------------------------------------------------
# small helpers every surgery uses

def adopt_state(new: nn.Module, old: nn.Module) -> nn.Module:
    """Give ``new`` the very parameter and buffer objects of ``old`` (same names), so optimizers, tied
    weights and devices carry over; returns ``new``."""
    new.load_state_dict(old.state_dict(keep_vars=True), assign=True)
    new.train(old.training)
    return new


def record_surgery(logger, report: SurgeryReport) -> None:
    """Report a surgery to the run's logger: the log, and the list ``record.notes["surgery"]``."""
    if logger is not None:
        logger.log_note("surgery", str(report), append=True)
        logger.log_text(str(report))


def shared_parameter_ids(model: nn.Module) -> set[int]:
    """ids of parameters used by more than one module (tied weights), which surgery must not split."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            seen[id(p)] = seen.get(id(p), 0) + 1
    return {pid for pid, n in seen.items() if n > 1}


# ---------------------------------------------------------------------------------------------
# low-precision norms (low_precision_groupnorm, low_precision_layernorm)
#
# Autocast runs group_norm / layer_norm in fp32 (it upcasts their inputs), which costs bandwidth and a
# cast on both sides. Those methods' modules, when autocast is on for the input's device, run the
# normalization in the autocast dtype (bf16 / fp16) instead; without autocast they are the originals.


def autocast_dtype_for(x: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype active for ``x``'s device, or None when autocast is off there."""
    device_type = x.device.type
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (RuntimeError, TypeError):  # a device type autocast does not know
        return None


def in_low_precision(x: torch.Tensor, *tensors):
    """(dtype, casted tensors, context): cast ``x`` and parameters to the autocast dtype and switch autocast
    off around the norm, so it does not upcast them back to fp32. dtype None means: run as usual."""
    dtype = autocast_dtype_for(x)
    if dtype is None:
        return None, (x, *tensors), contextlib.nullcontext()
    cast = tuple(t.to(dtype) if t is not None else None for t in (x, *tensors))
    return dtype, cast, torch.autocast(x.device.type, enabled=False)
