"""MobileNetV2 for CIFAR (docs/methods.md §3; the E2-Train / kuangliu definition the reference uses).

Stem 3x3 stride 1 to 32 channels; 17 inverted-residual blocks (expansion, out, count, stride):
(1,16,1,1) (6,24,2,1) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1); the residual is added
only at stride 1, through a 1x1 conv + BN when the widths differ; head 1x1 conv 320->1280, global average
pooling, FC. Depthwise convs have role ``depthwise`` (fixed 8/16 in the reference, not scheduled).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import QConv2d, QLinear, QModel, ResidualBlock, register_model
from engine.numerics.precision import Precision

CFG = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


class InvertedResidual(ResidualBlock):
    def __init__(self, cin: int, cout: int, expansion: int, stride: int, index: int, m: float, depthwise):
        super().__init__()
        hidden = expansion * cin
        self.stride = stride
        self.can_skip = stride == 1  # a stride-2 block changes the shape: it cannot be skipped
        self.depthwise_role = depthwise
        self.conv1 = QConv2d(cin, hidden, 1, 1, 0, bias=False, block=index, act_momentum=m)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.conv2 = QConv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False, role="depthwise",
                             block=index, act_momentum=m)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.conv3 = QConv2d(hidden, cout, 1, 1, 0, bias=False, block=index, act_momentum=m)
        self.bn3 = nn.BatchNorm2d(cout)
        self._init_shortcut(cin, cout, 1, index, m, needed=stride == 1 and cin != cout)

    def forward(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x, prec)))
        out = F.relu(self.bn2(self.conv2(out, self.depthwise_role(prec))))
        out = self.bn3(self.conv3(out, prec))
        return out + self.shortcut(x, prec) if self.stride == 1 else out


class MobileNetV2(QModel):
    def __init__(self, in_channels: int = 3, num_classes: int = 10, act_momentum: float = 0.9):
        super().__init__()
        m = act_momentum
        self.stem = QConv2d(in_channels, 32, 3, 1, 1, bias=False, role="stem", act_momentum=m)
        self.stem_bn = nn.BatchNorm2d(32)
        blocks: list[nn.Module] = []
        cin = 32
        for expansion, cout, count, stride in CFG:
            for i in range(count):
                blocks.append(InvertedResidual(cin, cout, expansion, stride if i == 0 else 1, len(blocks), m,
                                               lambda p: self.p("depthwise", p)))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.head_conv = QConv2d(320, 1280, 1, 1, 0, bias=False, role="head", act_momentum=m)
        self.head_bn = nn.BatchNorm2d(1280)
        self.fc = QLinear(1280, num_classes, role="fc", act_momentum=m)

    def head(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        """The 1x1 head conv 320 -> 1280 (role ``head``), then pooling and the FC."""
        return super().head(F.relu(self.head_bn(self.head_conv(x, self.p("head", prec)))), prec)


register_model("mobilenetv2")(MobileNetV2)
