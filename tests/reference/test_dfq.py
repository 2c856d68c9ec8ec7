"""DFQ's parts beside the reference's (fractrain_cifar/models.py, train_dfq.py, train_frac.py): the recurrent
gate, the options' costs, the batch's cp, the cost term and its sign rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.config.experiment import parse_config
from engine.config.gated_schedule import OPTION_PRESETS
from engine.dfq.controller import ReferenceController
from engine.dfq.gate import (
    GateTrace,
    RecurrentGate,
    cost_per_sample,
    gated_cp,
    option_kappa,
    sign_dfq,
    sign_fractrain,
    sign_tensor,
    straight_through,
)
from engine.numerics.precision import Precision, parse_fwbw
from tests.reference import REFERENCE_CODE_WARNINGS
from tests.reference.upstream import fractrain_loops, fractrain_models
from tests.reference.upstream.fractrain_loops import (
    dfq_cost,
    dfq_dws_flops,
    dfq_option_costs,
    dfq_reg,
    dfq_total_loss,
    fractrain_reg,
    fractrain_targets,
)

pytestmark = REFERENCE_CODE_WARNINGS

REF_BITS, REF_GRAD_BITS = fractrain_loops.bits, fractrain_loops.grad_bits


def _reference_options(weight_bits: int):
    fw_bw = [parse_fwbw(o) for o in OPTION_PRESETS["reference"]]
    assert [f for f, _ in fw_bw] == REF_BITS and [b for _, b in fw_bw] == REF_GRAD_BITS
    return [Precision(act=f, weight=weight_bits, grad=b) for f, b in fw_bw]


@pytest.mark.parametrize("weight_bits", [4, 8])
def test_each_options_cost_is_the_references(weight_bits):
    """kappa_k = (a w + g w + a g) / 1024 against train_dfq.py's cost_fw + cost_eb + cost_gc per option."""
    fw, eb, gc = dfq_option_costs(REF_BITS, REF_GRAD_BITS, weight_bits)
    kappa = option_kappa(_reference_options(weight_bits))
    assert torch.allclose(kappa, torch.tensor(fw + eb + gc, dtype=torch.float64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("conv_info", [None, "random"], ids=["blocks-alike", "conv-info"])
def test_the_batch_cp_and_cost_term_are_the_references(conv_info):
    """One batch of decisions over 18 blocks (ResNet-38), 128 samples, with straight-through masks: the gated
    cp is the reference's ``cp_ratio``; its cost term ``computation_loss * reg`` (a batch sum, beta 1e-3) is
    the engine's ``weight * mean_i c_i`` at beta 0.128 (methods.md §9, row 4), in value and in gradient."""
    g = torch.Generator().manual_seed(0)
    blocks, batch, k = 18, 128, len(REF_BITS)
    omega = torch.ones(blocks, dtype=torch.float64) if conv_info is None else \
        torch.randint(1, 50, (blocks,), generator=g).double()
    fw, eb, gc = dfq_option_costs(REF_BITS, REF_GRAD_BITS, 4)
    kappa = option_kappa(_reference_options(4))
    for target in (2.0, 3.0, 4.5):
        logits = torch.randn(batch, blocks, k, generator=g, dtype=torch.float64) * 2
        p_ref = torch.softmax(logits, -1).requires_grad_(True)
        p_eng = p_ref.detach().clone().requires_grad_(True)
        hard = torch.nn.functional.one_hot(p_ref.argmax(-1), k).double()
        masks_ref = hard - p_ref.detach() + p_ref  # the reference's RNNGate
        choices, masks_eng = straight_through(p_eng)
        as_lists = [[masks_ref[:, layer, j] for j in range(k)] for layer in range(blocks)]
        cp_ref, loss_ref = dfq_cost(as_lists, fw, eb, gc, omega.tolist(), batch, 1e-3)
        cp = gated_cp(choices, kappa, omega)
        assert cp == pytest.approx(cp_ref, rel=1e-12)
        reg = dfq_reg(cp_ref, target, 0.0)
        ctrl = ReferenceController(beta=0.128, rule="dfq", band=0.0)
        trace = GateTrace(masks_eng, choices, p_eng)
        loss_eng = ctrl.weight(cp, target) * cost_per_sample(trace, kappa, omega).mean()
        assert float(loss_eng) == pytest.approx(float(loss_ref) * reg, rel=1e-9)
        (loss_ref * reg).backward()
        loss_eng.backward()
        assert torch.allclose(p_eng.grad, p_ref.grad, rtol=1e-9, atol=1e-15)


def test_mobilenetv2s_gated_cp_and_cost_term_are_the_references_with_its_depthwise_convs_at_their_bits():
    """MobileNetV2 (``train_dfq.py --conv_info model_info_mbv2.npy``): the pointwise convs follow the option and
    the depthwise convs cost their fixed 8/8/16 in every sample (lines 186-191). The engine's gated cp is the
    reference's ``cp_ratio`` over the FP32 cost of the same convs (the reference divides by its depthwise
    convs' quantized cost instead: methods.md §9, row 11), and its cost term's gradient the reference's up to
    one factor: the mean of the blocks' pointwise MACs over the mean of all their MACs, over the batch size."""
    from engine.data.catalog import INFO
    from engine.dfq.gated_runner import cost_bases
    from engine.train import prepare

    shipped = json.loads((Path(__file__).with_name("upstream") / "model_info_mbv2.json").read_text())
    conv, dws = shipped["conv"], shipped["dws"]  # FLOPs per block
    cfg = parse_config({"model": {"name": "mobilenetv2"}, "data": {"dataset": "cifar10"},
                        "schedule": {"kind": "dfq", "options": "reference", "weight_bits": 4, "target_cp": 3.0,
                                     "controller": "reference"}})
    model, counter = prepare(cfg, INFO["cifar10"], torch.device("cpu"))
    basis = cost_bases(cfg.schedule, model, counter, "mobilenetv2")[1]["gated"]
    fw, eb, gc = dfq_option_costs(REF_BITS, REF_GRAD_BITS, 4)
    dws_cost = dfq_dws_flops(dws, 8, 16)
    blocks, batch, k = len(conv), 128, len(REF_BITS)
    over_fp32 = (3 * sum(conv) + dws_cost[0]) / (3 * (sum(conv) + sum(dws)))
    factor = (sum(conv) / (sum(conv) + sum(dws))) / batch
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        z_ref = (torch.randn(batch, blocks, k, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
        z_eng = z_ref.detach().clone().requires_grad_(True)
        p_ref, p_eng = torch.softmax(z_ref, -1), torch.softmax(z_eng, -1)
        masks_ref = torch.nn.functional.one_hot(p_ref.argmax(-1), k).double() - p_ref.detach() + p_ref
        choices, masks_eng = straight_through(p_eng)
        as_lists = [[masks_ref[:, layer, j] for j in range(k)] for layer in range(blocks)]
        cp_ref, loss_ref = dfq_cost(as_lists, fw, eb, gc, conv, batch, 1.0, dws_cost)
        assert basis.cp(choices) == pytest.approx(cp_ref * over_fp32, rel=1e-12)
        loss_ref.backward()
        cost_per_sample(GateTrace(masks_eng, choices, p_eng), basis.kappa, basis.omega).mean().backward()
        assert torch.allclose(z_eng.grad, z_ref.grad * factor, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("beta_ref", [1e-3, 1e-2])
def test_ada_beta_caps_the_cost_term_as_the_reference(beta_ref):
    """``schedule.ada_beta`` (the reference's --ada_beta): the loss CE + s * beta * cost, its cost term scaled
    down to a tenth of the CE where it is larger, against train_dfq.py's lines, in value and in the gradients of
    both the logits and the gate's probabilities; batches on both sides of the cap."""
    from engine.dfq.gate import ada_beta_scale

    g = torch.Generator().manual_seed(1)
    blocks, batch, k = 18, 128, len(REF_BITS)
    omega = torch.randint(1, 50, (blocks,), generator=g).double()
    fw, eb, gc = dfq_option_costs(REF_BITS, REF_GRAD_BITS, 4)
    kappa = option_kappa(_reference_options(4))
    capped = set()
    # (target cp, spread of the logits, margin of the right class): CEs from about 0.01 to about 15
    for target, scale, margin in ((2.0, 1.0, 0.0), (4.5, 4.0, 0.0), (3.0, 0.05, 6.0), (1.0, 40.0, 0.0)):
        probs = torch.softmax(torch.randn(batch, blocks, k, generator=g, dtype=torch.float64) * 2, -1)
        y = torch.randint(0, 10, (batch,), generator=g)
        out = torch.randn(batch, 10, generator=g, dtype=torch.float64) * scale
        out += margin * torch.nn.functional.one_hot(y, 10)
        (p_ref, o_ref), (p_eng, o_eng) = [(probs.clone().requires_grad_(True), out.clone().requires_grad_(True))
                                          for _ in range(2)]
        hard = torch.nn.functional.one_hot(p_ref.argmax(-1), k).double()
        masks_ref = hard - p_ref.detach() + p_ref
        cp_ref, computation_loss = dfq_cost([[masks_ref[:, layer, j] for j in range(k)] for layer in range(blocks)],
                                            fw, eb, gc, omega.tolist(), batch, beta_ref)
        ce_ref = torch.nn.functional.cross_entropy(o_ref, y)
        capped.add(bool(computation_loss > ce_ref / 10))  # before the call: it scales the term in place
        loss_ref = dfq_total_loss(ce_ref, computation_loss, dfq_reg(cp_ref, target, 0.0), True)

        choices, masks_eng = straight_through(p_eng)
        ctrl = ReferenceController(beta=beta_ref * batch, rule="dfq", band=0.0)
        ce = torch.nn.functional.cross_entropy(o_eng, y)
        cost = cost_per_sample(GateTrace(masks_eng, choices, p_eng), kappa, omega).mean()
        loss_eng = ce + ctrl.weight(gated_cp(choices, kappa, omega), target) * cost * ada_beta_scale(
            cost, ctrl.beta, ce)
        assert float(loss_eng) == pytest.approx(float(loss_ref), rel=1e-12)
        loss_ref.backward()
        loss_eng.backward()
        assert torch.allclose(p_eng.grad, p_ref.grad, rtol=1e-9, atol=1e-15)
        assert torch.allclose(o_eng.grad, o_ref.grad, rtol=1e-12, atol=1e-15)
    assert capped == {True, False}


def test_ada_beta_needs_the_reference_controller():
    from engine.errors import ConfigError

    base = {"model": {"name": "resnet8"}, "data": {"dataset": "cifar10"}}
    cfg = parse_config({**base, "schedule": {"kind": "dfq", "controller": "reference", "ada_beta": True}})
    assert cfg.schedule.ada_beta and "ada_beta" in cfg.schedule.label()
    with pytest.raises(ConfigError, match="schedule.ada_beta.*controller dual"):
        parse_config({**base, "schedule": {"kind": "fractrain", "ada_beta": True}})


def test_the_sign_rules_are_the_references():
    """DFQ's (train_dfq.py, with its relax band) and FracTrain's (train_frac.py, with --target_ratio_range)
    sign of the cost term, on cp values on and next to every boundary, on the host and on a tensor."""
    targets, bands = [1.5, 3.0, 4.0], [0.0, 0.1, 0.5]
    for target in targets:
        for band in bands:
            edges = [target - band, target, target + band]
            cps = sorted({c + d for c in edges for d in (-1e-9, 0.0, 1e-9, -0.3, 0.3)})
            for cp in cps:
                assert sign_dfq(cp, target, band) == dfq_reg(cp, target, band), (cp, target, band)
                assert sign_fractrain(cp, target, band) == fractrain_reg(cp, target, band), (cp, target, band)
                t = torch.tensor(cp, dtype=torch.float64)
                assert float(sign_tensor(t, target, "dfq", band)) == pytest.approx(dfq_reg(cp, target, band))
                assert float(sign_tensor(t, target, "fractrain", band)) == fractrain_reg(cp, target, band)


def test_the_gate_decides_as_the_references():
    """The reference's gate (a 1x1-conv embedding of each block's pooled input, one LSTM step, a projection,
    softmax, the argmax's one-hot with straight-through gradients) with the engine's ``RecurrentGate`` holding
    the same weights: the same probabilities and decisions, block after block; the mask's value is the
    one-hot (the reference's ``hard - p + p`` is within a float32 ulp of it, methods.md §9, row 15); the same
    gradients for every gate weight from a loss on the masks."""
    torch.manual_seed(0)
    channels, sizes, batch = [16, 16, 32, 32, 64, 64], [32, 32, 16, 16, 8, 8], 16
    k = len(REF_BITS)
    ref_embeds = [torch.nn.Sequential(torch.nn.AvgPool2d(s), torch.nn.Conv2d(c, 32, 1), torch.nn.ReLU(),
                                      torch.nn.Conv2d(32, 16, 1)) for c, s in zip(channels, sizes)]
    ref_gate = fractrain_models.RNNGate(16, 16, k)
    ours = RecurrentGate(channels, k, torch.ones(len(channels), k, dtype=torch.bool))
    with torch.no_grad():
        for emb, seq in zip(ours.embeds, ref_embeds):
            emb.fc1.weight.copy_(seq[1].weight.flatten(1))
            emb.fc1.bias.copy_(seq[1].bias)
            emb.fc2.weight.copy_(seq[3].weight.flatten(1))
            emb.fc2.bias.copy_(seq[3].bias)
        ours.lstm.load_state_dict(ref_gate.rnn_one.state_dict())
        ours.proj.load_state_dict(ref_gate.proj.state_dict())
    inputs = [torch.randn(batch, c, s, s) for c, s in zip(channels, sizes)]
    weights = torch.randn(batch, len(channels), k)

    ref_gate.hidden_one = ref_gate.init_hidden(batch)
    ref_masks = torch.stack([ref_gate(seq(h)).view(batch, k) for seq, h in zip(ref_embeds, inputs)], 1)
    state, masks, probs = None, [], []
    for i, h in enumerate(inputs):
        z, state = ours.step(i, h, state)
        p = torch.softmax(z, dim=-1)
        _, mask = straight_through(p)
        masks.append(mask)
        probs.append(p)
    our_masks = torch.stack(masks, 1)
    assert torch.equal(our_masks.detach().argmax(-1), ref_masks.detach().argmax(-1))
    assert torch.equal(our_masks.detach(), torch.nn.functional.one_hot(our_masks.detach().argmax(-1), k).float())
    assert torch.allclose(ref_masks.detach(), our_masks.detach(), rtol=0, atol=1e-6)
    (ref_masks * weights).sum().backward()
    (our_masks * weights).sum().backward()
    pairs = [(ours.lstm.weight_ih_l0, ref_gate.rnn_one.weight_ih_l0), (ours.lstm.weight_hh_l0, ref_gate.rnn_one.weight_hh_l0),
             (ours.lstm.bias_ih_l0, ref_gate.rnn_one.bias_ih_l0), (ours.proj.weight, ref_gate.proj.weight),
             (ours.proj.bias, ref_gate.proj.bias)]
    for emb, seq in zip(ours.embeds, ref_embeds):
        pairs += [(emb.fc1.weight, seq[1].weight), (emb.fc2.weight, seq[3].weight), (emb.fc2.bias, seq[3].bias)]
    for a, b in pairs:
        assert torch.allclose(a.grad, b.grad.view_as(a.grad), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(("cp0", "step", "turns"), [(1.5, 0.5, 3), (3.0, 0.5, 3), (2.0, 0.25, 2), (1.0, 0.0, 1)])
def test_fractrains_stage_targets_are_the_references(cp0, step, turns):
    """``--target_ratio``, ``--target_ratio_step`` and ``--num_turning_point`` as ``cp0``, ``cp_step`` and
    ``num_turning_points``: the same target at every stage."""
    cfg = parse_config({"model": {"name": "resnet38"}, "data": {"dataset": "cifar10"},
                        "schedule": {"kind": "fractrain", "cp0": cp0, "cp_step": step, "num_turning_points": turns}})
    assert cfg.schedule.targets() == fractrain_targets(cp0, step, turns)
