"""The quantizers' torch passes (docs/methods.md §1): the reference arithmetic every backend reproduces bit for bit.

Asymmetric min/max affine quantization, simulated ("fake quant": quantize then dequantize):

    qmax = 2^b - 1,  s = max((hi - lo) / qmax, 1e-8),  u = (x - lo) / s
    u <- u + n,  n ~ U(-0.5, 0.5)    (stochastic rounding only)
    u <- round(clamp(u, 0, qmax))    (clamp first, then round half-to-even, as the reference)
    x_q = u * s + lo

``lo`` acts as the zero point, so 0 is generally not exactly representable (reference behaviour).
Per-tensor ranges are Python floats on the CPU (the host form) and every op after the first works in place on one
buffer (fresh, or scratch where the result is consumed at once); on an accelerator, or in a step being compiled,
they are 0-d tensors on the device (the device form, methods.md §1 "Devices"). Row passes quantize the row groups
of a mixed-precision batch (DFQ's routed execution) in whole-tensor passes with per-row parameters.

Nothing here chooses a backend: ``engine.numerics.quant`` does, and runs these passes where neither the fused C
kernels nor the GPU kernels take a tensor.
"""

from __future__ import annotations

import itertools

import torch

from engine.numerics import fused, scratch
from engine.numerics.affine import NOISE_LEVELS, STEP_FLOOR, levels, tensor_step
from engine.numerics.precision import FULL_BITS


def tensor_range(x: torch.Tensor, on_device: bool) -> tuple[float, float] | tuple[torch.Tensor, torch.Tensor]:
    """Global (lo, hi) of a tensor (one pass): 0-d tensors ``on_device``, else Python floats."""
    lo, hi = torch.aminmax(x.detach())
    if on_device:
        return lo, hi
    return float(lo), float(hi)


def channel_range(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel (lo, hi) of a weight of shape (C_out, ...), shaped (C_out, 1, ..., 1)."""
    lo, hi = torch.aminmax(w.detach().reshape(w.shape[0], -1), dim=1)
    shape = (w.shape[0],) + (1,) * (w.dim() - 1)
    return lo.reshape(shape), hi.reshape(shape)


def noise_words(like: torch.Tensor, reuse: bool = False) -> torch.Tensor:
    """Integers v uniform on [-2^15, 2^15), shaped like ``like``: n = (v + 0.5) / 2^16 ~ U(-0.5, 0.5).

    On CPU torch's only generator (mt19937) costs ~4.5 ns per float32 and dominated the overhead of
    quantized training; one 64-bit draw here feeds four 16-bit values. The noise is symmetric with 65536
    levels, so rounding stays unbiased to within 2^-17 of a quantization step.
    ``reuse``: draw into a per-thread scratch buffer (CPU only), for callers that consume the words at once.
    The full 64-bit range (``to=None``) is a plain mt19937 draw; an explicit ``to`` costs a 64-bit modulo.
    """
    n = like.numel()
    if torch.compiler.is_compiling():  # in a graph: an out-of-place draw (the compiler has its own generator)
        return torch.randint(-(2**15), 2**15, like.shape, dtype=torch.int16, device=like.device)
    words = scratch.buffer("noise", ((n + 3) // 4,), torch.int64, like.device) if reuse else None
    if words is None:
        words = torch.empty((n + 3) // 4, dtype=torch.int64, device=like.device)
    if like.device.type == "cpu" and fused.usable():
        fused.random_words(words)  # the same draw, stepped in C (methods.md §1, "Fused kernels")
    else:
        words.random_(-(2**63), None)
    return words.view(torch.int16)[:n].view(like.shape)


def uniform_noise(like: torch.Tensor) -> torch.Tensor:
    """Float noise ~ U(-0.5, 0.5) at the resolution ``quantize`` uses (for tests and analysis)."""
    return noise_words(like).to(torch.float32).add_(0.5).div_(NOISE_LEVELS)


def quantize(
    x: torch.Tensor,
    bits: int,
    lo: float | torch.Tensor,
    hi: float | torch.Tensor,
    stochastic: bool = False,
    noise: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fake-quantize ``x`` to ``bits`` over [lo, hi] in torch passes: floats (the host form), or tensors that
    broadcast against x (per-channel ranges, or a per-tensor range kept on the device: 0-d tensors).

    ``noise`` (floats in [-0.5, 0.5) shaped like x) may be passed to make stochastic rounding reproducible;
    otherwise 16-bit noise is drawn from torch's global generator (``noise_words``).
    ``out``: a contiguous float buffer shaped like x to write the result into (e.g. a scratch buffer).
    """
    qmax = levels(bits)
    if isinstance(lo, torch.Tensor):  # per-channel ranges (weights: small tensors), or a range on the device
        step = ((hi - lo) / qmax).clamp_min(STEP_FLOOR)
    else:  # per-tensor range on the host: the device form's step and passes, with Python floats (same bits)
        step = tensor_step(bits, lo, hi, double=x.dtype == torch.float64)
    # u = (x - lo) / s, a subtraction then an IEEE division, as the reference and the GPU kernels compute it:
    # x * (1/s) - lo/s rounds differently and can put a value next to a half-level on the other side of it
    u = torch.sub(x.detach(), lo, out=out).div_(step)
    if noise is not None and stochastic:
        u.add_(noise)
    elif stochastic and noise is None:  # n = (v + 0.5) / 2^16, added without materialising a float noise tensor
        u.add_(0.5 / NOISE_LEVELS).add_(noise_words(u, reuse=True), alpha=1.0 / NOISE_LEVELS)
    u.clamp_(0, qmax).round_()
    return u.mul_(step).add_(lo)  # u * s + lo: a multiply, then an add (no fused multiply-add), as on a GPU


# -- row groups: per-sample precision (DFQ's routed execution, methods.md §6.3) ------------------------------------

_LAYOUTS: dict = {}  # (groups, rows, device) -> (sizes, per-row group ids); on an accelerator also per-row levels


def host_table(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small table made on the host, copied to ``device`` without waiting for it (pinned memory, CUDA)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def layout(groups, n: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
    """The row groups' sizes and each row's group id (a (rows,) int64 tensor on ``device``), checked and made
    once per distinct ``groups`` (every quantized layer of a routed pass, forward and backward, has the same)."""
    key = (groups, n, device)
    hit = _LAYOUTS.get(key)
    if hit is None:
        sizes = [end - start for start, end, _ in groups]
        if [start for start, _, _ in groups] != list(itertools.accumulate([0] + sizes))[:-1] or sum(sizes) != n:
            raise ValueError("mixed-precision groups must be contiguous row ranges covering the batch in order")
        gid = host_table([g for g, size in enumerate(sizes) for _ in range(size)], torch.int64, device)
        if len(_LAYOUTS) >= 1024:  # a run makes a few hundred distinct layouts an epoch; keep the recent ones
            _LAYOUTS.clear()
        hit = _LAYOUTS[key] = (sizes, gid)
    return hit


def row_levels(groups, sizes: list[int], bits: list[int], x: torch.Tensor, full: int) -> torch.Tensor:
    """Each row's level count ``2^b - 1`` at its group's bits (``full`` for a 32-bit group), on ``x``'s device
    without a wait, made once per distinct pass (a pass's layers share it, as they share the layout)."""
    key = (groups, tuple(bits), x.dtype, x.device, full)
    hit = _LAYOUTS.get(key)
    if hit is None:
        per_group = [float(levels(b) if b < FULL_BITS else full) for b in bits]
        hit = _LAYOUTS[key] = host_table([per_group[g] for g, size in enumerate(sizes) for _ in range(size)],
                                         x.dtype, x.device)
    return hit


def group_table(bits: list[int], ranges: list[tuple[float, float]], dtype: torch.dtype) -> torch.Tensor:
    """Per group: lo, ``tensor_step``'s step and qmax (as ``quantize`` has them for a host range), a (groups, 3)
    table; a 32-bit group's row is zeros (its rows are copied, not quantized)."""
    double = dtype == torch.float64
    params = [(0.0,) * 3 if b >= FULL_BITS else (g_lo, tensor_step(b, g_lo, g_hi, double), float(levels(b)))
              for b, (g_lo, g_hi) in zip(bits, ranges)]
    return torch.tensor(params, dtype=dtype)


def rows_host(rows: torch.Tensor, gid: torch.Tensor, table: torch.Tensor, x: torch.Tensor, groups, bits: list[int],
              stochastic: bool, out: torch.Tensor) -> torch.Tensor:
    """The host form of the row quantizer: row r of ``rows`` (``x`` as (rows, -1)) at group ``gid[r]``'s
    (lo, step, qmax) from ``table``, into the contiguous ``out``."""
    lo_r, step_r, qmax_r = table.index_select(0, gid).t().unsqueeze(2)  # each (rows, 1)
    u = torch.sub(rows, lo_r, out=out.view(x.shape[0], -1)).div_(step_r)
    if stochastic:
        u.add_(0.5 / NOISE_LEVELS).add_(noise_words(u, reuse=True), alpha=1.0 / NOISE_LEVELS)
    return _rows_back(u, qmax_r, step_r, lo_r, x, groups, bits, out)


def rows_device(x: torch.Tensor, groups, sizes: list[int], gid: torch.Tensor, bits: list[int], lo, hi,
                stochastic: bool, out: torch.Tensor) -> torch.Tensor:
    """The device form of the row quantizer (ranges kept on the device): the per-row level counts and group ids
    come from the host, without a wait; each group's range, step and levels are computed on the device, with
    ``quantize``'s arithmetic for a range kept there (``u = (x - lo) / step``), so a mixed-precision layer makes
    the host wait for nothing (methods.md §1, "Devices"). ``lo``/``hi``: one range for the batch (0-d tensors),
    or None: each group's own."""
    n = x.shape[0]
    rows, flat = x.reshape(n, -1), out.view(n, -1)
    qmax_r = row_levels(groups, sizes, bits, x, full=1).unsqueeze(1)  # full-bit rows: overwritten below
    if lo is None:  # each group's own (lo, hi): per-row min/max reduced per group on the device
        row_lo, row_hi = rows.amin(1), rows.amax(1)
        g_lo = row_lo.new_full((len(groups),), float("inf")).scatter_reduce_(0, gid, row_lo, "amin")
        g_hi = row_hi.new_full((len(groups),), float("-inf")).scatter_reduce_(0, gid, row_hi, "amax")
        lo, hi = g_lo.index_select(0, gid).unsqueeze(1), g_hi.index_select(0, gid).unsqueeze(1)
    step = ((hi - lo) / qmax_r).clamp_min_(STEP_FLOOR)
    u = torch.sub(rows, lo, out=flat).div_(step)
    if stochastic:
        u.add_(0.5 / NOISE_LEVELS).add_(noise_words(u, reuse=True), alpha=1.0 / NOISE_LEVELS)
    return _rows_back(u, qmax_r, step, lo, x, groups, bits, out)


def _rows_back(u: torch.Tensor, qmax_r: torch.Tensor, step, lo, x: torch.Tensor, groups, bits: list[int],
               out: torch.Tensor) -> torch.Tensor:
    """The row quantizers' common end: levels ``u`` (a view of ``out``) clamped to each row's [0, qmax] and
    rounded, back to values ``u * step + lo``, and the rows of 32-bit groups copied from ``x`` unquantized."""
    torch.minimum(u.clamp_min_(0), qmax_r, out=u).round_()
    u.mul_(step).add_(lo)
    for (start, end, _), b in zip(groups, bits):
        if b >= FULL_BITS:
            out[start:end] = x[start:end]
    return out
