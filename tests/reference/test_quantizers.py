"""The engine's quantizers beside the reference's ``quantize.py`` (docs/methods.md §1): activations per tensor,
weights per output channel, gradients with stochastic rounding, the running range and eval mode.

Random tensors over a wide range of scales, shapes and widths; every backend the CPU runs (the fused C kernels
and the torch passes)."""

from __future__ import annotations

import pytest
import torch

from engine.numerics import fused, quant
from engine.numerics.affine import levels
from engine.numerics.layers import QConv2d, QLinear
from engine.numerics.precision import Precision
from tests.reference import REFERENCE_CODE_WARNINGS
from tests.reference.upstream import cpt_quantize, fractrain_quantize

pytestmark = REFERENCE_CODE_WARNINGS

BACKENDS = [pytest.param(quant.TORCH, id="torch-passes"),
            pytest.param(quant.FUSED, id="fused-c",
                         marks=pytest.mark.skipif(not fused.usable(), reason="no C compiler here"))]


def _cases(seed: int, n: int = 120):
    """(bits, tensor) pairs: widths 2..16, magnitudes e^-6..e^6, off-centre, NCHW of varied sizes."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        bits = int(torch.randint(2, 17, (), generator=g))
        shape = (int(torch.randint(1, 6, (), generator=g)), int(torch.randint(1, 9, (), generator=g)), 5, 7)
        scale = float(torch.empty(()).uniform_(-6, 6, generator=g).exp())
        yield bits, torch.randn(shape, generator=g) * scale + float(torch.randn((), generator=g)) * scale


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ref", [fractrain_quantize, cpt_quantize], ids=["fractrain", "cpt"])
def test_activations_quantize_as_the_reference(ref, backend):
    """Train mode: the tensor's own min/max (``calculate_qparams(..., reduce_type='extreme')``), nearest."""
    for bits, x in _cases(1):
        qparams = ref.calculate_qparams(x, bits, flatten_dims=(1, -1), reduce_dim=0, reduce_type="extreme")
        expected = ref.quantize(x, qparams=qparams)
        assert torch.equal(backend.own(x, bits, False, None), expected), bits
        assert torch.equal(quant.quantize_tensor(x, bits), expected), bits


@pytest.mark.parametrize("ref", [fractrain_quantize, cpt_quantize], ids=["fractrain", "cpt"])
def test_weights_quantize_as_the_reference(ref):
    """Per output channel (``flatten_dims=(1, -1), reduce_dim=None``), nearest, fresh at every call."""
    for bits, w in _cases(2):
        qparams = ref.calculate_qparams(w, bits, flatten_dims=(1, -1), reduce_dim=None)
        assert torch.equal(quant.quantize_weight(w, bits), ref.quantize(w, qparams=qparams)), bits


@pytest.mark.parametrize("ref", [fractrain_quantize, cpt_quantize], ids=["fractrain", "cpt"])
def test_gradients_round_as_the_reference_given_its_noise(ref):
    """Backward: ``quantize_grad`` over the error's own min/max with ``U(-0.5, 0.5)`` noise from torch's
    generator. Given the same noise (drawn from the same seed), the engine's stochastic rounding gives the same
    values: only where the noise comes from differs (methods.md §9, row 13)."""
    for i, (bits, g) in enumerate(_cases(3)):
        x = torch.zeros_like(g, requires_grad=True)
        torch.manual_seed(100 + i)
        ref.quantize_grad(x, num_bits=bits, flatten_dims=(1, -1)).backward(g)
        torch.manual_seed(100 + i)
        noise = torch.empty_like(g).uniform_(-0.5, 0.5)
        lo, hi = float(g.min()), float(g.max())
        assert torch.equal(quant.quantize(g, bits, lo, hi, stochastic=True, noise=noise), x.grad), bits


def test_the_engines_own_noise_rounds_as_the_references_does_on_average():
    """The engine's 16-bit noise against the reference's float noise: each value rounds to one of the two
    levels around it, and up with the same probability (its distance above the lower level, in steps)."""
    g = torch.linspace(-1.0, 1.0, 4001)
    bits, draws = 3, 200
    lo, hi = -1.0, 1.0
    step = (hi - lo) / levels(bits)
    up = {"engine": torch.zeros_like(g), "reference": torch.zeros_like(g)}
    for d in range(draws):
        torch.manual_seed(d)
        eng = quant.quantize_tensor(g, bits, stochastic=True)
        x = torch.zeros_like(g, requires_grad=True)
        fractrain_quantize.quantize_grad(x, num_bits=bits, flatten_dims=(0, -1)).backward(g)
        for name, q in (("engine", eng), ("reference", x.grad)):
            below = lo + torch.floor((g - lo) / step) * step
            assert ((q - below).abs() < 1e-6).logical_or((q - below - step).abs() < 1e-6).all(), name
            up[name] += (q > below + step / 2).float()
    frac = torch.remainder((g - lo) / step, 1.0)
    for name, count in up.items():
        # 4001 values x 200 draws: the mean up-rate of each tenth of a step within 0.02 of that fraction
        for b in range(10):
            sel = (frac >= b / 10) & (frac < (b + 1) / 10)
            assert abs(float((count[sel] / draws).mean() - frac[sel].mean())) < 0.02, (name, b)


@pytest.mark.parametrize("momentum", [0.1, 0.9], ids=["fractrain-0.1", "cpt-0.9"])
@pytest.mark.parametrize("layer", ["conv", "linear"])
def test_the_running_range_moves_as_the_references(layer, momentum):
    """``QuantMeasure``: ``run = m run + (1 - m) batch`` for the zero point and the range, both from 0, in
    float32 with the scalar rounded to float32; the engine's buffers hold the same bits after every batch. In
    eval mode both quantize over the running range with the step ``range / qmax``."""
    g = torch.Generator().manual_seed(4)
    measured = {"conv": (1, 1, 1, 1), "linear": (1, 1)}[layer]
    for case in range(40):
        bits = int(torch.randint(2, 9, (), generator=g))
        qm = fractrain_quantize.QuantMeasure(shape_measure=measured, flatten_dims=(1, -1), momentum=momentum)
        mod = QConv2d(3, 2, 1, bias=False, act_momentum=momentum) if layer == "conv" else \
            QLinear(3, 2, bias=False, act_momentum=momentum)
        shape = (4, 3, 6, 6) if layer == "conv" else (4, 3)
        for _ in range(5):
            x = torch.randn(shape, generator=g) * float(torch.rand((), generator=g) * 5) + float(torch.randn((), generator=g))
            expected = qm(x, bits)
            lo, hi = mod._act_range(x, bits)
            assert torch.equal(quant.quantize(x, bits, lo, hi), expected)
            assert torch.equal(mod.run_lo, qm.running_zero_point.view(())), case
            assert torch.equal(mod.run_range, qm.running_range.view(())), case
        qm.eval()
        mod.eval()
        x = torch.randn((256,) + shape[1:], generator=g) * 3
        lo, hi = mod._act_range(x, bits)
        ours, theirs = quant.quantize(x, bits, lo, hi), qm(x, bits)
        assert torch.equal(ours, theirs), case


@pytest.mark.parametrize(("fw", "bw"), [(3, 6), (4, 8), (6, 12), (8, 16)])
def test_a_layer_forward_and_backward_is_the_references(fw, bw, nearest_errors):
    """One quantized convolution, the reference's ``QConv2d`` (FracTrain's, with the fixed ``weight_bits`` DFQ
    runs it at) against the engine's, over three batches: the same forward values and running range, and, with
    the errors rounded to nearest on both sides, the same gradients for the input and the weight, straight
    through both value quantizers."""
    torch.manual_seed(5)
    ref = fractrain_quantize.QConv2d(3, 8, 3, padding=1, bias=False, momentum=0.1, weight_bits=4)
    ours = QConv2d(3, 8, 3, padding=1, bias=False, act_momentum=0.1)
    ours.weight.data.copy_(ref.weight.data)
    for _ in range(3):
        x = torch.randn(6, 3, 10, 10)
        xr, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        yr, ye = ref(xr, fw, bw), ours(xe, Precision(act=fw, weight=4, grad=bw))
        assert torch.equal(yr, ye)
        err = torch.randn(ye.shape)
        yr.backward(err)
        ye.backward(err)
        assert torch.equal(xr.grad, xe.grad) and torch.equal(ref.weight.grad, ours.weight.grad)
        ref.weight.grad, ours.weight.grad = None, None
        assert torch.equal(ref.quantize_input_fw.running_range.view(()), ours.run_range)


def test_per_sample_errors_quantize_as_the_imagenet_gated_resnets_options():
    """Per-sample error precision (DFQ's routed and conv execution: each group of rows at its BW bits, over its own
    range) against FracTrain's ImageNet ``QConv2d``, which quantizes ``sg(m_k) dy`` at every option k (one-hot
    masks, each over the whole batch, the other rows zero): a sample's error is the reference's at its own option,
    rounding to nearest, wherever a group's errors take both signs (a range over a group alone and one widened to
    zero then agree). The reference then sums over the options, so each sample's error also takes every other
    option's quantized zero, an offset of under half that option's level; the engine leaves it out (methods.md
    §9, row 18), as the last assertion shows."""
    from tests.reference.upstream import fractrain_imagenet_quantize as ref

    g = torch.Generator().manual_seed(3)
    offsets = 0
    for _ in range(60):
        batch = int(torch.randint(2, 9, (), generator=g))
        grad_bits = [int(b) for b in torch.randint(2, 17, (3,), generator=g)]
        choice = torch.randint(0, 3, (batch,), generator=g)
        dy = torch.randn(batch, 6, 5, 5, generator=g) * float(torch.empty(()).uniform_(-6, 6, generator=g).exp())
        own, summed = torch.zeros_like(dy), torch.zeros_like(dy)
        for k, bits in enumerate(grad_bits):
            masked = (choice == k).float().view(-1, 1, 1, 1) * dy
            qparams = ref.calculate_qparams(masked, bits, flatten_dims=(0, -1), reduce_dim=0, reduce_type="extreme")
            q = ref.quantize(masked, qparams=qparams, flatten_dims=(0, -1), stochastic=False)
            own[choice == k] = q[choice == k]
            summed += q
        order = torch.argsort(choice, stable=True)
        counts, groups, start = torch.bincount(choice, minlength=3).tolist(), [], 0
        for k, count in enumerate(counts):
            if count:
                groups.append((start, start + count, Precision(act=8, weight=8, grad=grad_bits[k])))
                start += count
        sorted_dy = dy.index_select(0, order).contiguous()
        ours = quant.quantize_rows(sorted_dy, tuple(groups), lambda p: p.grad, None, None, False,
                                   torch.empty_like(sorted_dy))
        assert torch.equal(ours, own.index_select(0, order)), (grad_bits, choice.tolist())
        offsets += int(not torch.equal(own, summed))
    assert offsets > 0
