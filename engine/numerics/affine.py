"""The affine grid every quantizer uses (docs/methods.md §1): its levels, the floor of its step, the resolution of
stochastic rounding's noise and the per-tensor step on the host. A module of its own below ``engine.numerics.quant``
and ``engine.numerics.fused``, so that the fused kernels' self-check compares with the same arithmetic without
importing the quantizer that loads them."""

from __future__ import annotations

import ctypes

STEP_FLOOR = 1e-8
NOISE_LEVELS = 1 << 16


def levels(bits: int) -> int:
    """qmax = 2^b - 1 (unsigned levels 0..qmax)."""
    return (1 << bits) - 1


def single(v: float) -> float:
    """``v`` rounded to the nearest float32 (overflow to infinity), as a Python float."""
    return ctypes.c_float(v).value


_STEP_FLOOR_SINGLE = single(STEP_FLOOR)


def tensor_step(bits: int, lo: float, hi: float, double: bool = False) -> float:
    """The step ``s = max((hi - lo) / qmax, 1e-8)`` of a per-tensor range held in Python floats, computed as the
    device form computes it from 0-d tensors of the quantized tensor's dtype (``((hi - lo) / qmax).clamp_min``):
    in float32, each operation rounded to float32 (``lo`` and ``hi`` first, as torch rounds a Python float it
    meets in a float32 op), or in double for a float64 tensor (``double``). The host form and the device form
    then quantize with the same step, bit for bit. NaN in the range gives a NaN step, as clamp_min does."""
    if double:
        return max((hi - lo) / levels(bits), STEP_FLOOR)
    # float32 subtraction and division: a double result rounded to float32 is the float32 operation's own
    # result (53 bits hold twice float32's 24 plus two: no double rounding error)
    return max(single(single(single(hi) - single(lo)) / levels(bits)), _STEP_FLOOR_SINGLE)
