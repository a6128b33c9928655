"""
Models speedkit trains and benchmarks, by name:

    get_model("resnet8")                          # 28x28 grayscale, 10 classes (Fashion-MNIST)
    get_model("resnet20", num_classes=100)        # CIFAR-100
    get_model("resnet18", in_channels=1, small_input=True)   # torchvision, adapted to small images
    get_model("gpt-mini", positions="rotary")     # GPT presets; kwargs override GPTConfig fields
    get_model("unet", num_classes=2)
    get_model("torchvision:mobilenet_v3_small", num_classes=5, in_channels=1)   # any torchvision classifier
    get_model("timm:resnet10t", num_classes=5)   # where timm is installed
    get_model("hf:gpt2-nano")                     # a transformers GPT-2 of gpt-nano's sizes (torch-speedkit[hf])
    get_model("hf:/path/to/folder")               # from_pretrained from a local folder (save_pretrained wrote it)

Nothing here downloads weights: torchvision models are built with weights=None.
"""

import torch.nn as nn

from .gpt import GPT, GPT_CONFIGS, GPTConfig, CausalSelfAttention, Rotary, gpt_config
from .resnet import BasicBlock, ResNet9, SmallResNet, resnet8, resnet9, resnet20, resnet56
from .hf import HF as HF_PREFIX, hf_causal_lm
from .unet import UNet


def torchvision_resnet(arch, num_classes=1000, in_channels=3, small_input=False):
    """
    A torchvision ResNet (random init, weights=None) adapted to the input:
      * in_channels != 3: the first conv takes in_channels (same 7x7 stride-2 geometry);
      * small_input=True (e.g. 28x28 or 32x32 images): the 7x7 stride-2 conv becomes a 3x3 stride-1
        conv and the maxpool goes, as in the CIFAR variants, so a 32x32 input still ends at 4x4
        instead of 1x1 and the net keeps enough resolution to learn from.
    """
    import torchvision  # imported here: only these two models need it

    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    if small_input:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


def _vision(fn, default_in_channels):
    def build(num_classes=10, in_channels=None, **kwargs):
        return fn(num_classes=num_classes,
                  in_channels=default_in_channels if in_channels is None else in_channels, **kwargs)
    build.__doc__ = fn.__doc__
    return build


def _torchvision(arch):
    def build(num_classes=10, in_channels=None, small_input=False):
        return torchvision_resnet(arch, num_classes, 3 if in_channels is None else in_channels, small_input)
    build.__doc__ = f"torchvision {arch} (weights=None); small_input=True adapts the stem to small images."
    return build


def _gpt(preset):
    def build(num_classes=None, in_channels=None, **overrides):
        # a language model has no classes or channels: its vocabulary comes from the preset or
        # from vocab_size=...; num_classes and in_channels are accepted only so get_model's
        # signature is the same for every name, and are ignored
        return GPT(gpt_config(preset, **overrides))
    build.__doc__ = f"GPT preset {preset!r}: {GPT_CONFIGS[preset]}; kwargs override GPTConfig fields."
    return build


# name -> builder(num_classes, in_channels, **kwargs)
MODELS = {
    "resnet8": _vision(resnet8, 1),
    "resnet9": _vision(resnet9, 1),
    "resnet20": _vision(resnet20, 3),
    "resnet56": _vision(resnet56, 3),
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
    "resnet101": _torchvision("resnet101"),
    **{name: _gpt(name) for name in GPT_CONFIGS},
    "unet": _vision(UNet, 1),
}


LIBRARIES = ("torchvision", "timm")  # get_model("torchvision:resnet18"), get_model("timm:resnet10t")


def library_model(name: str, num_classes: int, in_channels: int) -> nn.Module:
    """A classification model from torchvision or timm by ``"library:model"`` (random weights, no download),
    adapted to ``in_channels`` input channels and ``num_classes`` classes."""
    library, _, arch = name.partition(":")
    if library == "timm":
        try:
            import timm
        except ImportError:
            raise ValueError(f"model {name!r} needs timm, which is not installed; pip install timm, or pick a "
                             f"torchvision:<name> model") from None
        if arch not in timm.list_models():
            raise ValueError(f"timm has no model {arch!r}; see timm.list_models()")
        return timm.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_channels)
    if library != "torchvision":
        raise ValueError(f"unknown model library {library!r} in {name!r}; use one of {[f'{l}:<name>' for l in LIBRARIES]}")
    import torchvision

    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"{arch!r} is not a torchvision classification model; see "
                         f"torchvision.models.list_models(module=torchvision.models)")
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if in_channels != 3:
        _adapt_first_conv(model, in_channels, name)
    return model


def _adapt_first_conv(model: nn.Module, in_channels: int, name: str) -> None:
    """Replace the stem's convolution (the first Conv2d taking 3 channels) by one taking ``in_channels``."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3 and child.groups == 1:
                conv = nn.Conv2d(in_channels, child.out_channels, child.kernel_size, child.stride, child.padding,
                                 child.dilation, 1, child.bias is not None, child.padding_mode)
                setattr(parent, child_name, conv)
                return
    raise ValueError(f"{name}: found no 3-channel Conv2d stem to adapt to {in_channels} input channels")


def list_models():
    """The names get_model accepts."""
    return list(MODELS)


def get_model(name, num_classes=10, in_channels=None, **kwargs):
    """
    Build a registered model with random weights.

    num_classes: output classes for vision models (ignored by GPTs, whose vocab_size comes from the
        preset or a vocab_size= kwarg). in_channels: None means the model's own default (1 for the
        Fashion-MNIST ResNets and the UNet, 3 for the CIFAR/torchvision ResNets).
    kwargs: passed to the builder, e.g. width= for resnet8/9, small_input= for resnet18/50,
        base=/depth= for unet, any GPTConfig field for the GPT presets.
    """
    if name.startswith(HF_PREFIX):
        return hf_causal_lm(name, **kwargs)
    if name.partition(":")[0] in LIBRARIES:
        return library_model(name, num_classes, 3 if in_channels is None else in_channels)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name](num_classes=num_classes, in_channels=in_channels, **kwargs)


__all__ = [
    "get_model", "library_model", "list_models", "MODELS", "torchvision_resnet",
    "BasicBlock", "SmallResNet", "ResNet9", "resnet8", "resnet9", "resnet20", "resnet56",
    "GPT", "GPTConfig", "GPT_CONFIGS", "gpt_config", "CausalSelfAttention", "Rotary",
    "UNet",
]
