"""Precision as an explicit value (architecture rule 2; docs/methods.md §1).

``Precision(act=, weight=, grad=)`` holds the bit widths of one quantized conv/linear call (keyword-only, so a
call site always says which number is which):

* ``act``    -- forward activation bits ("FW" in FracTrain; the input of the layer is quantized),
* ``weight`` -- weight bits (``w``; equal to ``act`` for static/PFQ/CPT, fixed for DFQ),
* ``grad``   -- backward error bits ("BW"; the gradient dL/dY at the layer output is quantized).

``Precision.fwbw(fw, bw, weight=None)`` is the papers' FWn/BWm spelling. A component at 32 bits is an exact
fp32 bypass (the reference quantizes 32-bit tensors with 2^32-1 levels; we do not, methods.md §9). ``FP32``
is every component at 32 and ``SKIP`` marks a DFQ block that is not computed at all: neither is ever spelt as
an overloaded 0.

``pass_bits()`` is the one cost-per-MAC formula of the project (methods.md §2): the bit products of the FW
(a*w), EB (g*w) and GC (a*g) passes of one MAC; every BitOPs figure and DFQ's kappa derive from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import ConfigError

if TYPE_CHECKING:  # the config reads precisions without loading torch
    import torch

FULL_BITS = 32
MIN_BITS = 1
FP32_BITOPS_PER_MAC = 3 * FULL_BITS * FULL_BITS  # 3072: the three passes of one MAC at 32x32


BITS_ALLOWED = f"allowed: an integer {MIN_BITS}..{FULL_BITS}"


def valid_bits(value: object) -> bool:
    """The one bit-width rule: an integer MIN_BITS..FULL_BITS (not a bool), for a config's ``Bits`` fields
    (engine.config.types) and for a ``Precision`` built directly."""
    return not isinstance(value, bool) and isinstance(value, int) and MIN_BITS <= value <= FULL_BITS


def parse_fwbw(text: str) -> tuple[int, int]:
    """``FW/BW`` as a user writes it (``4/8``, ``04/12``): the two bit widths, ASCII digits only (``int`` would
    read other scripts' digits too), each 1..32; ``ValueError`` for anything else. The one reading of a DFQ
    option and of ``fractune cost --precision``."""
    m = re.fullmatch(r"([0-9]{1,2})/([0-9]{1,2})", text)
    if not m or not (valid_bits(int(m[1])) and valid_bits(int(m[2]))):
        raise ValueError(text)
    return int(m[1]), int(m[2])


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    act: int = FULL_BITS
    weight: int = FULL_BITS
    grad: int = FULL_BITS
    skip: bool = False

    def __post_init__(self) -> None:
        for name in ("act", "weight", "grad"):
            bits = getattr(self, name)
            if not valid_bits(bits):
                raise ConfigError.single(f"precision.{name}", bits, BITS_ALLOWED)

    @classmethod
    def fwbw(cls, fw: int, bw: int, weight: int | None = None) -> Precision:
        """FWn/BWm as the papers write it; weights at ``fw`` unless given."""
        return cls(act=fw, weight=fw if weight is None else weight, grad=bw)

    @property
    def is_fp32(self) -> bool:
        return not self.skip and self.act >= FULL_BITS and self.weight >= FULL_BITS and self.grad >= FULL_BITS

    def pass_bits(self) -> tuple[int, int, int]:
        """(a*w, g*w, a*g): the operand-bit products of the FW, EB and GC passes of one MAC; 0s when skipped."""
        if self.skip:
            return 0, 0, 0
        return self.act * self.weight, self.grad * self.weight, self.act * self.grad

    def bitops_per_mac(self) -> int:
        """a*w + g*w + a*g: the BitOPs of one MAC over the three training passes (methods.md §2)."""
        return sum(self.pass_bits())

    def relative_cost(self) -> float:
        """BitOPs per MAC against the same MAC in FP32 (FW8/BW8: 0.0625); DFQ's kappa / 3."""
        return self.bitops_per_mac() / FP32_BITOPS_PER_MAC

    def __str__(self) -> str:
        if self.skip:
            return "SKIP"
        if self.is_fp32:
            return "FP32"
        w = "" if self.weight == self.act else f"/W{self.weight}"
        return f"FW{self.act}/BW{self.grad}{w}"


FP32 = Precision()
SKIP = Precision(skip=True)


@dataclass(frozen=True, slots=True, eq=False)
class ConvMix:
    """The input mixing of execution ``conv`` (FracTrain's ImageNet gated ResNet, methods.md §6.3): every
    quantized layer of the block also forms ``sum_k m_k Qa_k(x)``, whose value is the chosen option's input and
    whose gradient gives the gate's mask ``m_k`` the product ``<dL/dx, Qa_k(x)>`` per sample. ``mask``: the (B, K)
    straight-through masks, rows in the pass's order; ``acts``: the K options' FW bits."""

    mask: torch.Tensor
    acts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MixedPrecision:
    """Per-sample precision of one batch (DFQ's routed execution, methods.md §6.3): the batch's samples are
    sorted so that each option's samples are contiguous, ``groups`` holds ``(start, end, Precision)`` per
    option present, and every option shares the weight bits ``weight`` (DFQ's fixed ``weight_bits``). A
    quantized layer quantizes each group's input rows at the group's FW bits (one range for the whole batch)
    and each group's rows of dL/dY at its BW bits, then runs one conv for the whole batch. ``mix``: the input
    mixing of execution ``conv``, or None."""

    groups: tuple[tuple[int, int, Precision], ...]
    weight: int
    skip: bool = False
    mix: ConvMix | None = None

    @property
    def is_fp32(self) -> bool:
        return False

    def __str__(self) -> str:
        return "mixed(" + ", ".join(f"{e - s}x{p}" for s, e, p in self.groups) + ")"
