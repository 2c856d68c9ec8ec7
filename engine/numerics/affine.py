"""The affine grid every quantizer uses (docs/methods.md §1): its levels, the floor of its step, the resolution of
stochastic rounding's noise and the per-tensor step on the host. A module of its own below ``engine.numerics.quant``
and ``engine.numerics.fused``, so that the fused kernels' self-check compares with the same arithmetic without
importing the quantizer that loads them."""

from __future__ import annotations

import ctypes

STEP_FLOOR = 1e-8
NOISE_LEVELS = 1 << 16


def levels(bits: int) -> int:
    """qmax = 2^b - 1 (unsigned levels 0..qmax). A power, not a shift: in a compiled step the bit-width may be a
    symbolic integer (methods.md §1, "Captured steps"), and torch 2.11's compiler (the GPU machines') cannot
    trace a shift by one."""
    return 2**bits - 1


def single(v: float) -> float:
    """``v`` rounded to the nearest float32 (overflow to infinity), as a Python float."""
    return ctypes.c_float(v).value


_STEP_FLOOR_SINGLE = single(STEP_FLOOR)


def tensor_step(bits: int, lo: float, hi: float, double: bool = False) -> float:
    """The step ``s = max((hi - lo) / qmax, 1e-8)`` of a per-tensor range held in Python floats, in the quantized
    tensor's dtype: float32 by default, double for a float64 tensor (``double``). NaN in the range gives a NaN step,
    as clamp_min does.

    In float32 the width ``hi - lo`` is rounded to float32 once and divided in float32. For ends that are float32
    values (a batch's min and max) that is the float32 subtraction the device form makes from 0-d tensors, so the
    two forms quantize with the same step, bit for bit. For a running range (eval mode: ``hi = lo + range`` in
    double, both float32 values) the width is the range itself, as the reference divides its ``running_range``:
    rounding ``hi`` to float32 first would often put the step one ulp off."""
    if double:
        return max((hi - lo) / levels(bits), STEP_FLOOR)
    # a double result rounded to float32 is the float32 operation's own result for float32 operands (53 bits
    # hold twice float32's 24 plus two: no double rounding error)
    return max(single(single(hi - lo) / levels(bits)), _STEP_FLOOR_SINGLE)
