"""
Small-image ResNets: ResNet-8 and ResNet-9 for 28x28 inputs (Fashion-MNIST), and the He et al.
(2016) CIFAR ResNet-20 / ResNet-56 for 32x32 inputs.

The residual-block protocol
---------------------------
Methods that do surgery (stochastic depth, identity init, ...) must find residual blocks without
knowing this file's classes. Every residual block here, `BasicBlock`, follows a small protocol,
and any block from another library that follows it gets the same treatment:

    block.branch    an nn.Sequential: the residual branch, ending in its last BatchNorm
    block.shortcut  nn.Identity when the shape is kept, else a Sequential (1x1 conv + BatchNorm)
    block(x)        == relu(block.branch(x) + block.shortcut(x))

so that
  * stochastic depth can skip `branch` (output becomes relu(shortcut(x))) or scale it,
  * identity init can zero `branch[-1].weight` (the last BN's scale), making each block start as
    relu(shortcut(x)), i.e. close to the identity, which lets deep nets train at high LR early.

The other named parts every model here exposes: `model.stem` (a Sequential whose first module is
the first conv, which patch-whitening init replaces), and `model.fc` (the final Linear, named like
torchvision's so a method that looks for "the classifier" finds it in both).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(in_ch, out_ch, kernel_size=3, stride=1):
    """Conv without bias (the BatchNorm after it has one) followed by BatchNorm."""
    return [
        nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_ch),
    ]


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn residual branch plus a shortcut; see the protocol in the module docstring."""

    def __init__(self, in_ch, out_ch, stride=1):
        super().__init__()
        self.branch = nn.Sequential(
            *conv_bn(in_ch, out_ch, 3, stride),
            nn.ReLU(inplace=True),
            *conv_bn(out_ch, out_ch, 3, 1),
        )
        if stride != 1 or in_ch != out_ch:
            # projection shortcut (He et al. option B): the shape changes, so the identity can't be added
            self.shortcut = nn.Sequential(*conv_bn(in_ch, out_ch, 1, stride))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x):
        return F.relu(self.branch(x) + self.shortcut(x))


def init_weights(model):
    """Kaiming-normal convs (fan_out, as torchvision does: keeps activation variance steady through
    ReLU layers), BN at scale 1 / shift 0; Linear keeps PyTorch's default (uniform, by fan_in)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class SmallResNet(nn.Module):
    """
    stem conv -> stages of BasicBlocks -> global average pool -> Linear. The first block of stage i
    has stride strides[i] (default 1, 2, 2, ...: keep the stem's resolution, then halve) and
    changes the width; the rest keep both.

    ResNet-8:  stem + 3 stages x 1 block, all stages strided (1 + 3*2 convs + fc = 8 layers)
    ResNet-20: stem + 3 stages x 3 blocks (1 + 9*2 + 1 = 20);  ResNet-56: 3 stages x 9 blocks.
    """

    def __init__(self, widths, blocks_per_stage, num_classes=10, in_channels=3, stem_width=None,
                 strides=None):
        super().__init__()
        stem_width = stem_width or widths[0]
        strides = strides or [1] + [2] * (len(widths) - 1)  # keep the stem's resolution, then halve
        self.stem = nn.Sequential(*conv_bn(in_channels, stem_width, 3, 1), nn.ReLU(inplace=True))
        stages, in_ch = [], stem_width
        for i, (width, n_blocks) in enumerate(zip(widths, blocks_per_stage)):
            blocks = []
            for j in range(n_blocks):
                stride = strides[i] if j == 0 else 1
                blocks.append(BasicBlock(in_ch, width, stride))
                in_ch = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class ResNet9(nn.Module):
    """
    The DAWNBench ResNet-9 (David Page, "How to train your ResNet"; airbench's ancestor), narrowed
    for 28x28 grayscale input. Widths w, 2w, 4w, 8w:

        stem:   conv(in -> w)                                   28x28
        layer1: conv(w -> 2w), maxpool 2    + BasicBlock(2w)    14x14
        layer2: conv(2w -> 4w), maxpool 2                        7x7
        layer3: conv(4w -> 8w), maxpool 2   + BasicBlock(8w)     3x3
        head:   global max pool -> Linear -> x logit_scale

    Differences from the original: its residual was x + relu(bn(conv(relu(bn(conv(x)))))); here the
    residual parts are `BasicBlock`s so they follow the protocol (relu after the sum instead). The
    input to each block is already post-ReLU, so the two agree up to where the last ReLU sits.
    The logits are multiplied by 0.125 (the original's `Mul(0.125)`): it keeps the initial softmax
    soft, which the high learning rates this net is trained with rely on.
    """

    def __init__(self, num_classes=10, in_channels=1, width=16, logit_scale=0.125):
        super().__init__()
        w = width

        def conv_pool(in_ch, out_ch):
            # conv at the input resolution then pool: the layout Page found fastest to train
            return nn.Sequential(*conv_bn(in_ch, out_ch), nn.ReLU(inplace=True), nn.MaxPool2d(2))

        self.stem = nn.Sequential(*conv_bn(in_channels, w), nn.ReLU(inplace=True))
        self.layer1 = nn.Sequential(conv_pool(w, 2 * w), BasicBlock(2 * w, 2 * w))
        self.layer2 = conv_pool(2 * w, 4 * w)
        self.layer3 = nn.Sequential(conv_pool(4 * w, 8 * w), BasicBlock(8 * w, 8 * w))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Linear(8 * w, num_classes, bias=False)
        self.logit_scale = logit_scale
        init_weights(self)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1)) * self.logit_scale


# ---------------------------------------------------------------------------------------------
# constructors

def resnet8(num_classes=10, in_channels=1, width=16):
    """
    ResNet-8 for 28x28 input: a stem conv of width w at 28x28, then three one-block stages of
    widths 2w, 4w, 8w (32/64/128 by default) at 14, 7 and 4 pixels.

    Why every stage is strided: on a CPU the cost of a small net is mostly memory traffic at full
    resolution, not FLOPs. Moving the first stage from 28x28 to 14x14 let it be twice as wide for about
    the same step time, with 4x the parameters, and it trained to higher accuracy in the same epochs.
    The measurements behind the choice: bench/results/2026-12-03-design-notes/design_notes.json (resnet8).
    """
    return SmallResNet([2 * width, 4 * width, 8 * width], [1, 1, 1], num_classes, in_channels,
                       stem_width=width, strides=[2, 2, 2])


def resnet9(num_classes=10, in_channels=1, width=16):
    """DAWNBench-style ResNet-9 for 28x28 input, widths w, 2w, 4w, 8w (see ResNet9). Slower per step
    than resnet8 but more accurate per epoch (bench/results/2026-12-03-design-notes/design_notes.json, resnet9)."""
    return ResNet9(num_classes, in_channels, width)


def resnet20(num_classes=10, in_channels=3):
    """He et al. 2016 CIFAR ResNet-20: widths 16/32/64, 3 blocks per stage (~0.27M params)."""
    return SmallResNet([16, 32, 64], [3, 3, 3], num_classes, in_channels)


def resnet56(num_classes=10, in_channels=3):
    """He et al. 2016 CIFAR ResNet-56: widths 16/32/64, 9 blocks per stage (~0.86M params)."""
    return SmallResNet([16, 32, 64], [9, 9, 9], num_classes, in_channels)
