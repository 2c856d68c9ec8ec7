"""The quantizer against hand-computed values (docs/methods.md §1)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.numerics import autograd, fused, quant
from engine.numerics.layers import QConv2d, QLinear
from engine.numerics.precision import FP32, SKIP, Precision


def test_levels_and_hand_computed_values():
    # 2 bits over [0, 3]: qmax = 3, s = 1 -> values snap to 0, 1, 2, 3; round half to even (0.5 -> 0, 2.5 -> 2)
    x = torch.tensor([0.0, 0.4, 0.5, 1.49, 2.5, 3.0])
    q = quant.quantize(x, 2, 0.0, 3.0)
    assert q.tolist() == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]
    # asymmetric: lo = -1, hi = 2, 2 bits -> s = 1, grid {-1, 0, 1, 2}; values outside are clamped first
    q = quant.quantize(torch.tensor([-5.0, -0.6, 0.7, 9.0]), 2, -1.0, 2.0)
    assert q.tolist() == [-1.0, -1.0, 1.0, 2.0]
    # 0 is not on the grid in general: lo = -0.5, hi = 1, 1 bit -> grid {-0.5, 1}
    assert quant.quantize(torch.tensor([0.0]), 1, -0.5, 1.0).item() == -0.5


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_error_bound_and_level_count(bits):
    torch.manual_seed(0)
    x = torch.randn(10000)
    q = quant.quantize_tensor(x, bits)
    step = (x.max() - x.min()).item() / (2**bits - 1)
    assert (q - x).abs().max().item() <= step / 2 + 1e-5
    assert q.unique().numel() <= 2**bits
    assert q.min().item() == pytest.approx(x.min().item(), abs=1e-6)
    assert q.max().item() == pytest.approx(x.max().item(), abs=1e-5)


def test_step_floor_on_constant_tensor():
    x = torch.full((5,), 3.0)
    assert torch.equal(quant.quantize_tensor(x, 4), x)


def test_stochastic_rounding_is_unbiased():
    torch.manual_seed(0)
    # 3 bits over [0, 7]: s = 1; 0.3 rounds up with probability 0.3
    x = torch.full((200000,), 2.3)
    q = quant.quantize(x, 3, 0.0, 7.0, stochastic=True)
    assert set(q.unique().tolist()) == {2.0, 3.0}
    assert q.mean().item() == pytest.approx(2.3, abs=0.005)
    # many values: E[q] = x everywhere
    x = torch.rand(50, 1000) * 7
    mean = torch.stack([quant.quantize(x, 3, 0.0, 7.0, stochastic=True) for _ in range(400)]).mean(0)
    assert (mean - x).abs().mean().item() < 0.02
    nearest_err = (quant.quantize(x, 3, 0.0, 7.0) - x).abs().mean().item()
    assert nearest_err > 0.2  # the stochastic mean is much closer than nearest rounding


def test_noise_is_uniform_on_open_half_interval():
    torch.manual_seed(1)
    n = quant.uniform_noise(torch.empty(400000))
    assert -0.5 < n.min().item() and n.max().item() < 0.5
    assert n.mean().item() == pytest.approx(0.0, abs=0.003)
    assert n.var().item() == pytest.approx(1 / 12, rel=0.02)


def test_explicit_noise_reproduces_formula():
    x = torch.tensor([0.2, 1.7])
    noise = torch.tensor([0.35, -0.25])
    # u = x + n (s = 1, lo = 0): 0.55 -> 1, 1.45 -> 1
    assert quant.quantize(x, 3, 0.0, 7.0, stochastic=True, noise=noise).tolist() == [1.0, 1.0]


def _next_to_half_levels(bits: int, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 values at most one float32 step from a half-level of the grid over [lo, hi] (float32 ends) for
    which ``u = (x - lo) / s`` and the reciprocal form ``u = x * (1/s) - lo/s`` (with a fused multiply-add and
    without one alike) round to different levels: (x, the division's level, the reciprocal form's level), in
    numpy's float32 arithmetic (IEEE, each operation rounded once), apart from the code under test."""
    f32 = np.float32
    s = f32(quant.tensor_step(bits, lo, hi))
    inv = f32(1.0 / float(s))
    off = f32(-lo * float(inv))
    half = ((np.arange(quant.levels(bits)) + 0.5) * float(s) + lo).astype(f32)
    x = np.concatenate([half, np.nextafter(half, f32(np.inf)), np.nextafter(half, f32(-np.inf))])
    by_division = np.rint((x - f32(lo)) / s)  # rint: half to even
    by_reciprocal = np.rint(x * inv + off)
    by_fma = np.rint((x.astype(np.float64) * float(inv) + float(off)).astype(f32))  # x * inv is exact in double
    differ = (by_division != by_reciprocal) & (by_reciprocal == by_fma)
    return x[differ], by_division[differ], by_reciprocal[differ]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("kernels", [True, False], ids=["fused", "torch_passes"])
def test_the_host_path_divides_by_the_step_next_to_a_half_level(bits, kernels):
    """A per-tensor range held in Python floats quantizes with ``u = (x - lo) / s``, as the reference, the
    device form and the GPU kernels do: a value next to a half-level, where ``x * (1/s) - lo/s`` rounds to the
    neighbouring level, goes to the division's level, with the fused kernels and with the torch passes."""
    lo, hi = float(np.float32(-1.3)), float(np.float32(2.7))
    x, by_division, by_reciprocal = _next_to_half_levels(bits, lo, hi)
    assert len(x) > 0  # such values exist on this grid
    step = quant.tensor_step(bits, lo, hi)
    inv = 1.0 / step  # the reciprocal form as torch computes it (one fused multiply-add) rounds to the other level
    assert torch.equal(torch.add(torch.tensor(-lo * inv), torch.from_numpy(x), alpha=inv).round_(),
                       torch.from_numpy(by_reciprocal))
    with contextlib.nullcontext() if kernels else fused.disabled():
        if kernels and not fused.usable(torch.from_numpy(x)):
            pytest.skip(f"the fused kernels are {fused.status()}")
        got = quant.quantize(torch.from_numpy(x), bits, lo, hi)
    assert torch.equal(got, torch.from_numpy(by_division * np.float32(step) + np.float32(lo)))
    assert torch.equal(got, quant.quantize(torch.from_numpy(x), bits, torch.tensor(lo), torch.tensor(hi)))  # device


def test_weights_are_quantized_per_output_channel():
    w = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 10.0, 20.0, 30.0]])
    q = quant.quantize_weight(w, 2)
    assert torch.equal(q, w)  # each row's own 4-level grid holds its values exactly
    q1 = quant.quantize_weight(w, 1)
    assert q1.tolist() == [[0.0, 0.0, 3.0, 3.0], [0.0, 0.0, 30.0, 30.0]]


def test_qconv_fp32_is_exact_conv():
    torch.manual_seed(0)
    conv = QConv2d(3, 8, 3, 1, 1, bias=False)
    x = torch.randn(2, 3, 9, 9)
    assert torch.equal(conv(x, FP32), F.conv2d(x, conv.weight, None, 1, 1))
    lin = QLinear(5, 4)
    z = torch.randn(3, 5)
    assert torch.equal(lin(z, FP32), F.linear(z, lin.weight, lin.bias))


def test_qconv_forward_uses_quantized_input_and_weight():
    torch.manual_seed(0)
    conv = QConv2d(3, 4, 3, 1, 1, bias=False)
    x = torch.randn(2, 3, 6, 6)
    y = conv(x, Precision(act=4, weight=3, grad=8))
    xq = quant.quantize_tensor(x, 4)
    wq = quant.quantize_weight(conv.weight, 3)
    assert torch.allclose(y, F.conv2d(xq, wq, None, 1, 1), atol=1e-5)
    assert not torch.allclose(y, F.conv2d(x, conv.weight, None, 1, 1), atol=1e-3)


def test_running_range_ema_and_eval_mode():
    conv = QConv2d(1, 1, 1, bias=False, act_momentum=0.9)
    x = torch.tensor([[[[-1.0, 3.0]]]])
    conv(x, Precision.fwbw(8, 8))
    # run = 0.9 * 0 + 0.1 * batch value (weight on the OLD value, the reference's convention)
    assert conv.run_lo.item() == pytest.approx(-0.1)
    assert conv.run_range.item() == pytest.approx(0.4)
    conv(x, Precision.fwbw(8, 8))
    assert conv.run_lo.item() == pytest.approx(-0.19)
    conv.eval()
    before = (conv.run_lo.clone(), conv.run_range.clone())
    with torch.no_grad():
        conv(torch.tensor([[[[5.0, -5.0]]]]), Precision.fwbw(8, 8))
    assert torch.equal(before[0], conv.run_lo) and torch.equal(before[1], conv.run_range)  # eval: no update
    conv.train()
    conv(x, FP32)  # fp32 bypass: no running-range update either
    assert conv.run_lo.item() == pytest.approx(-0.19)


def test_eval_mode_steps_by_the_running_range_itself():
    """Eval mode quantizes over [run_lo, run_lo + run_range] with the step run_range / qmax in float32, as the
    reference divides its running range: not the width of the range's float32 ends, which for these buffers
    is one ulp off (so every value at a level above 0 would be too)."""
    conv = QConv2d(1, 1, 1, bias=False).eval()
    conv.run_lo.fill_(-0.7774889469146729)
    conv.run_range.fill_(4.96874475479126)
    ends = torch.tensor(-0.7774889469146729) + torch.tensor(4.96874475479126)
    assert ends - conv.run_lo != conv.run_range  # the case this test is about
    x = torch.linspace(-1.0, 4.5, 97).view(1, 1, 97, 1)
    step = conv.run_range / 63
    want = torch.sub(x, conv.run_lo).div_(step).clamp_(0, 63).round_().mul_(step).add_(conv.run_lo)
    lo, hi = conv._act_range(x, 6)
    for backend in (quant.TORCH, quant.FUSED) if fused.usable() else (quant.TORCH,):
        assert torch.equal(backend.tensor(x, 6, lo, hi, False, None), want)


def test_ste_gradients_pass_straight_through():
    torch.manual_seed(0)
    conv = QConv2d(2, 3, 3, 1, 1, bias=False)
    x = torch.randn(2, 2, 5, 5, requires_grad=True)
    y = conv(x, Precision.fwbw(3, 32))  # quantized forward, fp32 backward
    g = torch.randn_like(y)
    y.backward(g)
    xq = quant.quantize_tensor(x.detach(), 3)
    wq = quant.quantize_weight(conv.weight.detach(), 3)
    # dL/dA = W_q^T g and dL/dW = A_q^T g, passed straight to the fp32 tensors (no clipping mask)
    gx = torch.nn.grad.conv2d_input(x.shape, wq, g, padding=1)
    gw = torch.nn.grad.conv2d_weight(xq, conv.weight.shape, g, padding=1)
    assert torch.allclose(x.grad, gx, atol=1e-5)
    assert torch.allclose(conv.weight.grad, gw, atol=1e-4)


def test_gradient_quantization_in_backward_only():
    torch.manual_seed(0)
    lin = QLinear(6, 5, bias=False)
    x = torch.randn(4, 6, requires_grad=True)
    y_fp = F.linear(x, lin.weight)
    y_q = lin(x, Precision.fwbw(32, 2))  # 2-bit errors, fp32 forward
    assert torch.equal(y_fp, y_q)  # forward is the identity
    g = torch.randn(4, 5)
    y_q.backward(g)
    # the error dL/dY reaching the EB pass took at most 4 distinct values (2 bits)
    ge = x.grad @ torch.linalg.pinv(lin.weight.detach())
    assert torch.unique(ge.round(decimals=4)).numel() <= 4
    assert not torch.allclose(x.grad, g @ lin.weight.detach(), atol=1e-3)
    # quantize_grad on its own: identity forward, quantized backward
    z = torch.randn(1000, requires_grad=True)
    out = autograd.quantize_grad(z, 1)
    assert torch.equal(out, z)
    out.backward(torch.randn(1000))
    assert z.grad.unique().numel() <= 2


def test_skip_is_refused_by_a_layer():
    with pytest.raises(ValueError):
        QConv2d(1, 1, 1)(torch.zeros(1, 1, 2, 2), SKIP)


def test_precision_value_type():
    assert str(Precision.fwbw(8, 8)) == "FW8/BW8"
    assert str(Precision.fwbw(4, 8, 6)) == "FW4/BW8/W6"
    assert FP32.is_fp32 and not Precision.fwbw(32, 8).is_fp32
    assert Precision.fwbw(8, 8).bitops_per_mac() == 192 and SKIP.bitops_per_mac() == 0
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="precision.act"):
        Precision(act=0, weight=8, grad=8)
    with pytest.raises(ConfigError):
        Precision(act=33, weight=8, grad=8)


def test_mixed_precision_with_every_group_at_32_bit_fw_quantizes_only_the_weights():
    """A routed batch whose options all keep 32-bit activations (FW32, 4-bit weights) has no activation range;
    the layers run on the unquantized input with the quantized weights instead of failing."""
    from engine.numerics.precision import MixedPrecision

    torch.manual_seed(0)
    conv, lin = QConv2d(3, 4, 3, padding=1, bias=False), QLinear(5, 2)
    groups = ((0, 2, Precision(act=32, weight=4, grad=8)), (2, 4, Precision(act=32, weight=4, grad=32)))
    prec = MixedPrecision(groups, 4)
    x, v = torch.randn(4, 3, 6, 6, requires_grad=True), torch.randn(4, 5)
    y = conv(x, prec)
    assert torch.allclose(y, F.conv2d(x, quant.quantize_weight(conv.weight, 4), padding=1), atol=1e-6)
    assert torch.allclose(lin(v, prec), F.linear(v, quant.quantize_weight(lin.weight, 4), lin.bias), atol=1e-6)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("on_device", [False, True], ids=["host_ranges", "device_ranges"])
def test_mixed_rows_quantize_each_group_as_the_per_tensor_quantizer_does(on_device, monkeypatch):
    """``quant.quantize_rows`` quantizes all groups in whole-tensor passes with per-row parameters; each group's rows must
    come out as ``quant.quantize`` gives them at that group's bits, bit for bit (activations: the batch's one
    range; errors: the group's own range, stochastic rounding unbiased), and a 32-bit group unchanged. Both with
    the ranges as Python floats (CPU) and kept as tensors (an accelerator's path, run here on the CPU)."""
    monkeypatch.setattr(quant, "ranges_on_device", lambda t: on_device)
    torch.manual_seed(0)
    x = torch.randn(40, 3, 5, 5)
    x[10:20] *= 7.0  # a group with a much wider range than the others
    groups = ((0, 10, Precision.fwbw(2, 6)), (10, 20, Precision.fwbw(4, 12)), (20, 25, FP32),
              (25, 40, Precision.fwbw(6, 8)))
    lo, hi = (torch.tensor(-1.5), torch.tensor(2.0)) if on_device else (-1.5, 2.0)  # as _act_range gives them
    y = quant.quantize_rows(x, groups, lambda p: p.act, lo, hi, False, torch.empty_like(x))
    for start, end, p in groups:
        want = x[start:end] if p.act >= 32 else quant.quantize(x[start:end], p.act, -1.5, 2.0)
        assert torch.equal(y[start:end], want), (start, p.act)
    g = quant.quantize_rows(x, groups, lambda p: p.grad, None, None, False, torch.empty_like(x))
    for start, end, p in groups:
        want = x[start:end] if p.grad >= 32 else quant.quantize_tensor(x[start:end], p.grad)
        assert torch.equal(g[start:end], want), (start, p.grad)
        if p.grad < 32:  # on the group's own grid: at most 2^b levels, spanning its own min and max
            assert len(torch.unique(g[start:end])) <= 2 ** p.grad
            assert torch.isclose(g[start:end].max(), x[start:end].max(), atol=1e-5)
    mean = sum(quant.quantize_rows(x, groups, lambda p: p.grad, None, None, True, torch.empty_like(x))
               for _ in range(300)) / 300
    for start, end, p in groups:
        step = (x[start:end].max() - x[start:end].min()) / (2 ** p.grad - 1) if p.grad < 32 else 1.0
        assert (mean[start:end] - x[start:end]).abs().mean() < 0.05 * step, (start, p.grad)


def test_mixed_rows_refuse_groups_that_do_not_tile_the_batch():
    """The per-row tables assume contiguous groups in order covering every row (as ``MixedPrecision`` is built)."""
    x, p = torch.randn(6, 3), Precision.fwbw(4, 8)
    for groups in [((0, 2, p), (3, 6, p)), ((2, 6, p), (0, 2, p)), ((0, 2, p), (2, 5, p))]:
        with pytest.raises(ValueError, match="contiguous"):
            quant.quantize_rows(x, groups, lambda q: q.act, -1.0, 1.0, False, torch.empty_like(x))
    assert quant.quantize_rows(x[:0], (), lambda q: q.act, None, None, False, torch.empty_like(x[:0])).shape == (0, 3)


def test_weights_fixed_quantizes_each_weight_once_per_bit_width(monkeypatch):
    """Inside ``weights_fixed`` a weight is quantized once per bit-width and every pass gets that copy (the
    values a fresh quantization gives); outside it, or in a later stretch after the weight changed, it is
    quantized afresh."""
    calls = []
    fresh = quant.quantize_weight
    monkeypatch.setattr(quant, "quantize_weight", lambda w, b: calls.append(b) or fresh(w, b))
    torch.manual_seed(0)
    w, v = torch.randn(4, 3, 3, 3), torch.randn(4, 3, 3, 3)
    with autograd.weights_fixed():
        first = autograd._q_weight(w, 4)
        assert autograd._q_weight(w, 4) is first and torch.equal(first, fresh(w, 4))
        other = autograd._q_weight(w, 2)  # its own copy per bit-width
        assert torch.equal(other, fresh(w, 2)) and not torch.equal(other, first)
        assert torch.equal(autograd._q_weight(v, 4), fresh(v, 4))  # and per weight
        assert autograd._q_weight(w, 32) is w
        with autograd.weights_fixed():  # a nested stretch has its own table and gives the outer one back
            autograd._q_weight(w, 4)
        assert autograd._q_weight(w, 4) is first
        seen = []  # another thread has no table (each thread's forwards keep their own)
        worker = threading.Thread(target=lambda: seen.extend(autograd._q_weight(w, 4) for _ in range(2)))
        worker.start()
        worker.join()
        assert seen[0] is not seen[1] and seen[0] is not first and torch.equal(seen[0], first)
    assert calls == [4, 2, 4, 4, 4, 4]
    w.mul_(-2.0)  # an optimizer step between two forwards
    with autograd.weights_fixed():
        assert torch.equal(autograd._q_weight(w, 4), fresh(w, 4)) and not torch.equal(fresh(w, 4), first)
    autograd._q_weight(w, 4)
    assert calls == [4, 2, 4, 4, 4, 4, 4, 4]


def test_mixed_rows_give_the_same_values_for_a_repeated_layout():
    """The groups' layout (sizes, row group ids) is made once per distinct groups and reused by every layer
    of a pass: a second call with the same groups, or with other values, quantizes as a first call does."""
    torch.manual_seed(1)
    groups = ((0, 3, Precision.fwbw(2, 6)), (3, 8, Precision.fwbw(4, 12)))
    x, z = torch.randn(8, 5), torch.randn(8, 5) * 3
    outs = []
    for t in (x, z, x):
        outs.append(quant.quantize_rows(t, groups, lambda p: p.grad, None, None, False, torch.empty_like(t)))
        for start, end, p in groups:
            assert torch.allclose(outs[-1][start:end], quant.quantize_tensor(t[start:end], p.grad), atol=1e-5)
    assert torch.equal(outs[0], outs[2])
    short = ((0, 3, Precision.fwbw(2, 6)), (3, 7, Precision.fwbw(4, 12)))  # same spans, one row fewer
    assert quant.quantize_rows(x[:7], short, lambda p: p.grad, None, None, False, torch.empty_like(x[:7])).shape == (7, 5)
    with pytest.raises(ValueError, match="contiguous"):  # a layout made for 7 rows is no layout for 8
        quant.quantize_rows(x, short, lambda p: p.grad, None, None, False, torch.empty_like(x))
