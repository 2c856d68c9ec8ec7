"""CIFAR ResNets (SkipNet definition, docs/methods.md §3): ResNet-(6n+2) and the bottleneck ResNet-164.

Stem 3x3 conv C_in->16 + BN + ReLU; three groups of n blocks at widths 16/32/64 (spatial 32/16/8 on CIFAR);
stride 2 at the first block of groups 2 and 3 with a 1x1 stride-2 conv + BN projection; global average
pooling (adaptive, so 28x28 Fashion-MNIST and 8x8 digits work too) and an FC head.
The bottleneck variant (ResNet-164 = 9n+2, n = 18) uses 1x1 -> 3x3 -> 1x1 blocks with expansion 4; it
is not defined in either reference repo, so it follows He et al. (2016).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import QConv2d, QLinear, QModel, ResidualBlock, init_reference, register_model
from engine.numerics.precision import Precision


class BasicBlock(ResidualBlock):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, index: int, m: float):
        super().__init__()
        cout = planes
        self.conv1 = QConv2d(cin, cout, 3, stride, 1, bias=False, block=index, act_momentum=m)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = QConv2d(cout, cout, 3, 1, 1, bias=False, block=index, act_momentum=m)
        self.bn2 = nn.BatchNorm2d(cout)
        self._init_shortcut(cin, cout, stride, index, m, needed=stride != 1 or cin != cout)

    def forward(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x, prec)))
        out = self.bn2(self.conv2(out, prec))
        return F.relu(out + self.shortcut(x, prec))


class Bottleneck(ResidualBlock):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, index: int, m: float):
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = QConv2d(cin, planes, 1, 1, 0, bias=False, block=index, act_momentum=m)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = QConv2d(planes, planes, 3, stride, 1, bias=False, block=index, act_momentum=m)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = QConv2d(planes, cout, 1, 1, 0, bias=False, block=index, act_momentum=m)
        self.bn3 = nn.BatchNorm2d(cout)
        self._init_shortcut(cin, cout, stride, index, m, needed=stride != 1 or cin != cout)

    def forward(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x, prec)))
        out = F.relu(self.bn2(self.conv2(out, prec)))
        out = self.bn3(self.conv3(out, prec))
        return F.relu(out + self.shortcut(x, prec))


class CifarResNet(QModel):
    def __init__(
        self,
        block: type[nn.Module],
        n: int,
        in_channels: int,
        num_classes: int,
        act_momentum: float = 0.9,
        widths: tuple[int, ...] = (16, 32, 64),
    ):
        super().__init__()
        self.stem = QConv2d(in_channels, widths[0], 3, 1, 1, bias=False, role="stem", act_momentum=act_momentum)
        self.stem_bn = nn.BatchNorm2d(widths[0])
        blocks: list[nn.Module] = []
        cin = widths[0]
        for g, planes in enumerate(widths):
            for i in range(n):
                stride = 2 if (g > 0 and i == 0) else 1
                blocks.append(block(cin, planes, stride, len(blocks), act_momentum))
                cin = planes * block.expansion
        self.blocks = nn.ModuleList(blocks)
        self.fc = QLinear(cin, num_classes, role="fc", act_momentum=act_momentum)
        init_reference(self)


def _basic(depth: int):
    def build(in_channels: int = 3, num_classes: int = 10, act_momentum: float = 0.9) -> CifarResNet:
        return CifarResNet(BasicBlock, (depth - 2) // 6, in_channels, num_classes, act_momentum)

    build.__doc__ = f"CIFAR ResNet-{depth} ({(depth - 2) // 6} basic blocks per group)."
    return build


for _depth in (8, 14, 20, 38, 74, 110):
    register_model(f"resnet{_depth}")(_basic(_depth))


@register_model("resnet164")
def resnet164(in_channels: int = 3, num_classes: int = 10, act_momentum: float = 0.9) -> CifarResNet:
    """CIFAR ResNet-164: 18 bottleneck blocks per group, outputs 64/128/256 channels."""
    return CifarResNet(Bottleneck, 18, in_channels, num_classes, act_momentum)


@register_model("tiny")
def tiny(in_channels: int = 3, num_classes: int = 10, act_momentum: float = 0.9) -> CifarResNet:
    """A two-block ResNet (widths 8/16) for one-step tests."""
    return CifarResNet(BasicBlock, 1, in_channels, num_classes, act_momentum, widths=(8, 16))
