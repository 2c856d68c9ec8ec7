"""What every fractune model shares: the layer-precision map, the MACs table, the registry.

A model's ``forward(x, prec)`` runs its body at ``prec``; which other layers follow ``prec`` is the
explicit ``LayerMap`` (docs/methods.md §3, §9): the reference quantizes the stem in static / PFQ /
CPT CIFAR ResNets but keeps it fp32 in DFQ / FracTrain and on ImageNet; the FC is always fp32; the
MobileNetV2 depthwise convs run at a fixed 8/16 that no schedule changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.catalog import NAMES, LayerMap
from engine.numerics.layers import QConv2d, QLinear, quantized_layers
from engine.numerics.precision import FP32, Precision


@dataclass(frozen=True)
class LayerInfo:
    """One conv/linear layer, or an attention matmul (role ``attn``): forward MACs for one sample, or one token
    of a language model (M_l in methods.md §2), and the element counts the ``memory`` cost model prices: its
    weights, and its input and output activations for one sample (token). An attention matmul has no weights:
    both operands are activations, counted in ``inputs``."""

    name: str
    role: str
    block: int | None
    macs: int
    weights: int = 0
    inputs: int = 0
    outputs: int = 0


class ResidualBlock(nn.Module):
    """What every residual block shares: its input width, the projection shortcut (1x1 conv + BN, when the
    shape changes) and DFQ's skip path (methods.md §6.2). Subclasses build their convs, call
    ``_init_shortcut`` and implement ``forward(x, prec)``."""

    can_skip = True  # DFQ's skip option: the input (or its fp32 projection) passes through

    def _init_shortcut(self, cin: int, cout: int, stride: int, index: int, m: float, needed: bool) -> None:
        self.in_channels = cin
        self.proj = None
        self.shortcut_follows = True  # the layer map's ``shortcut`` (``QModel.set_layer_map``)
        if needed:
            self.proj = QConv2d(cin, cout, 1, stride, 0, bias=False, role="shortcut", block=index, act_momentum=m)
            self.proj_bn = nn.BatchNorm2d(cout)

    def shortcut(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        if self.proj is None:
            return x
        return self.proj_bn(self.proj(x, prec if self.shortcut_follows else FP32))

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        """DFQ skip: the identity, or the block's own projection run in fp32."""
        return self.shortcut(x, FP32)

    def skip_modules(self) -> list[nn.Module]:
        """The modules DFQ's skip path runs (whose running statistics it updates): the projection, if any."""
        return [] if self.proj is None else [self.proj, self.proj_bn]


class SpatialMean(torch.autograd.Function):
    """``h.mean(dim=(2, 3))`` whose backward hands on ``g / (H W)`` broadcast over H and W, without writing it
    out: autograd adds it into the block input's gradient in the pass it makes anyway (mean's own backward
    writes the full (B, C, H, W) tensor first). The same values: each element is the same ``g / (H W)``."""

    @staticmethod
    def forward(ctx, h):
        ctx.shape = h.shape
        return h.mean(dim=(2, 3))

    @staticmethod
    def backward(ctx, g):
        b, c, hh, ww = ctx.shape
        return (g / (hh * ww)).view(b, c, 1, 1).expand(b, c, hh, ww)


class QModel(nn.Module):
    """Base class: subclasses build ``stem``/``stem_bn``, ``self.blocks`` (an nn.ModuleList) and ``fc``; the
    forward pass is ``head(blocks(features(x)))`` with the layer map deciding each role's precision."""

    stem_quantized_by_default = True  # the reference's choice for this model family (static methods)
    shortcut_quantized_by_default = True  # the reference's choice for its projections (every method)

    def __init__(self) -> None:
        super().__init__()
        self.layer_map = LayerMap()
        self._table: list[LayerInfo] | None = None

    def set_layer_map(self, layer_map: LayerMap) -> None:
        self.layer_map = layer_map
        for block in getattr(self, "blocks", ()):
            if hasattr(block, "shortcut_follows"):  # a block resolves no role itself: it is told its projection's
                block.shortcut_follows = layer_map.shortcut  # precision rule here

    def p(self, role: str, prec: Precision) -> Precision:
        return self.layer_map.resolve(role, prec)

    def features(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        """The stem: conv + BN + ReLU."""
        return F.relu(self.stem_bn(self.stem(x, self.p("stem", prec))))

    def head(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        """Global average pooling and the FC."""
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1), self.p("fc", prec))

    def gate_summary(self, h: torch.Tensor) -> torch.Tensor:
        """What DFQ's gate reads of a block input (methods.md §6.1): the global average pool, (B, C)."""
        return SpatialMean.apply(h)

    def forward(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        x = self.features(x, prec)
        for blk in self.blocks:
            x = blk(x, prec)
        return self.head(x, prec)

    @torch.no_grad()
    def layer_table(self, input_shape: tuple[int, int, int]) -> list[LayerInfo]:
        """Forward MACs per sample of every conv/linear layer, measured by one fp32 forward of one sample.

        conv: C_out * (C_in / groups) * k_h * k_w * H_out * W_out;  linear: in * out.
        """
        if self._table is not None:
            return self._table
        macs: dict[str, int] = {}
        sizes: dict[str, tuple[int, int, int]] = {}
        names = {m: n for n, m in quantized_layers(self)}

        def hook(mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            if isinstance(mod, QConv2d):
                per_out = (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
                macs[names[mod]] = int(out[0].numel()) * per_out
            else:
                macs[names[mod]] = mod.in_features * mod.out_features
            sizes[names[mod]] = (int(mod.weight.numel()), int(inp[0][0].numel()), int(out[0].numel()))

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
        self._table = [LayerInfo(n, m.role, m.block, macs[n], *sizes[n]) for m, n in names.items() if n in macs]
        return self._table

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


def init_reference(model: nn.Module) -> None:
    """The reference's init (methods.md §3): conv N(0, sqrt(2/(k^2 C_out))), BN 1/0, linear N(0, sqrt(2/(in*out)))."""
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
    """Register a builder under ``names``, each a name of the catalog (engine.models.catalog.NAMES): configs are
    checked against the catalog without building, or importing, the zoo."""

    def deco(fn: Builder) -> Builder:
        for name in names:
            if name not in NAMES:
                raise RuntimeError(f"model {name!r} is not in engine.models.catalog.NAMES; add it there")
            MODELS[name] = fn
        return fn

    return deco


__all__ = ["LayerInfo", "LayerMap", "MODELS", "QConv2d", "QLinear", "QModel", "ResidualBlock", "init_reference",
           "register_model"]
