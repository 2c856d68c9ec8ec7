"""The GPU quantizer kernels (engine/numerics/gpu_kernels.py, methods.md §1 "GPU kernels"), run on the CPU under Triton's
interpreter: nearest rounding gives the torch passes' bits (per tensor, per channel, per row group), stochastic
rounding is unbiased with the right variance and reproduces itself from torch's seed, the running range is
updated as the torch ops update it, the custom ops pass torch's own op checks (fake implementations included),
and a model trains through them eagerly and compiled."""

from __future__ import annotations

import contextlib
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first defined: before any use

import pytest  # noqa: E402
import torch  # noqa: E402

from engine.numerics import gpu_kernels, passes, quant  # noqa: E402
from engine.numerics.layers import QConv2d, QLinear  # noqa: E402
from engine.numerics.precision import FP32, MixedPrecision, Precision  # noqa: E402
from engine.schedules.static_runner import compiled, make_step  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.skipif(not gpu_kernels.interpreting() or gpu_kernels._triton_version() is None,
                                reason="needs Triton and TRITON_INTERPRET=1 before the kernels' first use")


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.nan_to_num(123.0), b.nan_to_num(123.0)) and a.isnan().sum() == b.isnan().sum()


def _sample(shape, seed: int) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3 + 0.5
    return x


def test_the_kernels_take_cuda_tensors_and_cpu_ones_only_when_asked():
    x = torch.zeros(4)
    assert not gpu_kernels.usable(x)
    with gpu_kernels.on_cpu():
        assert gpu_kernels.usable(x)
        assert not gpu_kernels.usable(x.double())
    assert not gpu_kernels.usable(x)
    assert gpu_kernels.status().startswith("on (triton ")


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 7, 9), (3, 300, 300)])  # the last: two blocks per program
@pytest.mark.slow
def test_the_per_tensor_quantizer_gives_the_torch_passes_bits(shape):
    x = _sample(shape, len(shape))
    lo, hi = torch.aminmax(x)
    for bits in (1, 2, 4, 8, 16) if x.numel() < 10**5 else (3,):
        want = quant.quantize(x, bits, lo, hi)  # the torch passes for a range held in tensors (the GPU's)
        with gpu_kernels.on_cpu():
            assert _equal(quant.quantize(x, bits, lo, hi), want), bits
            assert _equal(quant.quantize_tensor(x, bits), want), bits  # its own range: the partial ranges reduced


def test_eval_mode_steps_by_the_running_range_as_the_host_does():
    """In eval mode a layer quantizes over its running range with the step ``range / qmax`` (the reference's),
    on the kernels as on the host: the end ``lo + range`` they are given is held in double, and the kernel takes
    the width in float32. These buffers are a case where the float32 ends' width is one ulp off the range."""
    conv = QConv2d(1, 1, 1, bias=False).eval()
    conv.run_lo.fill_(-0.7774889469146729)
    conv.run_range.fill_(4.96874475479126)
    x = torch.linspace(-1.0, 4.5, 97).view(1, 1, 97, 1)
    want = quant.quantize(x, 6, *conv._act_range(x, 6))  # the host form: Python floats
    with gpu_kernels.on_cpu():
        lo, hi = conv._act_range(x, 6)
        assert isinstance(hi, torch.Tensor) and hi.dtype == torch.float64
        assert _equal(quant.quantize(x, 6, lo, hi), want)


def test_nan_propagates_and_a_constant_tensor_keeps_its_value():
    x = _sample((5, 33), 1)
    x[2, 3] = float("nan")
    with gpu_kernels.on_cpu():
        got = quant.quantize_tensor(x, 4)
    want = quant.quantize(x, 4, *torch.aminmax(x))
    assert _equal(got, want) and got.isnan().all()  # torch's range of a tensor holding NaN is NaN
    c = torch.full((3, 9), 0.37)
    with gpu_kernels.on_cpu():
        assert torch.equal(quant.quantize_tensor(c, 3), c)
        assert torch.equal(quant.quantize_weight(c, 3), c)


@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (5, 1031), (3, 1)])
def test_the_weight_quantizer_gives_the_torch_passes_bits_per_channel(shape):
    w = _sample(shape, 2)
    w[0].fill_(0.25)  # a channel of one value: the step floor
    for bits in (1, 2, 4, 8):
        want = quant.quantize_weight(w, bits)
        with gpu_kernels.on_cpu():
            assert _equal(quant.quantize_weight(w, bits), want), bits


GROUPS = ((0, 3, Precision.fwbw(4, 8)), (3, 4, Precision.fwbw(32, 32)), (4, 9, Precision.fwbw(6, 2)),
          (9, 13, Precision.fwbw(2, 3)))


@pytest.mark.parametrize("ranged", [True, False])
def test_the_row_quantizer_gives_the_torch_passes_bits(ranged):
    """Groups of rows at different bits (32 bits: copied), over one range for all or each group's own."""
    x = _sample((13, 3, 5, 5), 3)
    sizes, gid = passes.layout(GROUPS, 13, x.device)
    bits = [p.act for _, _, p in GROUPS]
    lo, hi = torch.aminmax(x) if ranged else (None, None)
    want = passes.rows_device(x, GROUPS, sizes, gid, bits, lo, hi, False, torch.empty_like(x))
    with gpu_kernels.on_cpu():
        assert quant.backend_for(x) is quant.TRITON
        got = quant.TRITON.rows(x, GROUPS, sizes, gid, bits, lo, hi, False, torch.empty_like(x))
    assert _equal(got, want)
    assert torch.equal(got[3], x[3])


def _rounding_moments(q: torch.Tensor, x: torch.Tensor, step: float) -> tuple[float, float, float, int]:
    """(mean error, mean squared error, the squared error expected of unbiased rounding, n) in units of a step."""
    e = ((q - x) / step).double()
    f = torch.frac(x.double() / step)
    return float(e.mean()), float((e * e).mean()), float((f * (1 - f)).mean()), e.numel()


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.slow
def test_stochastic_rounding_is_unbiased_with_the_variance_of_a_fair_coin(rows):
    """For x at fraction f of a step, unbiased stochastic rounding errs by 1 - f with probability f and by -f
    otherwise: mean 0 and mean square f (1 - f). Checked to within five standard errors on 200,000 values."""
    n = 200_000
    x = torch.rand(n, generator=torch.Generator().manual_seed(0)) * 15  # 4 bits over [0, 15]: a step of 1
    x[0], x[1] = 0.0, 15.0
    lo, hi = torch.tensor(0.0), torch.tensor(15.0)
    torch.manual_seed(1)
    with gpu_kernels.on_cpu():
        if rows:  # two rows of a group each
            g = ((0, 1, Precision.fwbw(4, 4)), (1, 2, Precision.fwbw(4, 4)))
            q = quant.quantize_rows(x.view(2, -1), g, lambda p: p.grad, lo, hi, True, torch.empty(2, n // 2)).view(n)
        else:
            q = quant.quantize(x, 4, lo, hi, stochastic=True)
    assert torch.equal(q, q.round())  # every value on a level
    mean, square, want_square, count = _rounding_moments(q, x, 1.0)
    assert abs(mean) < 5 * math.sqrt(want_square / count)
    assert abs(square - want_square) < 5 * math.sqrt(want_square / count)  # var(e^2) <= E[e^2] for |e| <= 1
    near = quant.quantize(x, 4, lo, hi)  # and it is not nearest rounding in disguise
    assert (q != near).float().mean() > 0.2


def test_stochastic_rounding_reproduces_itself_from_torchs_seed():
    x = _sample((17, 301), 4)
    with gpu_kernels.on_cpu():
        torch.manual_seed(7)
        a, b = quant.quantize_tensor(x, 4, stochastic=True), quant.quantize_tensor(x, 4, stochastic=True)
        torch.manual_seed(7)
        again = quant.quantize_tensor(x, 4, stochastic=True)
    assert torch.equal(a, again)
    assert not torch.equal(a, b)  # the next call draws a new key


def test_the_observing_quantizer_updates_the_running_range_as_the_torch_ops_do():
    x = _sample((6, 5, 7), 5)
    m = 0.9
    run_lo, run_range = torch.tensor(0.3), torch.tensor(2.0)
    want_lo, want_range = run_lo.clone(), run_range.clone()
    lo, hi = torch.aminmax(x)
    want_lo.mul_(m).add_((1 - m) * lo)  # layers._act_range's ops
    want_range.mul_(m).add_((1 - m) * (hi - lo))
    with gpu_kernels.on_cpu():
        got = gpu_kernels.quantize_observed(x, 5, run_lo, run_range, m)
    assert torch.equal(run_lo, want_lo) and torch.equal(run_range, want_range)
    assert _equal(got, quant.quantize(x, 5, lo, hi))


@pytest.mark.slow
def test_the_custom_ops_pass_torchs_op_checks():
    """Schemas, fake (meta) implementations and the aot dispatch that torch.compile relies on."""
    x = _sample((4, 3, 5, 5), 6)
    lo, hi = torch.aminmax(x)
    _, gid = passes.layout(GROUPS[:1] + ((3, 4, Precision.fwbw(2, 2)),), 4, x.device)
    levels = torch.tensor([15.0, 15.0, 15.0, 0.0])
    with gpu_kernels.on_cpu():
        torch.library.opcheck(gpu_kernels.quant_tensor_op, (x, 4, lo, hi, None))
        torch.library.opcheck(gpu_kernels.quant_tensor_op, (x, 4, None, None, None))
        torch.library.opcheck(gpu_kernels.quant_channel_op, (x, 3))
        torch.library.opcheck(gpu_kernels.quant_rows_op, (x, gid, levels, lo, hi, None))
        torch.library.opcheck(gpu_kernels.quant_rows_op, (x, gid, levels, None, None, None))
        torch.library.opcheck(gpu_kernels.quant_observe_op, (x, 4, torch.tensor(0.0), torch.tensor(1.0), 0.9))


class _Tiny(torch.nn.Module):
    """A conv, a ReLU and a linear layer, both quantized: enough for a step's every quantizer."""

    def __init__(self):
        super().__init__()
        self.conv = QConv2d(1, 4, 3, padding=1, role="body", block=0)
        self.fc = QLinear(4 * 6 * 6, 3)

    def forward(self, x, prec=FP32):
        return self.fc(torch.relu(self.conv(x, prec)).flatten(1), prec)


def _train(model, prec_at, steps: int, compile: str = "off") -> list[float]:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = make_step(compiled(model, compile), opt)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for i in range(steps):
        x = torch.randn(8, 1, 6, 6, generator=gen)
        y = (x.mean((1, 2, 3)) > 0).long() + (x[:, 0, 0, 0] > 1).long()
        losses.append(step(x, y, prec_at(i))[0])
    return losses


@pytest.mark.slow
def test_a_model_trains_through_the_kernels_as_through_the_torch_passes():
    """Forward at FW8 and backward at 32 bits: every rounding is nearest, so both paths give the same steps
    up to the order of float operations inside the convolutions, and the running ranges move alike."""
    prec = Precision(act=8, weight=8, grad=32)
    torch.manual_seed(3)
    ref = _Tiny()
    ker = _Tiny()
    ker.load_state_dict(ref.state_dict())
    want = _train(ref, lambda i: prec, 6)
    with gpu_kernels.on_cpu():
        got = _train(ker, lambda i: prec, 6)
    assert got == pytest.approx(want, rel=1e-4)
    assert float(ker.conv.run_range) == pytest.approx(float(ref.conv.run_range), rel=1e-4)
    with gpu_kernels.on_cpu():  # stochastic gradients too: the step runs and learns
        sr = _train(_Tiny(), lambda i: Precision.fwbw(8, 8), 12)
    assert all(math.isfinite(v) for v in sr)


@pytest.mark.slow
def test_a_compiled_step_runs_the_kernels_as_custom_ops_without_graph_breaks():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(3)
    eager, comp = _Tiny(), _Tiny()
    comp.load_state_dict(eager.state_dict())
    prec = Precision(act=8, weight=8, grad=32)
    with gpu_kernels.on_cpu():
        want = _train(eager, lambda i: prec, 4)
        got = _train(comp, lambda i: prec, 4, compile="default")
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert got == pytest.approx(want, rel=1e-4)
    assert float(comp.conv.run_lo) == pytest.approx(float(eager.conv.run_lo), rel=1e-4)  # the op's mutation kept


@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.slow
def test_a_compiled_step_compiles_two_graphs_for_a_whole_cpt_cycle(kernels):
    """Bit-widths that change at every step (CPT) do not recompile the step at every change: the first precision
    compiles a graph, the first change one more with symbolic bit-widths, and the rest reuse it; each step
    computes at its own bit-widths (the losses follow eager training)."""
    from torch._dynamo.utils import counters

    cycle = [Precision(act=b, weight=b, grad=32) for b in (3, 5, 8, 4, 6)]
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(3)
    eager, comp = _Tiny(), _Tiny()
    comp.load_state_dict(eager.state_dict())
    with gpu_kernels.on_cpu() if kernels else contextlib.nullcontext():
        want = _train(eager, lambda i: cycle[i % 5], 10)
        got = _train(comp, lambda i: cycle[i % 5], 10, compile="default")
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert got == pytest.approx(want, rel=1e-4)


def test_mixed_precision_layers_take_the_row_kernel():
    torch.manual_seed(4)
    layer = QConv2d(2, 3, 3, padding=1)
    x = torch.randn(5, 2, 4, 4, requires_grad=True)
    mixed = MixedPrecision(groups=((0, 2, Precision.fwbw(4, 8)), (2, 5, Precision.fwbw(6, 4))), weight=8)
    with gpu_kernels.on_cpu():
        y = layer(x, mixed)
        y.square().sum().backward()
    assert y.shape == (5, 3, 4, 4) and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.slow
def test_the_switch_keeps_the_torch_passes_and_a_bad_value_is_refused_before_the_command_starts(run_cli,
                                                                                                  monkeypatch):
    monkeypatch.setenv("FRACTUNE_GPU_KERNELS", "off")
    assert gpu_kernels.status() == "off (FRACTUNE_GPU_KERNELS=off)"
    with gpu_kernels.disabled():
        assert not gpu_kernels.usable(torch.zeros(1))
    monkeypatch.delenv("FRACTUNE_GPU_KERNELS")
    r = run_cli("validate", str(ROOT / "examples" / "fmnist_dfq.yaml"), env={"FRACTUNE_GPU_KERNELS": "maybe"},
                timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "FRACTUNE_GPU_KERNELS" in lines[0] and "'maybe'" in lines[0] and "off" in lines[0]
