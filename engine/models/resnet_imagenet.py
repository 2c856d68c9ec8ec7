"""ImageNet ResNet-18/34 (He et al. 2016), with quantized block convs.

7x7 stride-2 stem + 3x3 stride-2 max pool; four stages of basic blocks (64/128/256/512 channels,
[2,2,2,2] or [3,4,6,3]); global average pooling; FC. The reference keeps the 7x7 stem, the blocks' 1x1
projections and the FC in fp32 on ImageNet (docs/methods.md §3), so this family's default layer map does too.
Any input size works (adaptive pooling), 28x28 Fashion-MNIST included.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import QConv2d, QLinear, QModel, register_model
from engine.models.resnet_cifar import BasicBlock
from engine.numerics.precision import Precision


class ImageNetResNet(QModel):
    stem_quantized_by_default = False
    shortcut_quantized_by_default = False  # the reference's projections are plain nn.Conv2d (CPT, FracTrain)

    def __init__(self, layers: tuple[int, ...], in_channels: int, num_classes: int, act_momentum: float):
        super().__init__()
        m = act_momentum
        self.stem = QConv2d(in_channels, 64, 7, 2, 3, bias=False, role="stem", act_momentum=m)
        self.stem_bn = nn.BatchNorm2d(64)
        blocks: list[nn.Module] = []
        cin = 64
        for stage, (count, planes) in enumerate(zip(layers, (64, 128, 256, 512))):
            for i in range(count):
                stride = 2 if (stage > 0 and i == 0) else 1
                blocks.append(BasicBlock(cin, planes, stride, len(blocks), m))
                cin = planes
        self.blocks = nn.ModuleList(blocks)
        self.fc = QLinear(512, num_classes, role="fc", act_momentum=m)
        for mod in self.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(mod, nn.BatchNorm2d):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)

    def features(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        """The 7x7 stem, then a 3x3 stride-2 max pool."""
        return F.max_pool2d(super().features(x, prec), 3, 2, 1)


@register_model("resnet18")
def resnet18(in_channels: int = 3, num_classes: int = 1000, act_momentum: float = 0.9) -> ImageNetResNet:
    return ImageNetResNet((2, 2, 2, 2), in_channels, num_classes, act_momentum)


@register_model("resnet34")
def resnet34(in_channels: int = 3, num_classes: int = 1000, act_momentum: float = 0.9) -> ImageNetResNet:
    return ImageNetResNet((3, 4, 6, 3), in_channels, num_classes, act_momentum)
