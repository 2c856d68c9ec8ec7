"""Whole networks beside the reference's, holding the same weights, each built by the engine from a run's config as
``fractune train`` builds it (``engine.train.prepare``): the static CIFAR ResNets of CPT (cpt_cifar/models.py) and
PFQ (fractrain_cifar/models.py ``ResNet``), FracTrain's static MobileNetV2, CPT's ImageNet ResNet-18, and DFQ's
and FracTrain's gated ResNet (``ResNetRecurrentGateSP``) and gated MobileNetV2 (``MobileNetV2_RNN``).

SGD steps (three, or one for the larger nets), then an evaluation: the same logits, decisions, cp, gradients and
running ranges. The errors are rounded to nearest on both sides (``nearest_errors``) so that backward passes
compare value for value. The reference's head pools with ``AvgPool2d`` over the last map, the engine's with
adaptive pooling (it also takes 28x28 and 8x8 inputs): both average the same values, in another order, so the
reference is given the engine's pooling and the comparison stays exact."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
import torch.nn.functional as F

from engine.config.experiment import parse_config
from engine.data.catalog import INFO
from engine.dfq.controller import build_controller
from engine.dfq.gate import cost_per_sample, gated_cp, option_kappa
from engine.numerics.precision import Precision
from engine.train import prepare
from tests.reference import REFERENCE_CODE_WARNINGS
from tests.reference.upstream import cpt_models, fractrain_loops, fractrain_models
from tests.reference.upstream.fractrain_loops import dfq_cost, dfq_option_costs, dfq_reg, fractrain_reg

pytestmark = REFERENCE_CODE_WARNINGS

N = 1  # blocks per group: ResNet-8, whose second and third blocks downsample (a projection and its BN)
BATCH = 8


def _engine_model(schedule: dict):
    """The model and config of a CIFAR-10 run of ResNet-8 on ``schedule``."""
    cfg = parse_config({"model": {"name": f"resnet{6 * N + 2}"}, "data": {"dataset": "cifar10"}, "schedule": schedule})
    model, _ = prepare(cfg, INFO["cifar10"], torch.device("cpu"))
    return model, cfg


def _backbone_keys(key: str, value: torch.Tensor, prefix: str = "", n: int = N) -> tuple[str, torch.Tensor] | None:
    """A reference ResNet's state-dict entry under the engine's name (None: nothing in the engine holds it);
    ``n`` blocks per group."""
    if "quantize_input" in key:
        return None  # running ranges: both start at 0, compared after training
    if key.startswith("conv1."):
        return prefix + "stem." + key[6:], value
    if key.startswith("bn1."):
        return prefix + "stem_bn." + key[4:], value
    if key.startswith("fc."):
        return prefix + key, value
    group, rest = key.split(".", 1)
    g, kind_i = group[len("group"):].split("_")
    kind = kind_i.rstrip("0123456789")
    j = (int(g) - 1) * n + int(kind_i[len(kind):])
    if kind != "layer":
        return None
    rest = rest.replace("downsample.", "proj.")
    if rest.startswith("bn3."):  # the projection's BN; a block without a projection never uses its bn3
        if j not in (n, 2 * n):  # the first blocks of groups 2 and 3 downsample
            return None
        rest = "proj_bn." + rest[4:]
    return f"{prefix}blocks.{j}.{rest}", value


def _renamed(names, pairs) -> dict:
    """The reference's (key, tensor) pairs under the engine's names (``names`` maps one pair, None to drop it)."""
    return dict(filter(None, (names(k, v) for k, v in pairs)))


def _load(engine_model, entries: dict) -> None:
    expected = {k for k in engine_model.state_dict() if not k.endswith(("run_lo", "run_range"))}
    expected -= {"option_cost", "price"}
    assert set(entries) == expected
    engine_model.load_state_dict(entries, strict=False)


def _close(a: torch.Tensor, b: torch.Tensor, rel: float, what: str) -> None:
    """``b`` within ``rel`` of ``a``'s largest magnitude, everywhere."""
    assert float((a - b).abs().max()) <= rel * float(a.abs().max()), what


def _same_running_ranges(ref, ours, names, count: int | None = None, rel: float | None = None) -> None:
    """Every quantized conv's running range (zero point and width) in the reference, against the engine layer
    that holds the same weight (``names`` maps the weight's key); fp32 layers (a gated model's stem) stay at 0
    in both. ``count``: how many layers the reference quantizes; ``rel``: equal to that tolerance (``_close``)
    instead of bit for bit."""
    compared = 0
    for name, mod in ref.named_modules(remove_duplicate=False):
        measure = getattr(mod, "quantize_input_fw", None) or getattr(mod, "quantize_input", None)
        if measure is None or "_ds" in name:  # groupG_dsI: the block's own projection, registered twice
            continue
        layer = ours.get_submodule(names(name + ".weight", mod.weight)[0].rsplit(".", 1)[0])
        for theirs, mine in ((measure.running_zero_point.reshape(()), layer.run_lo),
                             (measure.running_range.reshape(()), layer.run_range)):
            if rel is None:
                assert torch.equal(theirs, mine), name
            else:
                _close(theirs, mine, rel, name)
        compared += 1
    assert compared == count if count is not None else compared > 0


def _sgd(*models) -> None:
    with torch.no_grad():
        for model in models:
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                    p.grad = None


def _trains_alike(ref, ours, names, ref_bits: tuple[int, int], prec: Precision, steps: int, batch: int,
                  layers: int | None = None) -> None:
    """``steps`` SGD steps of both static networks on the same batches: the same logits and the same gradient
    for every weight, bit for bit; then the same running ranges, and the same logits in eval mode."""
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
        ref_logits, our_logits = ref(x, *ref_bits), ours(x, prec)
        assert torch.equal(ref_logits, our_logits)
        F.cross_entropy(ref_logits, y).backward()
        F.cross_entropy(our_logits, y).backward()
        theirs = [(k, p.grad) for k, p in ref.named_parameters() if p.grad is not None]
        for name, grad in _renamed(names, theirs).items():
            assert torch.equal(grad, ours.get_parameter(name).grad), name
        _sgd(ref, ours)
    _same_running_ranges(ref, ours, names, layers)
    ref.eval()
    ours.eval()
    with torch.no_grad():
        x = torch.randn(batch, 3, 32, 32, generator=g)
        assert torch.equal(ref(x, *ref_bits), ours(x, prec))


def _engine_pooling(monkeypatch, module) -> None:
    """A reference module whose head pools with ``F.avg_pool2d`` over the last map, given the engine's adaptive
    pooling (the same values, summed in another order), as the ResNets' ``avgpool`` module is replaced."""
    monkeypatch.setattr(module, "F", types.SimpleNamespace(relu=F.relu,
                                                           avg_pool2d=lambda x, k: F.adaptive_avg_pool2d(x, 1)))


@pytest.mark.parametrize(("code", "fw", "bw"), [("cpt", 4, 8), ("cpt", 3, 6), ("pfq", 6, 8)])
def test_a_static_resnet_trains_as_the_references(code, fw, bw, nearest_errors):
    """CPT's and PFQ's ResNet at one precision: the stem and every block conv (projections included) at FW
    with weights at FW and errors at BW, the FC in fp32, activation momentum 0.9. Three steps."""
    torch.manual_seed(0)
    if code == "cpt":
        ref = cpt_models.ResNet(cpt_models.BasicBlock, [N, N, N])
    else:
        ref = fractrain_models.ResNet(fractrain_models.BasicBlock, [N, N, N])
    ref.avgpool = torch.nn.AdaptiveAvgPool2d(1)
    ours, _ = _engine_model({"kind": "static", "fw": fw, "bw": bw})
    _load(ours, _renamed(_backbone_keys, ref.state_dict().items()))
    # the stem, two convs per block, two projections
    _trains_alike(ref, ours, _backbone_keys, (fw, bw), Precision.fwbw(fw, bw), 3, BATCH, 1 + 3 * N * 2 + 2)


def _is_gate(key: str) -> bool:
    """Whether a reference gated net's ``key`` is its gate's: the recurrent part or an embedding."""
    module = key.partition(".")[0]
    return module in ("control", "gate_layer1") or "_gate" in module


def _gate_keys(key: str, value: torch.Tensor, gate_index) -> tuple[str, torch.Tensor] | None:
    """A reference gate's entry (``_is_gate``) under the engine's ``RecurrentGate`` name: the LSTM and the
    projection, and each 1x1-conv embedding as a linear layer; ``gate_index(module)`` gives the engine embedding a
    reference gate module feeds (embedding ``l`` reads block ``l``'s input: the stem's gate for the first block,
    block ``l - 1``'s after it), None for one that decides nothing."""
    for old, new in (("control.rnn_one.", "gate.lstm."), ("control.proj.", "gate.proj.")):
        if key.startswith(old):
            return new + key[len(old):], value
    module, _, rest = key.partition(".")
    gate = gate_index(module)
    if gate is None:
        return None
    index, name = rest.split(".")
    layer = {"1": "fc1", "3": "fc2", "conv1": "fc1", "conv2": "fc2"}[index]  # Sequential, or _PooledLinear
    return f"gate.embeds.{gate}.{layer}.{name}", value.flatten(1) if name == "weight" else value


def _gate_after(counts: list[int]):
    """``gate_index`` of ``_gate_keys`` for a reference net of ``counts`` blocks per group: ``gate_layer1`` feeds
    the first block, ``groupG_gateI`` the block after block I of group G, the last block's gate nothing."""
    def index(module: str) -> int | None:
        if module == "gate_layer1":
            return 0
        g, i = (int(v) for v in module[len("group"):].split("_gate"))
        gate = sum(counts[: g - 1]) + i + 1
        return gate if gate < sum(counts) else None

    return index


def _gated_keys(key: str, value: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """A reference ``ResNetRecurrentGateSP`` entry under the engine's ``GatedModel`` name: the gate's, or the
    backbone's."""
    if _is_gate(key):
        return _gate_keys(key, value, _gate_after([N, N, N]))
    return _backbone_keys(key, value, "backbone.")


class _PooledLinear(torch.nn.Module):
    """A reference gate embedding (``AvgPool2d`` over the whole map, then a 1x1 conv, ReLU, 1x1 conv in the CIFAR
    networks; one 1x1 conv in the ImageNet ResNets) computed as the engine computes it (a spatial mean and linear
    layers), on the reference's own weights: the same function, summed in the engine's order, so that the
    gradients it sends back into the blocks are the engine's bit for bit (and the ImageNet pooling's fixed size,
    56 at 224x224, need not fit the tests' inputs). test_dfq.py compares the reference's own arithmetic, to
    float32 rounding."""

    def __init__(self, seq: torch.nn.Sequential):
        super().__init__()
        convs = [m for m in seq if isinstance(m, torch.nn.Conv2d)]
        self.conv1, self.conv2 = convs[0], convs[1] if len(convs) > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x.mean(dim=(2, 3)), self.conv1.weight.flatten(1), self.conv1.bias)
        if self.conv2 is not None:
            h = F.linear(F.relu(h), self.conv2.weight.flatten(1), self.conv2.bias)
        return h[:, :, None, None]


def _gates_in_engine_order(ref, scale: float = 30.0) -> None:
    """The reference gated net's embeddings as ``_PooledLinear``, and a gate whose decisions vary from sample to
    sample (its projection scaled by ``scale``), so that every path runs."""
    for name, child in list(ref.named_children()):
        if name == "gate_layer1" or "_gate" in name:
            setattr(ref, name, _PooledLinear(child))
    with torch.no_grad():
        ref.control.proj.weight.mul_(scale)


def _choices(masks) -> torch.Tensor:
    """A reference gated net's decisions (B, L) from its masks (per block, one (B,) mask per option)."""
    return torch.stack([torch.stack(m, -1) for m in masks], 1).detach().argmax(-1)


def _gated_step(ref, ours, x, y, ref_bits, costs, kappa, omega, controller, reg, target: float):
    """One step of both gated nets on ``(x, y)``: forward, the same decisions and cp, then backward through CE
    plus each side's cost term (the reference's ``computation_cost * reg``, the engine's controller weight).
    Returns both logits and the engine's trace."""
    ref_logits, masks = ref(x, *ref_bits)
    our_logits, trace = ours(x)
    assert torch.equal(_choices(masks), trace.choices)
    cp_ref, cost_ref = dfq_cost(masks, *costs, [1] * len(omega), len(x), 1e-3)
    cp = gated_cp(trace.choices, kappa, omega)
    assert cp == pytest.approx(cp_ref, rel=1e-12)
    (F.cross_entropy(ref_logits, y) + cost_ref * reg(cp_ref, target, 0.0)).backward()
    (F.cross_entropy(our_logits, y) + controller.weight(cp, target) * cost_per_sample(trace, kappa, omega).mean()
     ).backward()
    return ref_logits, our_logits, trace


def _same_weights(ref, ours, names) -> None:
    """The engine's weights made the reference's again, to the last bit (running statistics left alone): after
    a step whose gradients agreed to float32 rounding only."""
    with torch.no_grad():
        for name, value in _renamed(names, ref.named_parameters()).items():
            ours.get_parameter(name).copy_(value)


REF_OPTIONS = (fractrain_loops.bits, fractrain_loops.grad_bits)


@pytest.mark.parametrize(("method", "momentum", "skip"), [("dfq", 0.9, False), ("dfq", 0.9, True),
                                                          ("fractrain", 0.1, False)],
                         ids=["dfq", "dfq-with-skip", "fractrain"])
def test_the_gated_resnet_decides_and_trains_as_the_references(method, momentum, skip, nearest_errors, monkeypatch):
    """DFQ's gated ResNet (masked execution, the reference's five options at 4-bit weights, or the same after a
    skip option, its sign-rule cost term; FracTrain's with its own sign rule and activation momentum): the stem
    in fp32, every option's pass of a block updating the block's shared running statistics, the skip path (the
    identity, or the fp32 projection through the BN the block's own projection uses), the mask-weighted sum,
    the gate's decisions and the batch's cp, the loss with its cost term, bit for bit (the reference's gate
    embeddings computed in the engine's order, ``_PooledLinear``), and every gradient.

    One departure (methods.md §9, row 16): the reference runs a downsampling block's fp32 projection, and the BN
    it shares, at every forward, whether or not an option skips; without a skip option its output goes unused
    but that BN's running statistics take it in. The engine runs the skip path only for a skip option, so there
    those statistics, and nothing else, differ; given the reference's, evaluation is the same bit for bit."""
    monkeypatch.setattr(fractrain_models, "WEIGHT_BITS", 4)  # what train_dfq.py / train_frac.py set from argv
    monkeypatch.setattr(fractrain_models, "MOMENTUM", momentum)
    bits, grad_bits = ([0] + REF_OPTIONS[0], [0] + REF_OPTIONS[1]) if skip else REF_OPTIONS
    torch.manual_seed(0)
    ref = fractrain_models.ResNetRecurrentGateSP(fractrain_models.BasicBlock, [N, N, N], proj_dim=len(bits))
    ref.avgpool = torch.nn.AdaptiveAvgPool2d(1)
    _gates_in_engine_order(ref)
    # the reference's beta 1e-3 on a batch sum is the engine's 1e-3 x batch on the batch mean (methods.md §9, row 4)
    options = ["skip", "3/6", "4/6", "4/8", "6/8", "6/12"] if skip else "reference"
    schedule = {"kind": method, "options": options, "weight_bits": 4, "execution": "masked",
                "controller": "reference", "option_state": "shared", "beta": 1e-3 * BATCH}
    schedule.update({"target_cp": 3.0} if method == "dfq" else {"cp0": 3.0})
    ours, cfg = _engine_model(schedule)
    assert ours.backbone.stem.act_momentum == momentum  # the method's default, as each reference script's
    _load(ours, _renamed(_gated_keys, ref.state_dict().items()))
    costs = dfq_option_costs(bits, grad_bits, 4)
    kappa, omega = option_kappa(ours.options), torch.ones(3 * N, dtype=torch.float64)
    controller = build_controller(cfg.schedule)
    reg = dfq_reg if method == "dfq" else fractrain_reg
    g = torch.Generator().manual_seed(1)
    chosen = set()
    for target in (3.0, 1.0, 5.0):
        x, y = torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
        ref_logits, our_logits, trace = _gated_step(ref, ours, x, y, (bits, grad_bits), costs, kappa, omega,
                                                    controller, reg, target)
        assert torch.equal(ref_logits, our_logits)
        chosen |= set(trace.choices.flatten().tolist())
        theirs = [(k, p.grad) for k, p in ref.named_parameters() if p.grad is not None]
        for name, grad in _renamed(_gated_keys, theirs).items():
            mine = ours.get_parameter(name).grad
            # where a tensor feeds several paths (the options' passes, the skip path, the gate's read of a block
            # input), autograd adds their gradients in an order of its own: float32 rounding; the last block's
            # gradients reach it from the head alone
            if name.startswith(f"backbone.blocks.{3 * N - 1}.conv"):
                assert torch.equal(grad, mine), name
            assert float((grad - mine).abs().max()) <= 1e-5 * float(grad.abs().max()), name
        _sgd(ref, ours)
        _same_weights(ref, ours, _gated_keys)
    assert len(chosen) >= 3 and (0 in chosen or not skip), chosen
    _same_running_ranges(ref, ours, _gated_keys, 1 + 3 * N * 2 + 2)
    mine = ours.state_dict()
    for key, value in ref.state_dict().items():
        if key.endswith(("running_mean", "running_var")) and _gated_keys(key, value):
            name = _gated_keys(key, value)[0]
            projection_bn = ".proj_bn." in name
            assert torch.equal(value, mine[name]) != (projection_bn and not skip), name
    _load(ours, _renamed(_gated_keys, ref.state_dict().items()))
    ref.eval()
    ours.eval()
    with torch.no_grad():
        x = torch.randn(BATCH, 3, 32, 32, generator=g)
        assert torch.equal(ref(x, bits, grad_bits)[0], ours(x)[0])


def _mobilenet_keys(key: str, value: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """A reference MobileNetV2 entry under the engine's name."""
    if "quantize_input" in key:
        return None
    top = {"conv1.": "stem.", "bn1.": "stem_bn.", "conv2.": "head_conv.", "bn2.": "head_bn.", "linear.": "fc."}
    for old, new in top.items():
        if key.startswith(old):
            return new + key[len(old):], value
    group, rest = key.split(".", 1)
    g, j = (int(v) for v in group[len("group"):].split("_layer"))
    index = sum(count for _, _, count, _ in fractrain_models.MobileNetV2.cfg[: g - 1]) + j
    rest = rest.replace("shortcut.", "proj.").replace("bn4.", "proj_bn.")
    return f"blocks.{index}.{rest}", value


def test_a_static_mobilenetv2_trains_as_the_references(nearest_errors, monkeypatch):
    """FracTrain's CIFAR MobileNetV2 at FW4/BW8 as its scripts run it without ``--weight_bits``: activations at
    FW and errors at BW in the stem, every expansion, projection and shortcut conv and the head conv,
    depthwise convs at 8/16, and every weight in fp32 (its convs take their weight bits from that flag, whose
    default 0 leaves weights unquantized: methods.md §9, row 17). The engine runs the same with
    ``weight_bits: 32`` and ``quant.depthwise_weight_bits: 32``: the same logits, gradients and running ranges
    after a step, and the same evaluation."""
    monkeypatch.setattr(fractrain_models, "WEIGHT_BITS", 0)
    _engine_pooling(monkeypatch, fractrain_models)
    torch.manual_seed(0)
    ref = fractrain_models.MobileNetV2(num_classes=10)
    cfg = parse_config({"model": {"name": "mobilenetv2"}, "data": {"dataset": "cifar10"},
                        "schedule": {"kind": "static", "fw": 4, "bw": 8, "weight_bits": 32},
                        "quant": {"depthwise_weight_bits": 32}})
    ours, _ = prepare(cfg, INFO["cifar10"], torch.device("cpu"))
    _load(ours, _renamed(_mobilenet_keys, ref.state_dict().items()))
    _trains_alike(ref, ours, _mobilenet_keys, (4, 8), Precision(act=4, weight=32, grad=8), 1, 4)


def _imagenet_keys(key: str, value: torch.Tensor, prefix: str = "") -> tuple[str, torch.Tensor] | None:
    """A reference ImageNet ResNet-18 entry (CPT's ``resnet18``, the backbone of FracTrain's ``resnet18_rnn``)
    under the engine's name."""
    if "quantize_input" in key:
        return None
    for old, new in (("conv1.", "stem."), ("bn1.", "stem_bn."), ("fc.", "fc.")):
        if key.startswith(old):
            return prefix + new + key[len(old):], value
    group, rest = key.split(".", 1)
    g, i = (int(v) for v in group[len("group"):].split("_layer"))
    rest = rest.replace("downsample.0.", "proj.").replace("downsample.1.", "proj_bn.")
    return f"{prefix}blocks.{2 * (g - 1) + i}.{rest}", value


def test_an_imagenet_resnet_trains_as_the_references(nearest_errors):
    """CPT's ImageNet ResNet-18 at FW4/BW8 (the setting of its README's ImageNet command, at one point of the
    cycle): the 7x7 stem, the blocks' 1x1 projections (plain ``nn.Conv2d`` there) and the FC in fp32, every
    block conv quantized. On 32x32 inputs (the stages end at 1x1) with the engine's pooling, as above: the same
    logits, gradients and running ranges after a step, and the same evaluation."""
    from tests.reference.upstream import cpt_imagenet_models

    torch.manual_seed(0)
    ref = cpt_imagenet_models.resnet18(num_classes=10)
    ref.avgpool = torch.nn.AdaptiveAvgPool2d(1)
    cfg = parse_config({"model": {"name": "resnet18"}, "data": {"dataset": "imagenet"},
                        "schedule": {"kind": "static", "fw": 4, "bw": 8}})
    ours, _ = prepare(cfg, dataclasses.replace(INFO["imagenet"], classes=10), torch.device("cpu"))
    _load(ours, _renamed(_imagenet_keys, ref.state_dict().items()))
    _trains_alike(ref, ours, _imagenet_keys, (4, 8), Precision.fwbw(4, 8), 1, 4)
    assert all(float(ours.blocks[b].proj.run_range) == 0.0 for b in (2, 4, 6))  # fp32: never measured


@pytest.mark.slow
def test_the_gated_mobilenetv2_decides_and_trains_as_the_references(nearest_errors, monkeypatch):
    """FracTrain's ``MobileNetV2_RNN`` (the reference's five options at 4-bit weights, masked, its gate of
    64/32/32, the engine's default for the model): the stem and the head conv in fp32, depthwise convs at 8/16
    with the run's weight bits (as ``--weight_bits`` sets them there: ``quant.depthwise_weight_bits: 4``,
    methods.md §9, row 17), a stride-2 block without a residual; one step and an evaluation, as the gated
    ResNet's test."""
    monkeypatch.setattr(fractrain_models, "WEIGHT_BITS", 4)
    _engine_pooling(monkeypatch, fractrain_models)
    bits, grad_bits = REF_OPTIONS
    torch.manual_seed(0)
    ref = fractrain_models.MobileNetV2_RNN(num_classes=10, proj_dim=len(bits))
    _gates_in_engine_order(ref)
    cfg = parse_config({"model": {"name": "mobilenetv2"}, "data": {"dataset": "cifar10"},
                        "quant": {"depthwise_weight_bits": 4},
                        "schedule": {"kind": "dfq", "options": "reference", "weight_bits": 4, "target_cp": 3.0,
                                     "execution": "masked", "controller": "reference", "option_state": "shared"}})
    ours, _ = prepare(cfg, INFO["cifar10"], torch.device("cpu"))
    gate_index = _gate_after([count for _, _, count, _ in fractrain_models.MobileNetV2_RNN.cfg])

    def names(key: str, value: torch.Tensor):
        if _is_gate(key):
            return _gate_keys(key, value, gate_index)
        mapped = _mobilenet_keys(key, value)
        return None if mapped is None else ("backbone." + mapped[0], mapped[1])

    _load(ours, _renamed(names, ref.state_dict().items()))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
    ref_logits, masks = ref(x, bits, grad_bits)
    our_logits, trace = ours(x)
    assert torch.equal(ref_logits, our_logits)
    choices = _choices(masks)
    assert torch.equal(choices, trace.choices) and len(set(choices.flatten().tolist())) >= 2
    F.cross_entropy(ref_logits, y).backward()
    F.cross_entropy(our_logits, y).backward()
    for name, grad in _renamed(names, [(k, p.grad) for k, p in ref.named_parameters() if p.grad is not None]).items():
        mine = ours.get_parameter(name).grad
        assert float((grad - mine).abs().max()) <= 1e-5 * float(grad.abs().max()), name
    _same_weights(ref, ours, names)
    ref.eval()
    ours.eval()
    with torch.no_grad():
        x = torch.randn(4, 3, 32, 32, generator=g)
        assert torch.equal(ref(x, bits, grad_bits)[0], ours(x)[0])


def _imagenet_gated_keys(key: str, value: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """A reference ``ResNet_RNN`` (ResNet-18) entry under the engine's ``GatedModel`` name: the gate's, or the
    backbone's."""
    if _is_gate(key):
        return _gate_keys(key, value, _gate_after([2, 2, 2, 2]))
    return _imagenet_keys(key, value, "backbone.")


IMAGENET_FW = [3, 4, 6, 8]  # fractrain_imagenet/train_dfq.py and train_frac.py: ``bits``


@pytest.mark.slow
def test_the_imagenet_gated_resnet_decides_and_trains_as_the_references(monkeypatch):
    """FracTrain's ImageNet ``resnet18_rnn`` (methods.md §6.3, execution ``conv``) beside the engine's gated
    ResNet-18 at ``execution: conv``: its options' FW bits 3, 4, 6, 8 at 6-bit weights, its gate (one 1x1 conv
    embedding of 40, an LSTM of 20), every quantized conv mixing its input over the options, each option's
    quantizer updating the running range. Three SGD steps with the reference's cost term, then an evaluation:
    the same decisions and cp; logits, every gradient and running ranges to float32 rounding (the gate's
    gradients to 1e-3 of their largest), not bit for bit: the engine runs a block over the batch sorted by option, so BN sums its batch
    statistics in another order. The errors stay in fp32 (BW 32 on both sides): quantized, a rounding difference
    can move an error one level, and backward passes then part by more than rounding; the per-sample error
    quantization is compared on its own, exactly (test_quantizers.py)."""
    from tests.reference.upstream import fractrain_imagenet_models as ref_models

    monkeypatch.setattr(ref_models, "WEIGHT_BITS", 6)
    monkeypatch.setattr(ref_models, "MOMENTUM", 0.9)  # train_frac.py's --momentum_act default
    bits, grad_bits = IMAGENET_FW, [32] * 4
    torch.manual_seed(0)
    ref = ref_models.resnet18_rnn(num_classes=10, proj_dim=len(bits))
    ref.avgpool = torch.nn.AdaptiveAvgPool2d(1)
    _gates_in_engine_order(ref, 5.0)
    cfg = parse_config({"model": {"name": "resnet18"}, "data": {"dataset": "imagenet"},
                        "schedule": {"kind": "fractrain", "options": [f"{b}/32" for b in bits], "weight_bits": 6,
                                     "execution": "conv", "controller": "reference", "cp0": 11.0,
                                     "beta": 1e-3 * BATCH}})
    ours, _ = prepare(cfg, dataclasses.replace(INFO["imagenet"], classes=10), torch.device("cpu"))
    assert ours.backbone.stem.act_momentum == 0.9  # the ImageNet script's default, not the CIFAR script's 0.1
    _load(ours, _renamed(_imagenet_gated_keys, ref.state_dict().items()))
    costs = dfq_option_costs(bits, grad_bits, 6)
    kappa, omega = option_kappa(ours.options), torch.ones(8, dtype=torch.float64)
    controller = build_controller(cfg.schedule)

    g = torch.Generator().manual_seed(1)
    chosen = set()
    for target in (3.0, 1.0, 5.0):
        x, y = torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
        ref_logits, our_logits, trace = _gated_step(ref, ours, x, y, (bits, grad_bits), costs, kappa, omega,
                                                    controller, fractrain_reg, target)
        _close(ref_logits, our_logits, 1e-5, "logits")
        chosen |= set(trace.choices.flatten().tolist())
        theirs = _renamed(_imagenet_gated_keys, [(k, p.grad) for k, p in ref.named_parameters() if p.grad is not None])
        assert {n for n in theirs if n.startswith("gate.embeds.")} == {f"gate.embeds.{i}.fc1.{w}" for i in range(8)
                                                                      for w in ("weight", "bias")}
        for name, grad in theirs.items():  # the gate's: a small difference of the options' products, < 1e-3
            _close(grad, ours.get_parameter(name).grad, 1e-3 if name.startswith("gate.") else 2e-5, name)
        _sgd(ref, ours)
        _same_weights(ref, ours, _imagenet_gated_keys)
    assert len(chosen) >= 3, chosen
    _same_running_ranges(ref, ours, _imagenet_gated_keys, 16, rel=1e-6)
    ref.eval()
    ours.eval()
    with torch.no_grad():
        x = torch.randn(BATCH, 3, 32, 32, generator=g)
        ref_logits, masks = ref(x, bits, grad_bits)
        our_logits, trace = ours(x)
        assert torch.equal(_choices(masks), trace.choices)
        _close(ref_logits, our_logits, 1e-5, "evaluation")
