"""BlurPool: anti-aliased downsampling (Zhang 2019, "Making Convolutional Networks Shift-Invariant Again").

A strided convolution or max-pool samples its input at every s-th pixel, so frequencies above the new
Nyquist limit fold back (alias) and a one-pixel shift of the input can change the output a lot. BlurPool
low-passes with a fixed [1, 2, 1] x [1, 2, 1] / 16 depthwise filter before (or while) subsampling:

    strided Conv2d  -> blur, then the same conv           (blur_first=True, Composer's default)
                    or the conv at stride 1, then blurred subsampling by the stride
    MaxPool2d       -> max at stride 1, then blurred subsampling ("MaxBlurPool")

Output shapes are unchanged and the replacements subclass the originals, so state dict keys stay.
Composer reports +0.5-1% ImageNet top-1 for ResNet-50 at a small throughput cost.

Compiled (torch.compile), the blur is written as sums of shifted slices instead of a depthwise convolution: a
convolution is a library call that the compiler runs apart, where the sums fuse into the kernel that makes the
blur's input (a batch norm and ReLU, a max-pool) and the gradient's into the backward's kernels, one pass over the
activations and a convolution each way fewer per blur (``tests/methods/test_methods_surgery.py`` counts them).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard, SurgeryReport
from speedkit.methods._surgery import adopt_state, record_surgery, replace_modules
from speedkit.methods.channels_last import is_channels_last

_BINOMIAL = torch.tensor([1.0, 2.0, 1.0])


def blur_filter(channels: int, device=None, dtype=None) -> torch.Tensor:
    """The depthwise [channels, 1, 3, 3] binomial low-pass filter (sums to 1 per channel)."""
    kernel = torch.outer(_BINOMIAL, _BINOMIAL) / 16.0
    return kernel.to(device=device, dtype=dtype).expand(channels, 1, 3, 3).contiguous()


def _runs_in(x: torch.Tensor) -> torch.dtype:
    """The dtype a convolution of ``x`` runs in: autocast's where it is on."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class _SampledBlur(torch.autograd.Function):
    """The strided blur as the stride-1 blur sampled at every ``stride``-th pixel, its gradient the same blur
    over the output's gradient spread back onto the stride-1 grid.

    The filter is symmetric, so that is the transposed convolution autograd would run, as a forward convolution.
    On a CPU in bf16 the strided depthwise backward kernel is several times slower than this at four times the
    work; in fp32 it is the faster one (bench/results/2026-12-04-blurpool-step/blurpool_step.json). The input's
    memory format is kept, so a channels_last network's gradients stay channels_last."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, filter: torch.Tensor, stride: tuple[int, int]) -> torch.Tensor:
        ctx.save_for_backward(filter)
        ctx.input_dtype, ctx.stride = x.dtype, stride
        ctx.memory_format = torch.channels_last if is_channels_last(x) else torch.contiguous_format
        blurred = F.conv2d(x, filter.to(x.dtype), padding=1, groups=x.shape[1])
        ctx.blurred_shape = blurred.shape
        return blurred[:, :, ::stride[0], ::stride[1]].contiguous(memory_format=ctx.memory_format)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (filter,) = ctx.saved_tensors
        spread = torch.empty(ctx.blurred_shape, dtype=grad.dtype, device=grad.device,
                             memory_format=ctx.memory_format).zero_()
        spread[:, :, ::ctx.stride[0], ::ctx.stride[1]] = grad
        grad_input = F.conv2d(spread, filter.to(grad.dtype), padding=1, groups=grad.shape[1])
        return grad_input.to(ctx.input_dtype), None, None


def blur_2d(x: torch.Tensor, stride: int | tuple[int, int] = 1, filter: torch.Tensor | None = None) -> torch.Tensor:
    """Blur every channel of ``x`` [N, C, H, W] with the binomial filter (zero padding 1), then keep every
    ``stride``-th pixel (a pair: rows, columns). Shapes: stride 1 keeps H, W; stride s gives floor((H - 1) / s) + 1.
    ``filter``: ``blur_filter``'s, made beforehand so that a call does not build it; compiled, the blur is shifted
    sums (``blur_by_shifts``) and needs none."""
    stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
    if torch.compiler.is_compiling():
        return blur_by_shifts(x, stride)
    if filter is None:
        filter = blur_filter(x.shape[1], x.device, x.dtype)
    if max(stride) > 1 and x.device.type == "cpu" and _runs_in(x) == torch.bfloat16:
        return _SampledBlur.apply(x, filter, stride)  # the same numbers, its gradient several times faster here
    return F.conv2d(x, filter.to(x.dtype), stride=stride, padding=1, groups=x.shape[1])


def blur_by_shifts(x: torch.Tensor, stride: tuple[int, int] = (1, 1)) -> torch.Tensor:
    """``blur_2d`` as elementwise sums of the zero-padded input shifted by a pixel, [1, 2, 1] down the rows and then
    along the columns, for a compiler to fuse with its neighbours; the dtype a convolution would give (autocast's)
    and ``x``'s memory format."""
    padded = F.pad(x, (1, 1, 1, 1))
    rows = padded[..., :-2, :] + 2 * padded[..., 1:-1, :] + padded[..., 2:, :]
    blurred = (rows[..., :-2] + 2 * rows[..., 1:-1] + rows[..., 2:]) * (1 / 16)
    memory_format = torch.channels_last if is_channels_last(x) else torch.contiguous_format
    return blurred[..., ::stride[0], ::stride[1]].to(_runs_in(x)).contiguous(memory_format=memory_format)


class BlurConv2d(nn.Conv2d):
    """A strided Conv2d that low-passes its input first (or blurs its stride-1 output while subsampling).
    Same parameters (and state dict keys) as the conv it replaces."""

    def __init__(self, *args, blur_first: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.blur_first = blur_first
        self.blur_stride = self.stride
        if not blur_first:  # the conv runs at stride 1; the blur does the subsampling
            self.stride = (1, 1)
        # on the conv's device: surgery on a model already on a GPU must not leave its filter on the CPU
        self.register_buffer("blur", blur_filter(self.in_channels if blur_first else self.out_channels,
                                                 device=self.weight.device), persistent=False)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, blur_first: bool = True) -> "BlurConv2d":
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                  dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode, blur_first=blur_first,
                  device=conv.weight.device, dtype=conv.weight.dtype)
        return adopt_state(new, conv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return super().forward(blur_2d(x, 1, self.blur))
        sh, sw = self.blur_stride
        out = blur_2d(super().forward(x), 1, self.blur)
        # subsample at the original conv's sampling points (stride s from the first output)
        return out[:, :, ::sh, ::sw]


class MaxBlurPool2d(nn.MaxPool2d):
    """Max-pool at stride 1, then blurred subsampling by the original stride: the same output shape."""

    def __init__(self, kernel_size, stride=None, padding=0, channels: int | None = None, device=None):
        super().__init__(kernel_size, stride=stride, padding=padding)
        self.blur_stride = self.stride
        # One channel's filter, made once and widened to the input's channels as a view in each forward: a
        # pool does not know its channel count, and building the filter in every call costs a few ops a step.
        self.register_buffer("blur", blur_filter(1, device=device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = F.max_pool2d(x, self.kernel_size, 1, self.padding)
        return blur_2d(pooled, self.blur_stride, self.blur.expand(pooled.shape[1], -1, -1, -1))


def _stride_gt_one(stride) -> bool:
    return any(s > 1 for s in ((stride, stride) if isinstance(stride, int) else stride))


def apply_blurpool(model: nn.Module, replace_convs: bool = True, replace_maxpools: bool = True,
                   blur_first: bool = True, min_channels: int = 16, allow_empty: bool = False) -> SurgeryReport:
    """Replace strided ``nn.Conv2d`` (with at least ``min_channels`` input channels: blurring an RGB stem
    costs more than it gives) by ``BlurConv2d`` and ``nn.MaxPool2d`` by ``MaxBlurPool2d``, in place."""
    report = SurgeryReport("blurpool")
    reference = next(model.parameters(), None)  # a pool's filter goes where the model is
    device = reference.device if reference is not None else None
    if replace_convs:
        replace_modules(
            model,
            lambda name, m: (isinstance(m, nn.Conv2d) and not isinstance(m, BlurConv2d)
                             and _stride_gt_one(m.stride) and m.in_channels >= min_channels),
            lambda name, m: BlurConv2d.from_conv(m, blur_first), report, "strided convs")
    if replace_maxpools:
        replace_modules(
            model,
            lambda name, m: (type(m) is nn.MaxPool2d and _stride_gt_one(m.stride) and not m.ceil_mode
                             and not m.return_indices and m.dilation in (1, (1, 1))),
            lambda name, m: MaxBlurPool2d(m.kernel_size, m.stride, m.padding, device=device), report, "max pools")
    return report.require_changes(allow_empty, "strided Conv2d or MaxPool2d layers"
                                  f" (convs need >= {min_channels} input channels)")


class BlurPool(Method):
    CARD = MethodCard(
        name="blurpool",
        summary="Low-pass filter before every strided conv and max-pool, so downsampling stops aliasing.",
        domain="vision",
        events=(Event.INIT,),
        reads=("model",),
        writes=("model",),
        hparams=(
            HParam("replace_convs", bool, True, help="blur strided Conv2d layers"),
            HParam("replace_maxpools", bool, True, help="turn MaxPool2d into max-then-blur-pool"),
            HParam("blur_first", bool, True, help="blur before the strided conv (cheaper) instead of after a "
                                                 "stride-1 conv"),
            HParam("min_channels", int, 16, low=1, high=4096, step=1,
                   help="skip convs with fewer input channels (e.g. the RGB stem)"),
            HParam("allow_empty", bool, False, help="do not fail on a model with nothing to blur"),
        ),
        requirements=("a model with strided Conv2d or MaxPool2d layers",),
        effect="+0.5-1% ImageNet top-1 on ResNet-50 at a small throughput cost (Composer); more shift-invariant "
               "outputs (Zhang 2019)",
        source="Zhang 2019, Making Convolutional Networks Shift-Invariant Again; Composer BlurPool docs",
    )

    def apply(self, event, state, logger):
        record_surgery(logger, apply_blurpool(state.model, **self.params))
