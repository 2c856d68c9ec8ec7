"""Fixtures of the differential tests."""

from __future__ import annotations

import functools

import pytest

from engine.numerics import autograd, quant
from engine.numerics.precision import FULL_BITS
from tests.reference.upstream import cpt_quantize, fractrain_quantize


@pytest.fixture
def nearest_errors(monkeypatch):
    """Both sides round the errors dL/dY to the nearest level instead of stochastically, so that a backward pass
    can be compared value for value (the stochastic rounding itself is compared, with shared noise, in
    test_quantizers.py). The seams: the reference's module-level ``quantize_grad``, which its ``QConv2d`` calls,
    and the engine's ``autograd._q_grad``, which every quantized node's backward calls."""
    for ref in (fractrain_quantize, cpt_quantize):
        monkeypatch.setattr(ref, "quantize_grad", functools.partial(ref.quantize_grad, stochastic=False))
    monkeypatch.setattr(autograd, "_q_grad",
                        lambda g, bits, reuse=False: g if bits >= FULL_BITS else quant.quantize_tensor(g, bits))
