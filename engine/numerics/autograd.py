"""Custom autograd functions beside the quantization math (docs/methods.md §1).

``qconv2d`` / ``qlinear`` are one autograd node per quantized layer:

* forward: ``A_q = Qa(A)``, ``W_q = Qw(W)``, ``Y = op(A_q, W_q)``; ``A_q`` and ``W_q`` are saved;
* backward: ``G_q = Qg(dL/dY)`` (per tensor, stochastic rounding), then the EB pass
  ``dL/dA = W_q^T G_q`` and the GC pass ``dL/dW = A_q^T G_q`` both consume the quantized error, and both
  results pass straight through to the fp32 tensors (the reference's pure straight-through estimator,
  no clipping mask). dL/dA and dL/dW are not re-quantized.

One node instead of three (two STEs and a gradient hook) keeps the per-layer Python and autograd
overhead small; the numbers are those of the three-node formulation. ``quantize_grad`` is the gradient
node on its own (identity forward, quantized backward), for code that needs it apart from a layer.
"""

from __future__ import annotations

import itertools
import threading

import torch
import torch.nn.functional as F

from engine.numerics import fused, gpu_kernels, quant, scratch
from engine.numerics.precision import FULL_BITS


class Observed(tuple):
    """An activation range still to be taken: ``(run_lo, run_range, momentum)`` of a layer in training whose
    input quantizer is the GPU kernels' (``gpu_kernels.quantize_observed``: the batch range, the running range
    updated and the quantized input in one op instead of a range pass, an EMA of six small ops and a quantizer)."""


def _q_input(x: torch.Tensor, bits: int, act_range) -> torch.Tensor:
    if bits >= FULL_BITS:
        return x
    if act_range is None:
        return quant.quantize_tensor(x, bits)
    if isinstance(act_range, Observed):
        return gpu_kernels.quantize_observed(x, bits, *act_range)
    return quant.quantize(x, bits, act_range[0], act_range[1])


class _FixedWeights(threading.local):
    """While ``weights_fixed`` is on in this thread: each weight's quantized copy per bit-width, made once
    (``table``: (id, bits) -> (weight, copy); None when off). Per thread, so a forward in another thread
    never sees, or ends, this one's table."""

    def __init__(self):
        self.table: dict | None = None  # set in each thread: a compiled step's guard never sees it appear


_fixed = _FixedWeights()


class weights_fixed:
    """Context manager for a stretch of forward passes in which no weight changes (one forward of a gated
    model: masked execution runs every option, routed execution the chosen ones and the estimator's
    alternatives): a weight is quantized once per bit-width instead of once per pass. The copies are the
    same values a fresh quantization gives (nearest rounding over the weight's own per-channel range)."""

    def __enter__(self):
        self.was, _fixed.table = _fixed.table, {}
        return self

    def __exit__(self, *exc):
        _fixed.table = self.was
        return False


def _q_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    if bits >= FULL_BITS:
        return w
    table = _fixed.table
    if table is None:
        return quant.quantize_weight(w, bits)
    hit = table.get((id(w), bits))
    if hit is None or hit[0] is not w:  # the weight itself is kept with its copy, so its id stays its own
        hit = table[(id(w), bits)] = (w, quant.quantize_weight(w, bits))
    return hit[1]


def _q_grad(g: torch.Tensor, bits: int, reuse: bool = False) -> torch.Tensor:
    """``reuse``: the result is consumed before the caller returns, so it may live in a scratch buffer."""
    if bits >= FULL_BITS:
        return g
    return quant.quantize_tensor(g, bits, stochastic=True, out=scratch.like(g, "grad") if reuse else None)


class _QConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, act_bits, act_range, weight_bits, grad_bits, stride, padding, dilation, groups):
        xq, wq = _q_input(x, act_bits, act_range), _q_weight(w, weight_bits)
        ctx.save_for_backward(xq, wq)
        ctx.conf = (grad_bits, None if b is None else list(b.shape), stride, padding, dilation, groups)
        return F.conv2d(xq, wq, b, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        grad_bits, bias_sizes, stride, padding, dilation, groups = ctx.conf
        g = _q_grad(g.contiguous(), grad_bits, reuse=True)  # only convolution_backward reads it
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias_sizes is not None and ctx.needs_input_grad[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            g, xq, wq, bias_sizes, list(stride), list(padding), list(dilation), False, [0, 0], groups, mask)
        return gx, gw, gb, None, None, None, None, None, None, None, None


class _QLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, act_bits, act_range, weight_bits, grad_bits):
        xq, wq = _q_input(x, act_bits, act_range), _q_weight(w, weight_bits)
        ctx.save_for_backward(xq, wq)
        ctx.conf = (grad_bits, b is not None)
        return F.linear(xq, wq, b)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        grad_bits, has_bias = ctx.conf
        g = _q_grad(g, grad_bits, reuse=True)  # only the products below read it
        gx = g @ wq if ctx.needs_input_grad[0] else None
        g2 = g.reshape(-1, g.shape[-1])
        gw = g2.t() @ xq.reshape(-1, xq.shape[-1]) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None


def qconv2d(x, w, b, act_bits: int, act_range, weight_bits: int, grad_bits: int, stride, padding, dilation, groups):
    """Quantized conv2d; ``act_range`` is (lo, hi) for the activation quantizer or None (batch min/max)."""
    return _QConv2d.apply(x, w, b, act_bits, act_range, weight_bits, grad_bits, stride, padding, dilation, groups)


def qlinear(x, w, b, act_bits: int, act_range, weight_bits: int, grad_bits: int):
    return _QLinear.apply(x, w, b, act_bits, act_range, weight_bits, grad_bits)


class _GradQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, bits: int) -> torch.Tensor:
        ctx.bits = bits
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _q_grad(grad, ctx.bits), None


def quantize_grad(y: torch.Tensor, bits: int) -> torch.Tensor:
    """Identity forward; backward quantizes dL/dy to ``bits`` (per tensor, stochastic rounding)."""
    return _GradQuantize.apply(y, bits)


def _dense(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor shaped like ``x`` (``_q_rows`` writes whole rows through a 2-D view)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_LAYOUTS: dict = {}  # (groups, rows, device) -> (sizes, per-row group ids); on an accelerator also per-row levels


def _layout(groups, n: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
    """The row groups' sizes and each row's group id (a (rows,) int64 tensor on ``device``), checked and made
    once per distinct ``groups`` (every quantized layer of a routed pass, forward and backward, has the same)."""
    key = (groups, n, device)
    hit = _LAYOUTS.get(key)
    if hit is None:
        sizes = [end - start for start, end, _ in groups]
        if [start for start, _, _ in groups] != list(itertools.accumulate([0] + sizes))[:-1] or sum(sizes) != n:
            raise ValueError("mixed-precision groups must be contiguous row ranges covering the batch in order")
        gid = _host_table([g for g, size in enumerate(sizes) for _ in range(size)], torch.int64, device)
        if len(_LAYOUTS) >= 1024:  # a run makes a few hundred distinct layouts an epoch; keep the recent ones
            _LAYOUTS.clear()
        hit = _LAYOUTS[key] = (sizes, gid)
    return hit


def _q_rows(x: torch.Tensor, groups, bits_of, lo: float | None, hi: float | None, stochastic: bool,
            out: torch.Tensor) -> torch.Tensor:
    """Quantize the row groups of ``x`` (samples along dim 0) at each group's bits into ``out``: over the
    given range (activations: one range for the whole batch), or each group's own range (errors).

    Each group gets ``quant.quantize``'s per-tensor arithmetic at its bits over its range (methods.md §1), the
    same bits, but all groups share one set of whole-tensor passes with per-row lo, step and level count: the
    number of passes does not grow with the number of groups (a routed batch has up to one group per option)."""
    sizes, gid = _layout(groups, len(x), x.device)  # checks that the groups tile the batch
    bits = [bits_of(prec) for _, _, prec in groups]
    if len(groups) == 1:  # one group: the plain per-tensor quantizer
        if bits[0] >= FULL_BITS:
            return out.copy_(x)
        if lo is None:
            return quant.quantize_tensor(x, bits[0], stochastic=stochastic, out=out)
        return quant.quantize(x, bits[0], lo, hi, stochastic=stochastic, out=out)
    if all(b >= FULL_BITS for b in bits):
        return out.copy_(x)
    if quant.ranges_on_device(x):
        return _q_rows_device(x, groups, sizes, gid, bits, lo, hi, stochastic, out)
    rows = x.reshape(x.shape[0], -1)
    fuse = fused.usable(x, out)
    if lo is None:  # each group's own (lo, hi): per-row min/max, reduced per group on the host (one read)
        if fuse:
            row_lo, row_hi = fused.row_range(rows)
        else:  # two passes: aminmax(dim=1) is far slower
            row_lo, row_hi = rows.amin(1).tolist(), rows.amax(1).tolist()
        ranges = [(min(row_lo[s:e]), max(row_hi[s:e])) for s, e, _ in groups]
    else:
        ranges = [(lo, hi)] * len(groups)
    double = x.dtype == torch.float64
    params = []  # per group: lo, quant.tensor_step's step, qmax (as quantize has them); full-bit rows: overwritten
    for b, (g_lo, g_hi) in zip(bits, ranges):
        params.append((0.0,) * 3 if b >= FULL_BITS
                      else (g_lo, quant.tensor_step(b, g_lo, g_hi, double), float(quant.levels(b))))
    table = torch.tensor(params, dtype=x.dtype)
    if fuse:  # every group's chain in one pass over the rows, the same bits (methods.md §1)
        return fused.rows(rows, out, quant.noise_words(out, reuse=True) if stochastic else None, gid, table)
    lo_r, step_r, qmax_r = table.index_select(0, gid).t().unsqueeze(2)  # each (rows, 1)
    u = torch.sub(rows, lo_r, out=out.view(x.shape[0], -1)).div_(step_r)  # ``out`` is contiguous
    if stochastic:
        u.add_(0.5 / quant.NOISE_LEVELS).add_(quant.noise_words(u, reuse=True), alpha=1.0 / quant.NOISE_LEVELS)
    return _rows_back(u, qmax_r, step_r, lo_r, x, groups, bits, out)


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


def _host_table(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small table made on the host, copied to ``device`` without waiting for it (pinned memory, CUDA)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def _row_levels(groups, sizes: list[int], bits: list[int], x: torch.Tensor, full: int) -> torch.Tensor:
    """Each row's level count ``2^b - 1`` at its group's bits (``full`` for a 32-bit group), on ``x``'s device
    without a wait, made once per distinct pass (a pass's layers share it, as they share the layout)."""
    key = (groups, tuple(bits), x.dtype, x.device, full)
    hit = _LAYOUTS.get(key)
    if hit is None:
        per_group = [float(quant.levels(b) if b < FULL_BITS else full) for b in bits]
        hit = _LAYOUTS[key] = _host_table([per_group[g] for g, size in enumerate(sizes) for _ in range(size)],
                                          x.dtype, x.device)
    return hit


def _q_rows_device(x: torch.Tensor, groups, sizes: list[int], gid: torch.Tensor, bits: list[int], lo, hi,
                   stochastic: bool, out: torch.Tensor) -> torch.Tensor:
    """``_q_rows`` where ranges stay on the device (``quant.ranges_on_device``): the per-row level counts and
    group ids come from the host, without a wait; each group's range, step and levels are computed on the
    device, with ``quant.quantize``'s arithmetic for a range kept there (``u = (x - lo) / step``), so a
    mixed-precision layer makes the host wait for nothing (methods.md §1, "Devices")."""
    n = x.shape[0]
    if gpu_kernels.usable(x) and n <= gpu_kernels.MAX_ROWS:  # one kernel (two with the groups' own ranges)
        levels = _row_levels(groups, sizes, bits, x, full=0)  # a 32-bit row: 0 levels, copied by the kernel
        return gpu_kernels.quantize_rows(x, gid, levels, lo, hi, stochastic)  # in place of ``out``
    rows, flat = x.reshape(n, -1), out.view(n, -1)
    qmax_r = _row_levels(groups, sizes, bits, x, full=1).unsqueeze(1)  # full-bit rows: overwritten below
    if lo is None:  # each group's own (lo, hi): per-row min/max reduced per group on the device
        row_lo, row_hi = rows.amin(1), rows.amax(1)
        g_lo = row_lo.new_full((len(groups),), float("inf")).scatter_reduce_(0, gid, row_lo, "amin")
        g_hi = row_hi.new_full((len(groups),), float("-inf")).scatter_reduce_(0, gid, row_hi, "amax")
        lo, hi = g_lo.index_select(0, gid).unsqueeze(1), g_hi.index_select(0, gid).unsqueeze(1)
    step = ((hi - lo) / qmax_r).clamp_min_(quant.STEP_FLOOR)
    u = torch.sub(rows, lo, out=flat).div_(step)
    if stochastic:
        u.add_(0.5 / quant.NOISE_LEVELS).add_(quant.noise_words(u, reuse=True), alpha=1.0 / quant.NOISE_LEVELS)
    return _rows_back(u, qmax_r, step, lo, x, groups, bits, out)


class _QConv2dMixed(torch.autograd.Function):
    """``_QConv2d`` with per-sample precision (``MixedPrecision`` groups): one conv for the whole batch."""

    @staticmethod
    def forward(ctx, x, w, b, groups, act_range, weight_bits, stride, padding, dilation, conv_groups):
        lo, hi = (None, None) if act_range is None else act_range  # None: every group's FW is 32 bits
        xq = _q_rows(x.detach(), groups, lambda p: p.act, lo, hi, False, _dense(x))
        wq = _q_weight(w, weight_bits)
        ctx.save_for_backward(xq, wq)
        ctx.conf = (groups, None if b is None else list(b.shape), stride, padding, dilation, conv_groups)
        return F.conv2d(xq, wq, b, stride, padding, dilation, conv_groups)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        groups, bias_sizes, stride, padding, dilation, conv_groups = ctx.conf
        g = g.contiguous()
        buf = scratch.like(g, "grad")  # only convolution_backward reads it
        gq = _q_rows(g, groups, lambda p: p.grad, None, None, True, _dense(g) if buf is None else buf)
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias_sizes is not None and ctx.needs_input_grad[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            gq, xq, wq, bias_sizes, list(stride), list(padding), list(dilation), False, [0, 0], conv_groups, mask)
        return gx, gw, gb, None, None, None, None, None, None, None


class _QLinearMixed(torch.autograd.Function):
    """``_QLinear`` with per-sample precision (``MixedPrecision`` groups along dim 0)."""

    @staticmethod
    def forward(ctx, x, w, b, groups, act_range, weight_bits):
        lo, hi = (None, None) if act_range is None else act_range  # None: every group's FW is 32 bits
        xq = _q_rows(x.detach(), groups, lambda p: p.act, lo, hi, False, _dense(x))
        wq = _q_weight(w, weight_bits)
        ctx.save_for_backward(xq, wq)
        ctx.conf = (groups, b is not None)
        return F.linear(xq, wq, b)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        groups, has_bias = ctx.conf
        g = g.contiguous()
        gq = _q_rows(g, groups, lambda p: p.grad, None, None, True, _dense(g))
        gx = gq @ wq if ctx.needs_input_grad[0] else None
        g2 = gq.reshape(-1, gq.shape[-1])
        gw = g2.t() @ xq.reshape(-1, xq.shape[-1]) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None


def qconv2d_mixed(x, w, b, groups, act_range, weight_bits: int, stride, padding, dilation, conv_groups):
    """Quantized conv2d at per-sample precision; ``act_range`` is the (lo, hi) of the whole batch."""
    return _QConv2dMixed.apply(x, w, b, groups, act_range, weight_bits, stride, padding, dilation, conv_groups)


def qlinear_mixed(x, w, b, groups, act_range, weight_bits: int):
    return _QLinearMixed.apply(x, w, b, groups, act_range, weight_bits)


class _QMatmul(torch.autograd.Function):
    """Both operands of an activation-by-activation product (attention's scores and context, methods.md §11):
    forward ``Y = Qa(A) @ Qa(B)`` (each per tensor over its given (lo, hi), or its own min/max when None,
    nearest); backward
    ``G_q = Qg(dL/dY)`` (per tensor, stochastic), ``dL/dA = G_q @ Qa(B)^T`` and ``dL/dB = Qa(A)^T @ G_q``, passed
    straight through to the fp32 operands (the same estimator as ``_QLinear``)."""

    @staticmethod
    def forward(ctx, a, b, act_bits, a_range, b_range, grad_bits):
        aq, bq = _q_input(a, act_bits, a_range), _q_input(b, act_bits, b_range)
        ctx.save_for_backward(aq, bq)
        ctx.grad_bits = grad_bits
        return torch.matmul(aq, bq)

    @staticmethod
    def backward(ctx, g):
        aq, bq = ctx.saved_tensors
        g = _q_grad(g.contiguous(), ctx.grad_bits, reuse=True)  # only the two products below read it
        ga = torch.matmul(g, bq.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gb = torch.matmul(aq.transpose(-1, -2), g) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None, None, None


class _QMatmulMixed(torch.autograd.Function):
    """``_QMatmul`` with per-sample precision (``MixedPrecision`` groups of rows along dim 0, the sequences of
    a batch): each group's rows of both operands at its FW bits, each operand over one range for the whole
    batch; each group's rows of dL/dY at its BW bits over their own range (as ``_QLinearMixed``)."""

    @staticmethod
    def forward(ctx, a, b, groups, a_range, b_range):
        lo_a, hi_a = (None, None) if a_range is None else a_range
        lo_b, hi_b = (None, None) if b_range is None else b_range
        aq = _q_rows(a.detach(), groups, lambda p: p.act, lo_a, hi_a, False, _dense(a))
        bq = _q_rows(b.detach(), groups, lambda p: p.act, lo_b, hi_b, False, _dense(b))
        ctx.save_for_backward(aq, bq)
        ctx.groups = groups
        return torch.matmul(aq, bq)

    @staticmethod
    def backward(ctx, g):
        aq, bq = ctx.saved_tensors
        g = g.contiguous()
        gq = _q_rows(g, ctx.groups, lambda p: p.grad, None, None, True, _dense(g))
        ga = torch.matmul(gq, bq.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gb = torch.matmul(aq.transpose(-1, -2), gq) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None, None


def qmatmul_mixed(a: torch.Tensor, b: torch.Tensor, groups, a_range, b_range) -> torch.Tensor:
    """Quantized batched matmul at per-sample precision (rows = dim 0); ``a_range`` / ``b_range`` the (lo, hi)
    of each operand over the whole batch (None only when every group's FW is 32 bits)."""
    return _QMatmulMixed.apply(a, b, groups, a_range, b_range)


def qmatmul(a: torch.Tensor, b: torch.Tensor, act_bits: int, a_range, b_range, grad_bits: int) -> torch.Tensor:
    """Quantized batched matmul ``a @ b`` (same leading dims): operands at ``act_bits`` over ``a_range`` /
    ``b_range`` ((lo, hi) or None: the tensor's own min/max), dL/dY at ``grad_bits``; 32 bits is the exact fp32
    bypass of each component."""
    if act_bits >= FULL_BITS and grad_bits >= FULL_BITS:
        return torch.matmul(a, b)
    return _QMatmul.apply(a, b, act_bits, a_range, b_range, grad_bits)
