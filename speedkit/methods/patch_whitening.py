"""Patch whitening (airbench / hlb-CIFAR10): a frozen first conv that decorrelates the data's patches.

From a sample of training images, take every ``kernel_size`` x ``kernel_size`` patch (all channels), compute
the patch covariance S = E V E^T, and use the eigenvectors scaled by 1 / sqrt(eigenvalue + eps) as conv
filters (with a bias removing the mean patch): the outputs are then decorrelated with unit variance, so
the first trainable layer sees well-conditioned inputs. As in airbench the bank holds both the +filters
and the -filters (2 * c * k * k channels), so a following ReLU keeps both signs of each component.

Surgery: the model's FIRST ``nn.Conv2d`` (module order) becomes ``WhitenedConv2d``: the frozen whitening
conv (padded so the output has the replaced conv's spatial shape) followed by a trainable 1x1 conv to the
replaced conv's ``out_channels``, so the rest of the model is unchanged.

In the Trainer the module is put in place at INIT (so the optimizer, built after INIT, gets the 1x1
conv and a checkpoint's keys match at resume) and the whitening is computed at FIT_START from up to
``num_samples`` training images; a resumed run keeps the whitening it saved. If the optimizer was built
before (a pre-built optimizer object), FIT_START adds the 1x1 conv's parameters to the first optimizer
with its first group's hyperparameters. airbench reaches CIFAR-10 94% in 2.6 s on an A100 with it.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.batch import batch_inputs
from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import record_surgery


def image_patches(images: torch.Tensor, kernel_size: int = 2, max_patches: int = 200_000,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """All k x k patches of ``images`` [N, C, H, W] (stride 1) as rows [P, C*k*k], at most ``max_patches``
    (a random subset), in fp32."""
    patches = F.unfold(images.float(), kernel_size).transpose(1, 2).reshape(-1, images.shape[1] * kernel_size ** 2)
    if patches.shape[0] > max_patches:
        keep = torch.randperm(patches.shape[0], generator=generator)[:max_patches].to(patches.device)
        patches = patches[keep]
    return patches


def whitening_filters(images: torch.Tensor, kernel_size: int = 2, eps: float = 5e-4):
    """(filters [c*k*k, c, k, k], bias [c*k*k]) whitening the k x k patches of ``images``: for a patch p,
    filters . p + bias has zero mean and covariance diag(lambda / (lambda + eps)) ~ identity."""
    channels = images.shape[1]
    patches = image_patches(images, kernel_size, generator=torch.Generator().manual_seed(0))
    mean = patches.mean(dim=0)
    centered = patches - mean
    covariance = centered.T @ centered / max(1, centered.shape[0] - 1)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
    eigenvalues, eigenvectors = eigenvalues.flip(0).clamp_min(0), eigenvectors.flip(1)  # largest first
    rows = eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]
    return rows.reshape(-1, channels, kernel_size, kernel_size), -(rows @ mean)


def whitening_conv_from_images(images: torch.Tensor, kernel_size: int = 2, eps: float = 5e-4,
                               both_signs: bool = True) -> nn.Conv2d:
    """A frozen Conv2d (stride 1, no padding) whose outputs are the whitened k x k patches of the data;
    with ``both_signs`` the bank is [+filters, -filters] (2*c*k*k channels, as airbench), else c*k*k."""
    filters, bias = whitening_filters(images, kernel_size, eps)
    if both_signs:
        filters, bias = torch.cat([filters, -filters]), torch.cat([bias, -bias])
    conv = nn.Conv2d(images.shape[1], filters.shape[0], kernel_size, bias=True, device=images.device)
    with torch.no_grad():
        conv.weight.copy_(filters)
        conv.bias.copy_(bias)
    conv.requires_grad_(False)
    return conv


class WhitenedConv2d(nn.Module):
    """Frozen whitening conv then a trainable 1x1 conv, shaped like the conv it replaces."""

    def __init__(self, replaced: nn.Conv2d, kernel_size: int = 2):
        super().__init__()
        if replaced.groups != 1 or replaced.dilation not in (1, (1, 1)):
            raise ValueError("patch whitening replaces a plain first conv (groups 1, dilation 1)")
        self.in_channels, self.out_channels, self.kernel_size = replaced.in_channels, replaced.out_channels, kernel_size
        w = replaced.weight
        bank = 2 * replaced.in_channels * kernel_size ** 2
        self.whiten = nn.Conv2d(replaced.in_channels, bank, kernel_size, stride=replaced.stride, bias=True,
                                device=w.device, dtype=w.dtype)
        self.whiten.requires_grad_(False)
        self.project = nn.Conv2d(bank, replaced.out_channels, 1, bias=replaced.bias is not None,
                                 device=w.device, dtype=w.dtype)
        # pad so that (H + pad - k) / s == (H + 2p - K) / s: the replaced conv's output size, for every H
        self.pad = []
        for p, K in zip(reversed(replaced.padding), reversed(replaced.kernel_size)):  # F.pad wants W first
            total = 2 * p - K + kernel_size
            self.pad += [total // 2, total - total // 2]
        # saved, so a resumed run keeps the whitening it computed instead of recomputing it
        self.register_buffer("whitening_done", torch.zeros((), dtype=torch.bool, device=w.device))

    def set_whitening(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        conv = whitening_conv_from_images(images.to(self.whiten.weight.device), self.kernel_size, eps)
        with torch.no_grad():
            self.whiten.weight.copy_(conv.weight)
            self.whiten.bias.copy_(conv.bias)
            self.whitening_done.fill_(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(self.whiten(F.pad(x, self.pad)))


def first_conv(model: nn.Module) -> tuple[nn.Module, str, str, nn.Module] | None:
    """(parent, attribute, full name, module) of the first nn.Conv2d or WhitenedConv2d in module order."""
    for parent_name, parent in model.named_modules():
        for attr, child in parent.named_children():
            if isinstance(child, (nn.Conv2d, WhitenedConv2d)):
                return parent, attr, f"{parent_name}.{attr}" if parent_name else attr, child
    return None


def insert_whitening(model: nn.Module, kernel_size: int = 2, allow_empty: bool = False) -> SurgeryReport:
    """Replace the model's first Conv2d by a (not yet fitted) WhitenedConv2d; returns the report."""
    report = SurgeryReport("patch_whitening")
    found = first_conv(model)
    if found is not None and isinstance(found[3], nn.Conv2d):
        parent, attr, name, conv = found
        setattr(parent, attr, WhitenedConv2d(conv, kernel_size))
        report.add("first conv", f"{name}: {type(conv).__name__} -> WhitenedConv2d")
    return report.require_changes(allow_empty, "Conv2d (the first conv is replaced)")


def whitened_stem(model: nn.Module) -> WhitenedConv2d | None:
    found = first_conv(model)
    return found[3] if found is not None and isinstance(found[3], WhitenedConv2d) else None


def apply_patch_whitening(model: nn.Module, images: torch.Tensor, kernel_size: int = 2, eps: float = 5e-4,
                          allow_empty: bool = False) -> SurgeryReport:
    """Replace the model's first Conv2d by frozen patch whitening (from ``images`` [N, C, H, W], as the
    model sees them: normalized) followed by a trainable 1x1 conv to the original out_channels."""
    report = insert_whitening(model, kernel_size, allow_empty)
    stem = whitened_stem(model)
    if stem is not None:
        if images.shape[1] != stem.in_channels:
            raise ValueError(f"images have {images.shape[1]} channels but the first conv takes {stem.in_channels}")
        stem.set_whitening(images, eps)
    return report


def sample_images(loader, num_samples: int) -> torch.Tensor:
    """Up to ``num_samples`` input images from a loader yielding (inputs, targets, ...) batches."""
    taken, count = [], 0
    for batch in loader:
        inputs = batch_inputs(batch)
        taken.append(inputs[: num_samples - count].detach())
        count += taken[-1].shape[0]
        if count >= num_samples:
            break
    if not taken:
        raise ValueError("patch_whitening: the train loader yielded no batches to compute the whitening from")
    return torch.cat(taken)


def add_missing_parameters(optimizer: torch.optim.Optimizer, module: nn.Module) -> int:
    """Add ``module``'s trainable parameters the optimizer does not have, as a group with the first group's
    hyperparameters; returns how many were added."""
    known = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [p for p in module.parameters() if p.requires_grad and id(p) not in known]
    if missing:
        hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        optimizer.add_param_group({"params": missing, **hyper})
    return len(missing)


class PatchWhitening(Method):
    CARD = MethodCard(
        name="patch_whitening",
        summary="Replace the first conv by a frozen conv that whitens the data's patches, plus a 1x1 conv.",
        domain="vision",
        events=(Event.INIT, Event.FIT_START),
        reads=("model", "data"),
        writes=("model",),
        hparams=(
            HParam("kernel_size", int, 2, low=1, high=7, step=1, help="patch size of the whitening conv"),
            HParam("eps", float, 5e-4, low=1e-8, high=1.0, log=True,
                   help="added to eigenvalues: damps the noisiest directions"),
            HParam("num_samples", int, 5000, low=16, high=100_000, step=16,
                   help="training images used to estimate the patch covariance"),
            HParam("allow_empty", bool, False, help="do not fail on a model without a conv"),
        ),
        requirements=("a vision model whose first nn.Conv2d takes the input images (groups 1, dilation 1)",
                      "a train loader yielding image batches as the model sees them"),
        effect="faster early convergence: part of airbench's CIFAR-10 94% in 2.6 s (A100) and hlb-CIFAR10",
        source="airbench (Keller Jordan 2024); hlb-CIFAR10 (Tysam 2023)",
    )

    def apply(self, event, state, logger):
        if event is Event.INIT:
            record_surgery(logger, insert_whitening(state.model, self.params["kernel_size"],
                                                    self.params["allow_empty"]))
            return
        stem = whitened_stem(state.model)
        if stem is None:  # allow_empty and nothing to whiten, or someone undid the surgery
            return
        added = add_missing_parameters(state.optimizers[0], stem) if state.optimizers else 0
        if not bool(stem.whitening_done):
            images = sample_images(state.train_dataloader, self.params["num_samples"]).to(state.device)
            stem.set_whitening(images, self.params["eps"])
            logger.log_text(f"patch_whitening: whitening from {images.shape[0]} images, "
                            f"{stem.whiten.out_channels} filters of {stem.kernel_size}x{stem.kernel_size}")
        if added:
            logger.log_text(f"patch_whitening: added {added} parameters of the 1x1 conv to the optimizer")
