"""Quantized layers that take their precision at call time (docs/methods.md §1).

``QConv2d(x, prec)`` / ``QLinear(x, prec)``:

1. every component of ``prec`` at 32 bits -> the plain fp32 op, no quantization and no running-range
   update (an exact bypass: ``QConv2d(x, FP32) == F.conv2d(x, W)``);
2. otherwise ``W_q = Qw(W)`` (per output channel, nearest), ``A_q = Qa(A)`` (per tensor; train mode uses
   the batch min/max and updates the running range, eval mode uses the running range), ``Y = op(A_q, W_q)``,
   and a gradient node on ``Y`` quantizes dL/dY to ``prec.grad`` bits in backward (stochastic rounding).

Each component is bypassed on its own when it is 32 bits. The running range follows the reference's
EMA convention: ``run = m * run + (1 - m) * batch`` with ``m`` (``act_momentum``) the weight on the *old*
value, both buffers starting at 0 (methods.md §1).

``role`` and ``block`` label the layer for the layer-precision map and BitOPs accounting: role is one of
``stem``, ``body``, ``shortcut`` (a residual block's 1x1 projection), ``depthwise``, ``head``, ``fc``, ``attn``;
``block`` is the residual block index or None.

``QMatmul(a, b, prec)`` is the same for a product of two activations (attention's scores and context,
methods.md §11): both operands at ``prec.act`` with a running range each, dL/dY at ``prec.grad``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ConfigError
from engine.numerics import autograd, quant
from engine.numerics.affine import single
from engine.numerics.precision import FP32, FULL_BITS, MixedPrecision, Precision

ROLES = ("stem", "body", "shortcut", "depthwise", "head", "fc", "attn")


def _ema_terms(lo, hi, m: float, dtype: torch.dtype) -> tuple:
    """``(1 - m) * lo`` and ``(1 - m) * (hi - lo)``, the batch's share of the running range, computed as the
    reference computes them from its range tensors (``zero_point * (1 - momentum)``): in the buffers' dtype, with
    the scalar rounded to it. Computed in double from Python floats, a float32 buffer would often take a value one
    ulp off; 0-d tensors (ranges on the device) and float64 buffers already compute in their dtype."""
    if isinstance(lo, torch.Tensor) or dtype == torch.float64:
        return (1 - m) * lo, (1 - m) * (hi - lo)
    c, lo32 = single(1 - m), single(lo)
    return single(lo32 * c), single(single(single(hi) - lo32) * c)


class _FrozenRanges:
    """While on, train-mode layers quantize with the batch range but leave their running range alone (a
    forward-only probe must not change the model's state: DFQ's sampled alternatives, methods.md §6.3)."""

    def __init__(self):
        self.on = False  # on the instance from the start: a compiled step's guard then never sees it appear


_frozen_ranges = _FrozenRanges()


class frozen_state:
    """Context manager: forward passes that change no running statistic (activation ranges and BN)."""

    def __init__(self, model: nn.Module):
        self.bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def __enter__(self):
        self.saved = [(bn.momentum, None if bn.num_batches_tracked is None else bn.num_batches_tracked.clone())
                      for bn in self.bns]
        for bn in self.bns:  # momentum 0: running = (1 - 0) * running + 0 * batch
            bn.momentum = 0.0
        self.was, _frozen_ranges.on = _frozen_ranges.on, True
        return self

    def __exit__(self, *exc):
        for bn, (m, tracked) in zip(self.bns, self.saved):
            bn.momentum = m
            if tracked is not None:
                bn.num_batches_tracked.copy_(tracked)
        _frozen_ranges.on = self.was
        return False


class _Quantized:
    """Mixin: the role labels and the activation running range of a quantized layer."""

    role: str
    block: int | None

    def _init_quant(self, role: str, block: int | None, act_momentum: float) -> None:
        if role not in ROLES:
            raise ConfigError.single("layer.role", role, f"allowed: {', '.join(ROLES)}")
        self.role, self.block, self.act_momentum = role, block, act_momentum
        self.register_buffer("run_lo", torch.zeros(()))
        self.register_buffer("run_range", torch.zeros(()))

    def _act_range(self, x: torch.Tensor, bits: int, suffix: str = "", observed: bool = True,
                   updates: int = 1) -> tuple | None:
        """(lo, hi) for the input quantizer: the batch range in train mode (updating the running range
        ``updates`` times), the running range in eval mode; Python floats, or 0-d tensors on an accelerator
        (``quant.tensor_range``). ``suffix`` names another pair of buffers (QMatmul's second operand). In train mode
        where the quantizer's backend ``observes`` (the GPU kernels; ``observed``): an ``autograd.Observed`` that
        the quantizer takes the range and updates the EMA with."""
        if bits >= FULL_BITS:
            return None
        if self.training and _frozen_ranges.on:  # a forward-only probe: the batch range, the EMA untouched
            return quant.tensor_range(x)
        run_lo, run_range = getattr(self, "run_lo" + suffix), getattr(self, "run_range" + suffix)
        if self.training and observed and quant.backend_for(x).observes:
            return autograd.Observed((run_lo, run_range, self.act_momentum))
        if self.training:
            lo, hi = quant.tensor_range(x)
            with torch.no_grad():
                m = self.act_momentum
                new_lo, new_range = _ema_terms(lo, hi, m, run_lo.dtype)
                for _ in range(updates):
                    run_lo.mul_(m).add_(new_lo)
                    run_range.mul_(m).add_(new_range)
            return lo, hi
        # eval: the running range, whose step the reference takes from the range itself (``range / qmax``); the
        # end ``lo + range`` is held in double, where it is exact, so ``hi - lo`` gives the range back
        if quant.ranges_on_device(run_lo):
            return run_lo, run_lo.double() + run_range.double()
        lo = float(run_lo)
        return lo, lo + float(run_range)

    def _input_range(self, x: torch.Tensor, prec: Precision | MixedPrecision, suffix: str = "") -> tuple | None:
        """The input quantizer's range at ``prec``: ``_act_range`` at its FW bits; at a ``MixedPrecision``, one
        activation range for every group of the batch (as every option of masked execution sees the whole
        batch's range), the running range updated once, or once per option with execution ``conv``'s mixing
        (the reference quantizes the input at every option, each quantizer call updating the range)."""
        if isinstance(prec, MixedPrecision):
            return self._act_range(x, min(p.act for _, _, p in prec.groups), suffix, observed=False,
                                   updates=1 if prec.mix is None else len(prec.mix.acts))
        return self._act_range(x, prec.act, suffix)

    def _check(self, prec: Precision | MixedPrecision) -> None:
        if prec.skip:
            raise ValueError(f"{type(self).__name__} cannot run at SKIP; skipping is decided per block")

    def extra_repr(self) -> str:  # shown by print(model)
        return f"{super().extra_repr()}, role={self.role}, block={self.block}"


class QConv2d(_Quantized, nn.Conv2d):
    def __init__(self, *args, role: str = "body", block: int | None = None, act_momentum: float = 0.9, **kw):
        nn.Conv2d.__init__(self, *args, **kw)
        self._init_quant(role, block, act_momentum)

    def forward(self, x: torch.Tensor, prec: Precision | MixedPrecision = FP32) -> torch.Tensor:
        self._check(prec)
        if prec.is_fp32:
            return self._conv_forward(x, self.weight, self.bias)
        return autograd.qconv2d(x, self.weight, self.bias, prec, self._input_range(x, prec), self.stride,
                                self.padding, self.dilation, self.groups)


class QLinear(_Quantized, nn.Linear):
    def __init__(self, *args, role: str = "fc", block: int | None = None, act_momentum: float = 0.9, **kw):
        nn.Linear.__init__(self, *args, **kw)
        self._init_quant(role, block, act_momentum)

    def forward(self, x: torch.Tensor, prec: Precision | MixedPrecision = FP32) -> torch.Tensor:
        self._check(prec)
        if prec.is_fp32:
            return F.linear(x, self.weight, self.bias)
        return autograd.qlinear(x, self.weight, self.bias, prec, self._input_range(x, prec))


class QMatmul(_Quantized, nn.Module):
    """``a @ b`` of two activations (batched over leading dims) at ``prec``: each operand quantized at
    ``prec.act`` over its own range (batch range in train mode, running range in eval mode, so an eval forward
    pass depends on no other position or sequence), dL/dY at ``prec.grad``; fp32 is the plain matmul. A
    ``MixedPrecision`` runs each group of rows (dim 0: the samples, a language model's sequences) at its own
    bits, each operand over one range for the whole batch (DFQ's routed execution, methods.md §6.3)."""

    def __init__(self, block: int | None = None, act_momentum: float = 0.9):
        nn.Module.__init__(self)
        self._init_quant("attn", block, act_momentum)
        self.register_buffer("run_lo_b", torch.zeros(()))
        self.register_buffer("run_range_b", torch.zeros(()))

    def forward(self, a: torch.Tensor, b: torch.Tensor, prec: Precision | MixedPrecision = FP32) -> torch.Tensor:
        self._check(prec)
        if prec.is_fp32:
            return torch.matmul(a, b)
        return autograd.qmatmul(a, b, prec, self._input_range(a, prec), self._input_range(b, prec, "_b"))


def quantized_layers(model: nn.Module) -> list[tuple[str, _Quantized]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _Quantized)]
