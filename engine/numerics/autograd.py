"""The quantized ops' autograd nodes (docs/methods.md §1): one per op kind (conv2d, linear, matmul), each
parameterised by its precision: a ``Precision`` (every sample at the same bits) or a ``MixedPrecision`` (groups of
rows at their own bits: DFQ's routed execution, methods.md §6.3).

``qconv2d`` / ``qlinear`` are one autograd node per quantized layer:

* forward: ``A_q = Qa(A)``, ``W_q = Qw(W)``, ``Y = op(A_q, W_q)``; ``A_q`` and ``W_q`` are saved;
* backward: ``G_q = Qg(dL/dY)`` (per tensor, stochastic rounding), then the EB pass
  ``dL/dA = W_q^T G_q`` and the GC pass ``dL/dW = A_q^T G_q`` both consume the quantized error, and both
  results pass straight through to the fp32 tensors (the reference's pure straight-through estimator,
  no clipping mask). dL/dA and dL/dW are not re-quantized.

One node instead of three (two STEs and a gradient hook) keeps the per-layer Python and autograd
overhead small; the numbers are those of the three-node formulation. ``quantize_grad`` is the gradient
node on its own (identity forward, quantized backward), for code that needs it apart from a layer.

At a ``MixedPrecision`` each group's input rows are quantized at the group's FW bits over one range for the
whole batch, each group's rows of dL/dY at its BW bits over their own range (``quant.quantize_rows``), and the op
runs once for the whole batch. The quantizers, and which backend runs them, are ``engine.numerics.quant``'s.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from engine.numerics import quant, scratch
from engine.numerics.precision import FULL_BITS, MixedPrecision, Precision


class Observed(tuple):
    """An activation range still to be taken: ``(run_lo, run_range, momentum)`` of a layer in training whose
    input quantizer's backend ``observes`` (the GPU kernels: the batch range, the running range
    updated and the quantized input in one op instead of a range pass, an EMA of six small ops and a quantizer:
    ``quant.quantize_observed``)."""


def _q_input(x: torch.Tensor, bits: int, act_range) -> torch.Tensor:
    if bits >= FULL_BITS:
        return x
    if act_range is None:
        return quant.quantize_tensor(x, bits)
    if isinstance(act_range, Observed):
        return quant.quantize_observed(x, bits, *act_range)
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


def _dense(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor shaped like ``x`` (``quant.quantize_rows`` writes whole rows through a
    2-D view)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _q_act(x: torch.Tensor, bits: int | None, groups, act_range) -> torch.Tensor:
    """An input (activation) at ``bits`` (a ``Precision``'s FW), or, where ``groups`` is a ``MixedPrecision``'s,
    each group's rows at its FW bits. ``act_range``: for ``bits`` the (lo, hi) to quantize over, None (the
    tensor's own min/max) or an ``Observed``; for ``groups`` the (lo, hi) of the whole batch, None only when every
    group's FW is 32 bits."""
    if groups is not None:
        lo, hi = (None, None) if act_range is None else act_range
        return quant.quantize_rows(x.detach(), groups, lambda p: p.act, lo, hi, False, _dense(x))
    return _q_input(x, bits, act_range)


def _q_error(g: torch.Tensor, bits: int | None, groups) -> torch.Tensor:
    """dL/dY at ``bits`` (a ``Precision``'s BW, per tensor), or, where ``groups`` is a ``MixedPrecision``'s, each
    group's rows at its BW bits over their own range; stochastic rounding. Consumed before the node's backward
    returns, so it may live in a scratch buffer."""
    if groups is not None:
        g = g.contiguous()
        buf = scratch.like(g, "grad")
        return quant.quantize_rows(g, groups, lambda p: p.grad, None, None, True, _dense(g) if buf is None else buf)
    return _q_grad(g, bits, reuse=True)


def _bits(prec: Precision | MixedPrecision) -> tuple[int | None, int, int | None, tuple | None]:
    """A node's precision arguments: (act, weight, grad, None) of a ``Precision``, (None, weight, None, groups) of
    a ``MixedPrecision``. Plain integers, so that a step being compiled sees the bit-widths it saw before
    (torch.compile's automatic dynamic makes them symbolic at their first change, methods.md §1)."""
    if isinstance(prec, MixedPrecision):
        return None, prec.weight, None, prec.groups
    return prec.act, prec.weight, prec.grad, None


class _QConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, act_bits, weight_bits, grad_bits, rows, act_range, stride, padding, dilation, groups):
        xq, wq = _q_act(x, act_bits, rows, act_range), _q_weight(w, weight_bits)
        ctx.save_for_backward(xq, wq)
        ctx.conf = (grad_bits, rows, None if b is None else list(b.shape), stride, padding, dilation, groups)
        return F.conv2d(xq, wq, b, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        grad_bits, rows, bias_sizes, stride, padding, dilation, groups = ctx.conf
        g = _q_error(g.contiguous(), grad_bits, rows)  # only convolution_backward reads it
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias_sizes is not None and ctx.needs_input_grad[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            g, xq, wq, bias_sizes, list(stride), list(padding), list(dilation), False, [0, 0], groups, mask)
        return gx, gw, gb, None, None, None, None, None, None, None, None, None


class _QLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, act_bits, weight_bits, grad_bits, rows, act_range):
        xq, wq = _q_act(x, act_bits, rows, act_range), _q_weight(w, weight_bits)
        ctx.save_for_backward(xq, wq)
        ctx.conf = (grad_bits, rows, b is not None)
        return F.linear(xq, wq, b)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        grad_bits, rows, has_bias = ctx.conf
        g = _q_error(g, grad_bits, rows)  # only the products below read it
        gx = g @ wq if ctx.needs_input_grad[0] else None
        g2 = g.reshape(-1, g.shape[-1])
        gw = g2.t() @ xq.reshape(-1, xq.shape[-1]) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None


class _QMatmul(torch.autograd.Function):
    """Both operands of an activation-by-activation product (attention's scores and context, methods.md §11):
    forward ``Y = Qa(A) @ Qa(B)`` (each per tensor over its given (lo, hi), or its own min/max when None,
    nearest; at a ``MixedPrecision`` each group's rows of both operands at its FW bits, each operand over one
    range for the whole batch); backward ``G_q = Qg(dL/dY)`` (stochastic), ``dL/dA = G_q @ Qa(B)^T`` and
    ``dL/dB = Qa(A)^T @ G_q``, passed straight through to the fp32 operands (the same estimator as ``_QLinear``)."""

    @staticmethod
    def forward(ctx, a, b, act_bits, grad_bits, rows, a_range, b_range):
        aq, bq = _q_act(a, act_bits, rows, a_range), _q_act(b, act_bits, rows, b_range)
        ctx.save_for_backward(aq, bq)
        ctx.conf = (grad_bits, rows)
        return torch.matmul(aq, bq)

    @staticmethod
    def backward(ctx, g):
        aq, bq = ctx.saved_tensors
        g = _q_error(g.contiguous(), *ctx.conf)  # only the two products below read it
        ga = torch.matmul(g, bq.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gb = torch.matmul(aq.transpose(-1, -2), g) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None, None, None, None


class _InputMix(torch.autograd.Function):
    """Execution ``conv``'s input mixing (``ConvMix``, methods.md §6.3): the value is ``x`` itself (the mask is
    one-hot, so ``sum_k m_k Qa_k(x)`` is the chosen option's input, which the layer quantizes), ``dL/dx`` passes
    straight through as the reference's ``sum_k m_k`` of straight-through estimators does, and the mask gets
    ``<dL/dx, Qa_k(x)>`` per sample, each ``Qa_k`` over the batch range (lo, hi) the layer quantizes with,
    recomputed here rather than kept from the forward, once per FW bit-width (options that share one, 4/6 and 4/8,
    share the product)."""

    @staticmethod
    def forward(ctx, x, mask, acts, lo, hi):
        ctx.save_for_backward(x)
        ctx.conf = (acts, lo, hi)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        acts, lo, hi = ctx.conf
        ones = [1] * (x.dim() - 1)
        col = {a: (g * (x if a >= FULL_BITS else quant.quantize(x, a, lo, hi))).sum_to_size(len(x), *ones).view(-1)
               for a in set(acts)}
        return g, torch.stack([col[a] for a in acts], 1), None, None, None


def _mixed(x: torch.Tensor, prec: Precision | MixedPrecision, act_range) -> torch.Tensor:
    """``x`` with execution ``conv``'s input mixing where ``prec`` carries it and the gate learns (training)."""
    mix = getattr(prec, "mix", None)
    if mix is None or act_range is None or not (torch.is_grad_enabled() and mix.mask.requires_grad):
        return x
    return _InputMix.apply(x, mix.mask, mix.acts, *act_range)


def qconv2d(x, w, b, prec: Precision | MixedPrecision, act_range, stride, padding, dilation, groups):
    """Quantized conv2d at ``prec``; ``act_range``: see ``_q_act``."""
    return _QConv2d.apply(_mixed(x, prec, act_range), w, b, *_bits(prec), act_range, stride, padding, dilation,
                          groups)


def qlinear(x, w, b, prec: Precision | MixedPrecision, act_range):
    """Quantized linear at ``prec``; ``act_range``: see ``_q_act``."""
    return _QLinear.apply(_mixed(x, prec, act_range), w, b, *_bits(prec), act_range)


def qmatmul(a: torch.Tensor, b: torch.Tensor, prec: Precision | MixedPrecision, a_range, b_range) -> torch.Tensor:
    """Quantized batched matmul ``a @ b`` (same leading dims) at ``prec``: operands at its FW bits over ``a_range``
    / ``b_range`` (see ``_q_act``), dL/dY at its BW bits; 32 bits is the exact fp32 bypass of each component."""
    act_bits, _, grad_bits, rows = _bits(prec)
    if rows is None and act_bits >= FULL_BITS and grad_bits >= FULL_BITS:
        return torch.matmul(a, b)
    return _QMatmul.apply(a, b, act_bits, grad_bits, rows, a_range, b_range)


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
