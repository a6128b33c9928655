"""
A small UNet for segmentation (Ronneberger et al. 2015), with BatchNorm and same-padding so the
output has the input's height and width.

    input -> DoubleConv(base) ──────────────────────────────> concat -> DoubleConv -> 1x1 conv -> logits
               └ pool -> DoubleConv(2*base) ─────> concat -> DoubleConv ┘ up
                          └ pool -> ... (depth times) ... ┘ up

H and W must be divisible by 2**depth, since each level halves them and the decoder doubles back.
Output: [N, num_classes, H, W] logits (use cross-entropy against [N, H, W] class indices).
"""

import torch
import torch.nn as nn


class DoubleConv(nn.Sequential):
    """(conv3x3 - BN - ReLU) x 2: the unit at every level of the UNet."""

    def __init__(self, in_ch, out_ch):
        super().__init__(
            nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False), nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True),
            nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False), nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True),
        )


class UNet(nn.Module):

    def __init__(self, in_channels=1, num_classes=2, base=16, depth=3):
        super().__init__()
        self.depth = depth
        widths = [base * 2 ** i for i in range(depth + 1)]  # e.g. 16, 32, 64, 128
        self.inc = DoubleConv(in_channels, widths[0])
        self.pool = nn.MaxPool2d(2)
        self.down = nn.ModuleList([DoubleConv(widths[i], widths[i + 1]) for i in range(depth)])
        # decoder, deepest first: upsample (learned, halving the channels), concat the skip, DoubleConv
        self.up = nn.ModuleList([nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                 for i in reversed(range(depth))])
        self.up_conv = nn.ModuleList([DoubleConv(2 * widths[i], widths[i]) for i in reversed(range(depth))])
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # the 1x1 logit conv keeps PyTorch's default init: no ReLU follows it, so Kaiming's gain doesn't apply
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x):
        H, W = x.shape[-2:]
        if H % 2 ** self.depth or W % 2 ** self.depth:
            raise ValueError(f"UNet(depth={self.depth}) needs H and W divisible by {2 ** self.depth}, got {H}x{W}")
        skips = [self.inc(x)]
        for down in self.down:
            skips.append(down(self.pool(skips[-1])))
        x = skips.pop()
        for up, conv in zip(self.up, self.up_conv):
            x = conv(torch.cat([skips.pop(), up(x)], dim=1))
        return self.head(x)
