"""The affine grid every quantizer uses (docs/methods.md §1): its levels, the floor of its step, the resolution of
stochastic rounding's noise and the per-tensor map onto the levels. A module of its own below ``engine.numerics.quant`` and
``engine.numerics.fused``, so that the fused kernels' self-check compares with the same arithmetic without importing the
quantizer that loads them."""

from __future__ import annotations

STEP_FLOOR = 1e-8
NOISE_LEVELS = 1 << 16


def levels(bits: int) -> int:
    """qmax = 2^b - 1 (unsigned levels 0..qmax)."""
    return (1 << bits) - 1


def tensor_affine(bits: int, lo: float, hi: float, drawn: bool) -> tuple[float, float, float]:
    """Per-tensor ``quantize`` over [lo, hi] as ``u = x * inv + offset`` on the levels and ``u * step + lo``
    back: (inv, offset, step). ``drawn``: the offset carries the +0.5 of drawn noise n = (v + 0.5) / 2^16."""
    step = max((hi - lo) / levels(bits), STEP_FLOOR)
    inv = 1.0 / step
    return inv, -lo * inv + (0.5 / NOISE_LEVELS if drawn else 0.0), step
