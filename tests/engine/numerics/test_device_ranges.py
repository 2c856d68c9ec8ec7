"""Per-tensor ranges kept on the device (methods.md §1, "Devices"): on an accelerator the quantizers never turn a
range into a Python float, so the host does not wait for the device at every quantized tensor. The path is
chosen by ``quant.ranges_on_device``; here it is forced on for CPU tensors, so CI runs the same code a GPU runs
and compares it with the host-float path that CPU training uses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config.experiment import parse_config
from engine.dfq.gate import cost_per_sample, option_kappa
from engine.dfq.gated import GatedModel
from engine.models import LayerMap, build_model
from engine.numerics import fused, quant
from engine.numerics.layers import QConv2d, QLinear, QMatmul
from engine.numerics.precision import SKIP, Precision
from engine.train import train_and_evaluate


@pytest.fixture
def device_ranges(monkeypatch):
    """The device form on CPU tensors: every quantizer not given a host range takes the torch passes with its
    ranges kept as 0-d tensors (``quant.backend_for`` is the one place a backend is picked)."""
    real = quant.backend_for

    def forced(x, out=None, lo=None):
        on_host = lo is not None and not isinstance(lo, torch.Tensor)
        return real(x, out, lo) if on_host else _DEVICE_FORM

    monkeypatch.setattr(quant, "backend_for", forced)


class _DeviceForm(quant.TorchPasses):
    def ranges_on_device(self, x: torch.Tensor) -> bool:
        return True


_DEVICE_FORM = _DeviceForm()


def test_ranges_stay_tensors_and_quantize_as_floats_do(device_ranges):
    x = torch.randn(4, 3, 6, 6) * 3 + 1
    lo, hi = quant.tensor_range(x)
    assert isinstance(lo, torch.Tensor) and lo.dim() == 0 and float(lo) == float(x.min()) and float(hi) == float(x.max())
    for bits in (2, 4, 8):
        on_device = quant.quantize(x, bits, lo, hi)
        assert len(torch.unique(on_device)) <= 2 ** bits
        for stochastic in (False, True):  # the same arithmetic bit for bit (and the same noise words)
            torch.manual_seed(bits)
            on_device = quant.quantize(x, bits, lo, hi, stochastic=stochastic)
            torch.manual_seed(bits)
            assert torch.equal(quant.quantize(x, bits, float(lo), float(hi), stochastic=stochastic), on_device)
            with fused.disabled():  # the host form's torch passes, as without a C compiler
                torch.manual_seed(bits)
                assert torch.equal(quant.quantize(x, bits, float(lo), float(hi), stochastic=stochastic), on_device)
    torch.manual_seed(0)
    mean = torch.stack([quant.quantize_tensor(x, 3, stochastic=True) for _ in range(300)]).mean(0)
    assert (mean - x).abs().mean() < 0.05 * (float(hi) - float(lo)) / 7  # stochastic rounding stays unbiased


@pytest.mark.parametrize("layer", ["conv", "linear", "matmul"])
def test_quantized_layers_train_and_evaluate_alike_on_both_paths(layer, monkeypatch):
    """Forward values, gradients and the running range of a quantized layer: the device path against the host
    one, in train mode (batch range, EMA update, stochastic error rounding from the same draws) and eval mode
    (the running range, which the device path keeps as a tensor).

    All of it is the same bit for bit: the running range (both paths compute the EMA's terms in float32, as the
    reference does) and eval mode over it (both step by the range itself, as the reference does: the device's
    end ``lo + range`` is held in double)."""
    x = torch.randn(8, 4, 6, 6) if layer == "conv" else torch.randn(8, 5, 12)
    prec = Precision.fwbw(4, 8)
    results = []
    for on_device in (False, True):
        monkeypatch.setattr(quant, "ranges_on_device", lambda t, on=on_device: on)
        torch.manual_seed(1)
        mod = {"conv": lambda: QConv2d(4, 6, 3, padding=1), "linear": lambda: QLinear(12, 7),
               "matmul": lambda: QMatmul()}[layer]()
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(2)
        y = mod(xi, xi.transpose(1, 2), prec) if layer == "matmul" else mod(xi, prec)
        y.square().sum().backward()
        mod.eval()
        assert isinstance(mod._act_range(x, 4)[0], torch.Tensor if on_device else float)  # the running range
        with torch.no_grad():
            y_eval = mod(x, x.transpose(1, 2), prec) if layer == "matmul" else mod(x, prec)
        grads = [xi.grad] + [p.grad for p in mod.parameters()]
        results.append((y.detach(), y_eval, grads, mod.run_lo.clone(), mod.run_range.clone()))
    (y0, e0, g0, lo0, r0), (y1, e1, g1, lo1, r1) = results
    assert torch.equal(y0, y1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert torch.equal(e0, e1)
    assert torch.equal(lo0, lo1) and torch.equal(r0, r1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(("execution", "statistics"), [("masked", "computed"), ("routed", "computed"),
                                                      ("routed", "batch")])
def test_gated_step_is_the_same_on_both_paths(execution, statistics, dtype, monkeypatch):
    """A DFQ training step (mixed-precision rows, the sampled alternatives, the gate's gradient) gives the same
    values bit for bit whichever way the ranges are kept, in float32 (training's type) and in float64, and so
    does an eval forward over the running ranges."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        _gated_step_on_both_paths(execution, statistics, dtype, monkeypatch)
    finally:
        torch.set_default_dtype(before)


def _gated_step_on_both_paths(execution, statistics, dtype, monkeypatch):
    options = [SKIP, Precision.fwbw(2, 6, 4), Precision.fwbw(4, 8, 4), Precision(act=6, weight=4, grad=12)]
    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(3), dtype=dtype)
    y = torch.randint(0, 10, (12,), generator=torch.Generator().manual_seed(4))
    forced = torch.randint(0, 4, (12, 2), generator=torch.Generator().manual_seed(5))
    results = []
    for on_device in (False, True):
        monkeypatch.setattr(quant, "ranges_on_device", lambda t, on=on_device: on)
        torch.manual_seed(0)
        backbone = build_model("tiny", 1, 10)
        backbone.set_layer_map(LayerMap(stem=False, fc=False, head=False))
        model = GatedModel(backbone, options, execution, option_state="skip_apart" if execution == "routed" else "shared",
                           routed_statistics=statistics).train()
        torch.manual_seed(7)
        logits, trace = model(x, forced)
        kappa, omega = option_kappa(options), torch.ones(2)
        (F.cross_entropy(logits, y) + 0.1 * cost_per_sample(trace, kappa, omega).mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            evaluated = model.eval()(x, forced)[0]
        results.append((logits.detach(), grads, evaluated))
    (l0, g0, e0), (l1, g1, e1) = results
    assert l0.dtype == dtype and g0 and all(g.dtype == dtype for g in g0.values())
    assert torch.equal(l0, l1)
    assert g0.keys() == g1.keys()
    for name in g0:
        assert torch.equal(g0[name], g1[name]), name
    assert torch.equal(e0, e1)


@pytest.mark.parametrize("schedule", [{"kind": "static", "fw": 8, "bw": 8},
                                      {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}],
                         ids=["fw8bw8", "dfq_routed"])
@pytest.mark.slow
def test_a_run_on_the_device_path_learns_as_on_the_host_path(schedule, monkeypatch):
    """A short training run end to end (train, running ranges, evaluation) on both paths."""
    figures = []
    for on_device in (False, True):
        monkeypatch.setattr(quant, "ranges_on_device", lambda t, on=on_device: on)
        cfg = parse_config({"name": "device_ranges", "model": {"name": "resnet8"}, "optim": {"epochs": 2},
                            "data": {"dataset": "digits", "batch_size": 64}, "schedule": schedule})
        figures.append(train_and_evaluate(cfg).metrics)
    assert figures[1]["accuracy"] > 0.85
    assert abs(figures[0]["accuracy"] - figures[1]["accuracy"]) < 0.03
    if schedule["kind"] == "dfq":
        assert abs(figures[1]["cp_last_epoch"] - 3.0) < 0.3


@pytest.fixture
def host_reads(monkeypatch):
    """Counts the Python-level reads of a tensor's value on the host (each one a wait on a GPU): ``item``,
    ``tolist``, ``float``, ``int``, ``bool``. Reads inside torch's C++ (``nonzero``, masked indexing) are not
    seen here; the GPU runs count those too (bench/dfq_step.py's ``host_syncs_per_step``)."""
    counts: dict[str, int] = {}
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch._C.TensorBase, name)

        def counted(self, *a, _original=original, _name=name.strip("_"), **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.parametrize("layer", ["conv", "linear", "matmul"])
def test_a_quantized_layer_reads_nothing_on_the_host_where_ranges_stay_on_the_device(layer, device_ranges,
                                                                                     host_reads):
    mod = {"conv": lambda: QConv2d(4, 6, 3, padding=1), "linear": lambda: QLinear(12, 7),
           "matmul": lambda: QMatmul()}[layer]()
    x = (torch.randn(8, 4, 6, 6) if layer == "conv" else torch.randn(8, 5, 12)).requires_grad_(True)
    prec = Precision.fwbw(4, 8)
    y = mod(x, x.transpose(1, 2), prec) if layer == "matmul" else mod(x, prec)
    y.square().sum().backward()
    mod.eval()
    with torch.no_grad():
        mod(x, x.transpose(1, 2), prec) if layer == "matmul" else mod(x, prec)
    assert host_reads == {}


def test_a_routed_step_reads_only_its_option_counts_on_the_host(device_ranges, host_reads):
    """One ``tolist`` per pass of a gated block (its group sizes); the price's check reads its host copy and the
    mixed-precision layers read nothing."""
    options = [SKIP, Precision.fwbw(2, 6, 4), Precision.fwbw(4, 8, 4), Precision(act=6, weight=4, grad=12)]
    backbone = build_model("tiny", 1, 10)
    backbone.set_layer_map(LayerMap(stem=False, fc=False, head=False))
    model = GatedModel(backbone, options, "routed", option_state="skip_apart").train()
    x = torch.randn(12, 1, 8, 8)
    forced = torch.randint(0, 4, (12, 2), generator=torch.Generator().manual_seed(5))
    host_reads.clear()  # building the model reads its tables once
    logits, _ = model(x, forced)
    logits.sum().backward()
    passes = 2 * len(backbone.blocks)  # the training pass and the sampled alternatives' pass of each block
    assert host_reads == {"tolist": passes}


@pytest.mark.parametrize("schedule", [{"kind": "fp32"}, {"kind": "static", "fw": 4, "bw": 8}, {"kind": "pfq"},
                                      {"kind": "cpt", "fw_min": 3, "fw_max": 8, "num_cycles": 2}])
def test_a_static_kinds_training_iteration_reads_the_host_once(schedule, device_ranges, host_reads):
    """The engine's own iteration (schedule, step, cost bookkeeping): the loss and the count of correct
    predictions in one read, nothing else, so a GPU waits once per step (bench/gpu_suite.py counts it there)."""
    from engine.cost.bitops import CostTotals
    from engine.data.datasets import load_data
    from engine.train import Trainer

    cfg = parse_config({"name": "reads", "device": "cpu", "model": {"name": "tiny"}, "schedule": schedule,
                        "data": {"dataset": "digits", "batch_size": 16, "train_subset": 64, "test_subset": 32}})
    data = load_data(cfg.data)
    trainer = Trainer(cfg, data, torch.device("cpu"), CostTotals(), None)
    x, y = next(iter(data.train.batches(16, True, False, torch.Generator().manual_seed(0), torch.device("cpu"))))
    trainer._step(x, y)  # the first iteration builds what later ones reuse
    trainer.iteration += 1
    host_reads.clear()
    trainer._step(x, y)
    assert host_reads == {"tolist": 1}


@pytest.mark.parametrize("schedule", [{"kind": "dfq", "target_cp": 3.0, "execution": "routed"},
                                      {"kind": "dfq", "target_cp": 3.0, "controller": "reference"},
                                      {"kind": "fractrain", "cp0": 1.5, "cp_step": 0.5, "execution": "routed"}])
def test_a_gated_training_iteration_reads_the_host_once_beside_its_group_sizes(schedule, device_ranges, host_reads,
                                                                                monkeypatch):
    """A DFQ / FracTrain iteration: the routed passes' group sizes, then one read of everything else the host
    needs (loss, cp, count correct, choices, the gate's logits); the controller, the cost and the epoch's
    statistics work on that copy (their reads, on host tensors, are not counted)."""
    from engine.cost.bitops import CostTotals
    from engine.data.datasets import load_data
    from engine.dfq.gated_runner import GatedRunner
    from engine.train import Trainer

    cfg = parse_config({"name": "reads", "device": "cpu", "model": {"name": "resnet8"}, "schedule": schedule,
                        "data": {"dataset": "digits", "batch_size": 16, "train_subset": 64, "test_subset": 32}})
    data = load_data(cfg.data)
    trainer = Trainer(cfg, data, torch.device("cpu"), CostTotals(), None)
    x, y = next(iter(data.train.batches(16, True, False, torch.Generator().manual_seed(0), torch.device("cpu"))))
    trainer.iteration = trainer.runner.warmup_iterations  # past the masked warm-up: routed where configured
    trainer._step(x, y)
    trainer.iteration += 1
    read, on_host = GatedRunner._read, {}

    def read_then_host(self, *args):
        out = read(self, *args)
        on_host["before"] = dict(host_reads)
        return out

    monkeypatch.setattr(GatedRunner, "_read", read_then_host)
    passes = {"routed": 0, "masked": 0}
    run_sorted = GatedModel._run_sorted

    def counted(self, *args, **kw):
        passes[self.execution] += 1
        return run_sorted(self, *args, **kw)

    monkeypatch.setattr(GatedModel, "_run_sorted", counted)
    host_reads.clear()
    trainer._step(x, y)
    assert on_host["before"] == {"tolist": passes["routed"] + 1}
    assert (passes["routed"] > 0) == (trainer.runner.model.execution == "routed")
