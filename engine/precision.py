"""Precision as an explicit value (architecture rule 2).

``Precision(act, weight, grad)`` holds the bit widths of one quantized conv/linear call:

* ``act``    -- forward activation bits ("FW" in FracTrain; the input of the layer is quantized),
* ``weight`` -- weight bits (``w``; equal to ``act`` for static/PFQ/CPT, fixed for DFQ),
* ``grad``   -- backward error bits ("BW"; the gradient dL/dY at the layer output is quantized).

A component at 32 bits is an exact fp32 bypass (algorithms.md 1.6: the reference quantizes 32-bit
tensors with 2^32-1 levels; we do not). ``FP32`` is every component at 32 and ``SKIP`` marks a DFQ
block that is not computed at all: neither is ever spelt as an overloaded 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError

FULL_BITS = 32
MIN_BITS = 1


@dataclass(frozen=True, slots=True)
class Precision:
    act: int = FULL_BITS
    weight: int = FULL_BITS
    grad: int = FULL_BITS
    skip: bool = False

    def __post_init__(self) -> None:
        for name in ("act", "weight", "grad"):
            bits = getattr(self, name)
            if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= FULL_BITS:
                raise ConfigError.single(f"precision.{name}", bits, f"allowed: an integer {MIN_BITS}..{FULL_BITS}")

    @classmethod
    def fwbw(cls, fw: int, bw: int, weight: int | None = None) -> Precision:
        """FWn/BWm as the papers write it; weights at ``fw`` unless given."""
        return cls(act=fw, weight=fw if weight is None else weight, grad=bw)

    @property
    def is_fp32(self) -> bool:
        return not self.skip and self.act >= FULL_BITS and self.weight >= FULL_BITS and self.grad >= FULL_BITS

    def bitops_per_mac(self) -> int:
        """a*w + g*w + a*g: the FW, EB and GC passes of one MAC (algorithms.md 6.1). 0 when skipped."""
        if self.skip:
            return 0
        return self.act * self.weight + self.grad * self.weight + self.act * self.grad

    def __str__(self) -> str:
        if self.skip:
            return "SKIP"
        if self.is_fp32:
            return "FP32"
        w = "" if self.weight == self.act else f"/W{self.weight}"
        return f"FW{self.act}/BW{self.grad}{w}"


FP32 = Precision()
SKIP = Precision(skip=True)
