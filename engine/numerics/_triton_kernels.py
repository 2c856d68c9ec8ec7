"""The Triton kernels of ``engine/numerics/gpu_kernels.py`` (docs/methods.md §1, "GPU kernels"); imported at first use,
since Triton reads ``TRITON_INTERPRET`` when a kernel is defined. ``gpu_kernels`` holds the arithmetic's contract."""

import triton
import triton.language as tl


@triton.jit
def _round_levels(u, qmax, STOCHASTIC: tl.constexpr, seed, offs):
    if STOCHASTIC:
        v = (tl.randint(seed, offs) & 0xFFFF).to(tl.int16).to(tl.float32)  # uniform on [-2^15, 2^15)
        u = u + 0.5 * 1.52587890625e-05
        u = u + v * 1.52587890625e-05
    u = tl.where(u < 0.0, 0.0, u)  # comparisons with NaN are false: NaN passes through, as torch's clamp
    u = tl.where(u > qmax, qmax, u)
    # half to even: below 2^23, adding 2^23 leaves no fraction bits and the FPU rounds to nearest even
    return tl.where(u < 8388608.0, (u + 8388608.0) - 8388608.0, u)


@triton.jit
def _step(lo, hi, qmax):
    # the width in float32: a float64 ``hi`` (a running range's end, ``lo + range`` held exactly) gives the range
    s = tl.math.div_rn((hi - lo).to(tl.float32), qmax)
    return tl.where(s < 1e-8, 1e-8, s)


@triton.jit
def _key(seed_ptr, STOCHASTIC: tl.constexpr):
    """The Philox key of this call (drawn from torch's generator by the caller); 0 for nearest rounding."""
    seed = 0
    if STOCHASTIC:
        seed = tl.load(seed_ptr)
    return seed


@triton.jit
def _fake_quant(x, lo, s, qmax, STOCHASTIC: tl.constexpr, seed, offs):
    """x on the levels of [lo, lo + qmax * s] and back: the quantizer's whole chain on one block."""
    return _round_levels(tl.math.div_rn(x - lo, s), qmax, STOCHASTIC, seed, offs) * s + lo


@triton.jit
def _nan_min_max(x, valid):
    """(min, max) of the valid elements, NaN where any is NaN (as torch.aminmax)."""
    has_nan = tl.sum(((x != x) & valid).to(tl.int32), axis=0) > 0
    mn = tl.min(tl.where(valid, x, float("inf")), axis=0)
    mx = tl.max(tl.where(valid, x, float("-inf")), axis=0)
    return tl.where(has_nan, float("nan"), mn), tl.where(has_nan, float("nan"), mx)


@triton.jit
def _range_step(x, valid, mn, mx, nans):
    """One block folded into per-lane running minima, maxima and NaN counts (reduced once, by ``_range_end``)."""
    nans += ((x != x) & valid).to(tl.int32)
    return tl.minimum(mn, tl.where(valid, x, float("inf"))), tl.maximum(mx, tl.where(valid, x, float("-inf"))), nans


@triton.jit
def _range_end(mn, mx, nans):
    bad = tl.sum(nans, axis=0) > 0
    return tl.where(bad, float("nan"), tl.min(mn, axis=0)), tl.where(bad, float("nan"), tl.max(mx, axis=0))


@triton.jit
def partial_range(x_ptr, part_ptr, n, per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * per_program
    lo, hi = _row_min_max(x_ptr, start, tl.minimum(per_program, n - start), BLOCK)  # this program's share
    tl.store(part_ptr + 2 * pid, lo)
    tl.store(part_ptr + 2 * pid + 1, hi)


@triton.jit
def quant_tensor(x_ptr, out_ptr, n, per_program, qmax, lo_ptr, hi_ptr, part_ptr, n_parts, run_lo_ptr, run_range_ptr,
                 keep, take, seed_ptr, FROM_PARTS: tl.constexpr, OBSERVE: tl.constexpr, STOCHASTIC: tl.constexpr,
                 BLOCK: tl.constexpr, PARTS: tl.constexpr):
    pid = tl.program_id(0)
    if FROM_PARTS:
        k = tl.arange(0, PARTS)
        have = k < n_parts
        lo, _x = _nan_min_max(tl.load(part_ptr + 2 * k, mask=have, other=0.0), have)
        _y, hi = _nan_min_max(tl.load(part_ptr + 2 * k + 1, mask=have, other=0.0), have)
        if OBSERVE:
            if pid == 0:  # run = m * run + (1 - m) * batch, the order of layers.py's torch ops
                run_lo = tl.load(run_lo_ptr)
                run_range = tl.load(run_range_ptr)
                tl.store(run_lo_ptr, run_lo * keep + take * lo)
                tl.store(run_range_ptr, run_range * keep + take * (hi - lo))
    else:
        lo = tl.load(lo_ptr)
        hi = tl.load(hi_ptr)
    s = _step(lo, hi, qmax)
    seed = _key(seed_ptr, STOCHASTIC)
    start = pid.to(tl.int64) * per_program
    for i in range(0, per_program, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        valid = (offs < n) & (i + tl.arange(0, BLOCK) < per_program)
        x = tl.load(x_ptr + offs, mask=valid, other=0.0)
        tl.store(out_ptr + offs, _fake_quant(x, lo, s, qmax, STOCHASTIC, seed, offs), mask=valid)


@triton.jit
def _row_min_max(ptr, base, row_len, BLOCK: tl.constexpr):
    """(min, max) of the row_len values from ptr + base, NaN where any is NaN."""
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    nans = tl.zeros([BLOCK], tl.int32)
    for i in range(0, row_len, BLOCK):
        cols = i + tl.arange(0, BLOCK)
        valid = cols < row_len
        mn, mx, nans = _range_step(tl.load(ptr + base + cols, mask=valid, other=0.0), valid, mn, mx, nans)
    return _range_end(mn, mx, nans)


@triton.jit
def quant_channel(w_ptr, out_ptr, row_len, qmax, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * row_len
    lo, hi = _row_min_max(w_ptr, base, row_len, BLOCK)
    s = _step(lo, hi, qmax)
    for i in range(0, row_len, BLOCK):
        cols = i + tl.arange(0, BLOCK)
        valid = cols < row_len
        w = tl.load(w_ptr + base + cols, mask=valid, other=0.0)
        tl.store(out_ptr + base + cols, _fake_quant(w, lo, s, qmax, False, 0, cols), mask=valid)


@triton.jit
def row_range(x_ptr, rlo_ptr, rhi_ptr, row_len, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lo, hi = _row_min_max(x_ptr, row * row_len, row_len, BLOCK)
    tl.store(rlo_ptr + row, lo)
    tl.store(rhi_ptr + row, hi)


@triton.jit
def quant_rows(x_ptr, out_ptr, gid_ptr, qmax_ptr, n_rows, row_len, lo_ptr, hi_ptr, rlo_ptr, rhi_ptr, seed_ptr,
               GROUP_RANGE: tl.constexpr, STOCHASTIC: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < row_len
    offs = row * row_len + cols
    x = tl.load(x_ptr + offs, mask=valid, other=0.0)
    qmax = tl.load(qmax_ptr + row)
    if qmax > 0:
        if GROUP_RANGE:  # this row's group: the rows with its id, each row's range reduced over them
            g = tl.load(gid_ptr + row)
            r = tl.arange(0, ROWS)
            same = (r < n_rows) & (tl.load(gid_ptr + r, mask=r < n_rows, other=-1) == g)
            lo, _x = _nan_min_max(tl.load(rlo_ptr + r, mask=same, other=0.0), same)
            _y, hi = _nan_min_max(tl.load(rhi_ptr + r, mask=same, other=0.0), same)
        else:
            lo = tl.load(lo_ptr)
            hi = tl.load(hi_ptr)
        x = _fake_quant(x, lo, _step(lo, hi, qmax), qmax, STOCHASTIC, _key(seed_ptr, STOCHASTIC), offs)
    tl.store(out_ptr + offs, x, mask=valid)
