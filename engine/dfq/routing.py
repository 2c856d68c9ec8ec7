"""The autograd steps of routed execution (docs/methods.md §6.3), apart from the gated model that uses them:
``Permute`` (a block's rows reordered by option, and back) and ``RoutedOutput`` (a routed block's output and
the gate's CE gradient in one step)."""

from __future__ import annotations

import torch


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row inner products of two (N, ...) tensors: (N,), without an (N, ...) temporary."""
    n = a.shape[0]
    if n == 0:
        return a.new_zeros(0)
    return torch.linalg.vecdot(a.reshape(n, -1), b.reshape(n, -1))


class Permute(torch.autograd.Function):
    """``x.index_select(0, order)`` for a permutation ``order`` of x's rows (``inverse`` its inverse): the
    backward gathers by the inverse, one pass, where index_select's backward scatters into zeros, two. The same
    gradient bit for bit (up to the sign of a zero)."""

    @staticmethod
    def forward(ctx, x, order, inverse):
        ctx.save_for_backward(inverse)
        return x.index_select(0, order)

    @staticmethod
    def backward(ctx, g):
        (inverse,) = ctx.saved_tensors
        return g.index_select(0, inverse), None, None


def inverse(order: torch.Tensor) -> torch.Tensor:
    """The inverse of a permutation ``order`` (1-D int64)."""
    return torch.empty_like(order).index_copy_(0, order, torch.arange(len(order), device=order.device))


class RoutedOutput(torch.autograd.Function):
    """A routed block's output and the gate's CE gradient in one step (methods.md §6.3).

    Forward: ``h`` = ``y_skip`` with the computed samples' rows replaced by their chosen outputs (the mask is
    one-hot in value). The chosen outputs are rows of a pass's outputs ``y_out``, which belong to the batch's
    rows ``out_rows``: all of them (``split`` None), or, where the pass ran every sample (the skipped ones at an
    alternative, ``routed_statistics: batch``), the positions ``take`` of ``split = (take, rest)``: ``h`` is
    then written from the pass in one copy and the skipped rows (``rest``) from ``y_skip``, and the chosen rows
    are never copied apart. Backward, with ``g = dL/dh`` and per-row inner products ``<.,.>``, the gradient on
    the mask is what ``h = sum_k m_k G_k`` gives for per-option stand-ins ``G_k``: the skip option reads
    ``y_skip``; every non-skip option reads the sample's own output (the chosen one, or ``y_skip`` for a sample
    that skipped: the ``skip`` estimator). Each forward-only alternative ``(y_alt, rows, w)`` (outputs of samples ``rows`` at some
    other option, and an (n, K) weight) then adds ``w[:, k] <g, y_alt - y_own>`` to option k of those samples:
    with ``w`` from ``GatedModel``'s estimators this is unbiased for (``sampled``, ``grouped``) or equal to
    (``exact``) masked's ``<g, y_k>`` (tested); ``y_alt`` None stands for the pass's own rows ``rest``, whose
    products the backward has already taken. Written as one function instead of mask products so each block
    costs one copy forward and a few row reductions backward instead of a dozen passes over its output."""

    @staticmethod
    def forward(ctx, y_out, y_skip, mask, out_rows, split, skip_k, alts):
        if split is None:
            computed, skipped = out_rows, None
            h = y_skip.index_copy(0, out_rows, y_out)
        else:  # the pass covers the batch: its rows gathered into the batch's order, then the skipped rows
            take, rest = split
            computed, skipped = out_rows.index_select(0, take), out_rows.index_select(0, rest)
            h = y_out.index_select(0, inverse(out_rows))
            h.index_copy_(0, skipped, y_skip.index_select(0, skipped))
        ctx.skip_k, ctx.k, ctx.alts, ctx.split, ctx.skipped = skip_k, mask.shape[1], alts, split, skipped
        ctx.save_for_backward(y_out, y_skip, out_rows, computed)
        return h

    @staticmethod
    def backward(ctx, g):
        y_out, y_skip, out_rows, computed = ctx.saved_tensors
        d_skip = _row_dot(g, y_skip)
        g_out = g.index_select(0, out_rows)
        own = _row_dot(g_out, y_out)
        ready = None
        if ctx.split is not None:  # the chosen rows' dot products; the other rows' outputs get no gradient
            take, rest = ctx.split
            own, ready = own.index_select(0, take), own.index_select(0, rest)  # ready: <g, y_a> of the rest
            g_out.index_fill_(0, rest, 0.0)
        d_own = d_skip.index_copy(0, computed, own)  # <g, the sample's own output>
        g_mask = d_own.unsqueeze(1).repeat(1, ctx.k)
        g_mask[:, ctx.skip_k] = d_skip
        for y_alt, rows, w in ctx.alts:  # y_alt None: the pass's rows ``rest``, whose <g, y_a> is ``ready``
            dot = ready if y_alt is None else _row_dot(g.index_select(0, rows), y_alt)
            contrast = dot - d_own.index_select(0, rows)  # <g, y_a - y_own>
            g_mask.index_add_(0, rows, w * contrast.unsqueeze(1))
        g_skip = None
        if ctx.needs_input_grad[1] and ctx.split is None:
            g_skip = g.index_fill(0, computed, 0.0)
        elif ctx.needs_input_grad[1]:  # g on the skipped rows (known here), 0 elsewhere: written once
            g_skip = torch.zeros_like(g).index_copy_(0, ctx.skipped, g.index_select(0, ctx.skipped))
        return g_out if ctx.needs_input_grad[0] else None, g_skip, g_mask, None, None, None, None
