"""What every fractune model shares: the layer-precision map, the MACs table, the registry.

A model's ``forward(x, prec)`` runs its body at ``prec``; which other layers follow ``prec`` is the
explicit ``LayerMap`` (algorithms.md 1.7 and 10.8): the reference quantizes the stem in static / PFQ /
CPT CIFAR ResNets but keeps it fp32 in DFQ / FracTrain and on ImageNet; the FC is always fp32; the
MobileNetV2 depthwise convs run at a fixed 8/16 that no schedule changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.layers import QConv2d, QLinear, quantized_layers
from engine.precision import FP32, Precision


@dataclass(frozen=True)
class LayerMap:
    """Which layer roles follow the scheduled precision; the rest run fp32 (or at a fixed precision)."""

    stem: bool = True
    fc: bool = False
    head: bool = True
    depthwise: Precision | None = None  # fixed precision of depthwise convs; None: follow the schedule

    def resolve(self, role: str, prec: Precision) -> Precision:
        """The precision a layer of ``role`` runs at when the schedule says ``prec``."""
        if prec.is_fp32 or role == "body":
            return prec
        if role == "depthwise":
            return self.depthwise if self.depthwise is not None else prec
        follows = {"stem": self.stem, "fc": self.fc, "head": self.head}[role]
        return prec if follows else FP32


@dataclass(frozen=True)
class LayerInfo:
    """One conv/linear layer: forward MACs for one sample (M_l in algorithms.md 6.1)."""

    name: str
    role: str
    block: int | None
    macs: int


class QModel(nn.Module):
    """Base class: subclasses build ``self.blocks`` (an nn.ModuleList) and implement ``forward``."""

    stem_quantized_by_default = True  # the reference's choice for this model family (static methods)

    def __init__(self) -> None:
        super().__init__()
        self.layer_map = LayerMap()
        self._table: list[LayerInfo] | None = None

    def set_layer_map(self, layer_map: LayerMap) -> None:
        self.layer_map = layer_map

    def p(self, role: str, prec: Precision) -> Precision:
        return self.layer_map.resolve(role, prec)

    @torch.no_grad()
    def layer_table(self, input_shape: tuple[int, int, int]) -> list[LayerInfo]:
        """Forward MACs per sample of every conv/linear layer, measured by one fp32 forward of one sample.

        conv: C_out * (C_in / groups) * k_h * k_w * H_out * W_out;  linear: in * out.
        """
        if self._table is not None:
            return self._table
        macs: dict[str, int] = {}
        names = {m: n for n, m in quantized_layers(self)}

        def hook(mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            if isinstance(mod, QConv2d):
                per_out = (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
                macs[names[mod]] = int(out[0].numel()) * per_out
            else:
                macs[names[mod]] = mod.in_features * mod.out_features

        handles = [m.register_forward_hook(hook) for m in names]
        was_training = self.training
        self.eval()
        try:
            device = next(self.parameters()).device
            self.forward(torch.zeros((1, *input_shape), device=device), FP32)
        finally:
            self.train(was_training)
            for h in handles:
                h.remove()
        self._table = [LayerInfo(n, m.role, m.block, macs[n]) for m, n in names.items() if n in macs]
        return self._table

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


def init_reference(model: nn.Module) -> None:
    """The reference's init (algorithms.md 7): conv N(0, sqrt(2/(k^2 C_out))), BN 1/0, linear N(0, sqrt(2/(in*out)))."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            nn.init.normal_(m.weight, 0.0, (2.0 / n) ** 0.5)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, (2.0 / (m.in_features * m.out_features)) ** 0.5)


Builder = Callable[..., QModel]
MODELS: dict[str, Builder] = {}


def register_model(*names: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        for name in names:
            MODELS[name] = fn
        return fn

    return deco


__all__ = ["LayerInfo", "LayerMap", "MODELS", "QConv2d", "QLinear", "QModel", "init_reference", "register_model"]
