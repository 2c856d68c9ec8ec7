"""DFQ and FracTrain: the gate, skipping, cp by hand, masked vs routed, and the cp controller."""

from __future__ import annotations

import contextlib

import pytest
import torch

from engine.config.experiment import parse_config
from engine.config.gated_schedule import cp0_for_total
from engine.cost.bitops import BitOpsCounter
from engine.dfq import gated as gated_module
from engine.dfq.gate import (
    GateTrace,
    RecurrentGate,
    cost_per_sample,
    gated_cp,
    option_kappa,
    sign_dfq,
    sign_fractrain,
    straight_through,
)
from engine.dfq.gated import GatedModel
from engine.dfq.gated_runner import BlockCosts
from engine.models import LayerMap, build_model
from engine.numerics.precision import FP32, SKIP, Precision
from engine.train import train_and_evaluate

OPTS = [SKIP, Precision.fwbw(4, 8), Precision(act=6, weight=4, grad=12)]


def toy(execution="masked", options=OPTS, seed=0, estimator="sampled", state="shared", statistics="computed"):
    torch.manual_seed(seed)
    backbone = build_model("tiny", 1, 10)  # two blocks: 8 ch (identity shortcut), 16 ch stride 2 (projection)
    backbone.set_layer_map(LayerMap(stem=False, fc=False, head=False))
    return GatedModel(backbone, options, execution, routed_estimator=estimator, option_state=state,
                      routed_statistics=statistics)


FOUR = [SKIP, Precision.fwbw(2, 6, 4), Precision.fwbw(4, 8, 4), Precision.fwbw(6, 12, 4)]


def test_gate_shapes_and_probabilities():
    gate = RecurrentGate([8, 16], 3, torch.ones(2, 3, dtype=torch.bool))
    h = torch.randn(5, 8, 6, 6)
    z, state = gate.step(0, h, None)
    assert z.shape == (5, 3) and torch.isfinite(z).all()
    z2, _ = gate.step(1, torch.randn(5, 16, 3, 3), state)
    assert z2.shape == (5, 3)
    blocked = RecurrentGate([8], 3, torch.tensor([[False, True, True]]))
    z3, _ = blocked.step(0, h, None)
    p3 = torch.softmax(z3, -1)
    assert torch.all(p3[:, 0] == 0) and torch.allclose(p3.sum(1), torch.ones(5))  # a blocked option: p = 0


def test_straight_through_value_and_gradient():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]], requires_grad=True)
    p = torch.softmax(logits, -1)
    choice, mask = straight_through(p)
    assert choice.tolist() == [1, 0]
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))  # forward: exactly one-hot
    w = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    (mask * w).sum().backward()
    ref = logits.detach().clone().requires_grad_(True)
    (torch.softmax(ref, -1) * w).sum().backward()
    assert torch.allclose(logits.grad, ref.grad)  # backward: the softmax Jacobian


def test_a_skipped_block_costs_zero_and_passes_its_input():
    model = toy().eval()
    x = torch.randn(3, 1, 8, 8)
    b0, b1 = model.blocks
    with torch.no_grad():
        h = model.backbone.features(x, FP32)
        assert torch.equal(b0.skip(h), h)  # identity shortcut
        assert torch.allclose(b1.skip(h), b1.proj_bn(b1.proj(h, FP32)))  # fp32 projection
    counter = BitOpsCounter(model.backbone.layer_table((1, 8, 8)), model.backbone.layer_map)
    costs = BlockCosts(counter, OPTS, 2, model.gate_macs())
    proj = next(x for x in counter.table if x.name == "blocks.1.proj")
    assert costs.table[0][0] == 0
    assert costs.table[1][0] == 3 * proj.macs * 32 * 32
    # block 0 at 4/8 with 4-bit weights: sum over its convs of M * (a w + g w + a g) = M * 80
    m0 = sum(x.macs for x in counter.table if x.block == 0)
    assert costs.table[0][1] == m0 * (4 * 4 + 8 * 4 + 4 * 8)


def test_cp_by_hand_for_a_two_block_toy():
    kappa = option_kappa(OPTS)
    assert kappa.tolist() == pytest.approx([0.0, 80 / 1024, (24 + 48 + 72) / 1024])
    choices = torch.tensor([[0, 1], [1, 2]])  # sample 1: skip, 4/8; sample 2: 4/8, 6/12
    omega = torch.ones(2)
    expected = 100 * (0 + 80 + 80 + 144) / 1024 / (3 * 2 * 2)
    assert gated_cp(choices, kappa, omega) == pytest.approx(expected)
    masks = torch.nn.functional.one_hot(choices, 3).float()
    trace = GateTrace(masks, choices, masks)
    assert cost_per_sample(trace, kappa, omega).tolist() == pytest.approx([80 / 1024, 224 / 1024])
    # MAC-weighted blocks (block 1 twice the weight)
    w = torch.tensor([1.0, 2.0])
    assert gated_cp(choices, kappa, w) == pytest.approx(100 * (80 * 2 + 80 + 144 * 2) / 1024 / (3 * 3 * 2))


def test_exact_bitops_of_choices():
    model = toy()
    counter = BitOpsCounter(model.backbone.layer_table((1, 8, 8)), model.backbone.layer_map)
    costs = BlockCosts(counter, OPTS, 2, model.gate_macs())
    choices = torch.tensor([[0, 1], [1, 2], [2, 2]])
    t = costs.table
    assert costs.batch_bitops(choices) == 3 * costs.fixed + t[0][0] + t[1][1] + t[0][1] + t[1][2] + t[0][2] + t[1][2]
    fixed = sum(x.macs for x in counter.table if x.block is None) * 3072
    assert costs.fixed == fixed  # stem and FC in fp32


def test_masked_and_routed_agree_in_forward_for_the_same_choices():
    masked = toy("masked").eval()
    routed = toy("routed").eval()
    routed.load_state_dict(masked.state_dict())
    x = torch.randn(6, 1, 8, 8)
    forced = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 1], [0, 0], [2, 2]])
    with torch.no_grad():
        a, ta = masked(x, forced)
        b, tb = routed(x, forced)
    assert torch.equal(ta.choices, tb.choices)
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("execution", ["masked", "routed"])
def test_a_gated_forward_quantizes_each_weight_once(execution, monkeypatch):
    """Every option's pass (masked) and the estimator's alternatives (routed) share one quantized copy of each
    weight per forward; a training step gives the values and gradients it gives with a fresh copy per pass."""
    from engine.numerics import autograd, quant

    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 10, (6,))
    forced = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 1], [0, 0], [2, 2]])

    def step():
        model = toy(execution).train()
        torch.manual_seed(3)
        logits, _ = model(x, forced)
        torch.nn.functional.cross_entropy(logits, y).backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    calls = []
    fresh = quant.quantize_weight
    monkeypatch.setattr(quant, "quantize_weight", lambda w, b: calls.append(id(w)) or fresh(w, b))
    logits, grads = step()
    n_convs = sum(isinstance(m, torch.nn.Conv2d) for b in toy().blocks for m in b.modules())
    assert len(calls) == len(set(calls)) == n_convs  # each quantized weight once (the projection's too)
    monkeypatch.setattr(autograd, "weights_fixed", lambda: contextlib.nullcontext())
    monkeypatch.setattr(gated_module, "weights_fixed", lambda: contextlib.nullcontext())
    calls.clear()
    plain_logits, plain_grads = step()
    assert len(calls) > n_convs  # without the table: once per pass
    assert torch.equal(logits, plain_logits)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))


def test_a_batch_statistics_pass_splits_its_rows_without_a_bool_index():
    """``routed_statistics: batch`` splits its whole-batch pass into the computed and the skipped rows by a
    stable sort and one count, not by bool indexing (each a host wait on a GPU: methods.md §6.3)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class BoolIndex(TorchDispatchMode):
        seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.index and any(
                    t is not None and t.dtype == torch.bool for t in args[1]):
                BoolIndex.seen += 1
            return func(*args, **(kwargs or {}))

    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    forced = torch.tensor([[0, 1], [1, 0], [2, 0], [1, 1], [0, 2], [2, 2], [0, 0], [1, 2]])
    model = toy("routed", statistics="batch").train()
    with BoolIndex():
        logits, _ = model(x, forced)
        torch.nn.functional.cross_entropy(logits, y).backward()
    assert BoolIndex.seen == 0  # the values: test_routed_batch_statistics_train_as_masked_does


@pytest.mark.parametrize("statistics", ["computed", "batch"])
@pytest.mark.parametrize("estimator", ["sampled", "grouped", "exact"])
def test_routed_estimators_keep_values_and_running_statistics(estimator, statistics):
    """The forward-only alternatives change neither the block's output nor any running statistic (with
    ``routed_statistics: batch`` every estimator draws the same alternatives for the whole-batch pass)."""
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    forced = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 1], [0, 3], [1, 1], [2, 0], [3, 2]])
    outs, states = [], []
    for est in (estimator, "skip"):
        model = toy("routed", FOUR, estimator=est, statistics=statistics).train()
        torch.manual_seed(13)
        outs.append(model(x, forced)[0])
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def _gate_ce_grads(model, x, forced, draws: int) -> torch.Tensor:
    """dL/dz of every block's gate logits under CE, summed over ``draws`` forward/backward passes: (B, L, K)."""
    step, zs, total = model.gate.step, [], 0

    def keep(i, h, state):
        z, state = step(i, h, state)
        z.retain_grad()
        zs.append(z)
        return z, state

    model.gate.step = keep
    for _ in range(draws):
        zs.clear()
        model.zero_grad()
        logits, _ = model(x, forced)
        torch.nn.functional.cross_entropy(logits, torch.arange(len(x)) % 10).backward()
        total = total + torch.stack([z.grad for z in zs], 1)
    return total


def test_routed_sampled_estimator_gives_skipped_samples_a_ce_signal():
    """With ``skip`` a sample that skipped sees every option's CE gradient alike (no signal between computing
    and skipping); the sampled alternative gives it one."""
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    forced = torch.tensor([[0, 1], [0, 2], [0, 3], [0, 1], [0, 2], [0, 3]])  # every sample skips block 0
    spread = {}
    for estimator in ("sampled", "skip"):
        model = toy("routed", FOUR, estimator=estimator).train()
        grads = _gate_ce_grads(model, x, forced, 1)
        spread[estimator] = float(grads[:, 0].abs().max())  # dL/dz of block 0, CE only
    assert spread["sampled"] > 1e-5 and spread["skip"] < 1e-4 * spread["sampled"]  # skip: float error only


X8 = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(2))
FORCED8 = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 1], [0, 3], [1, 1], [2, 0], [3, 2]])


def test_routed_sampled_gradient_matches_the_mask_algebra():
    """The fused backward of ``RoutedOutput`` gives the gate the gradient of the written-out estimator
    ``h = (m_nonskip - m_alt) Y + m_alt sg(y_a) + m_skip y_skip`` (m_alt's gradient times the number of
    unchosen options) for the same draw of alternatives."""
    model = toy("routed", FOUR).train()
    torch.manual_seed(7)
    fused = _gate_ce_grads(model, X8, FORCED8, 1)

    from engine.dfq import gated
    from engine.numerics.layers import frozen_state

    def in_order(self, block, h, option, keep=None):  # the kept samples' outputs, in the batch's order
        y, rows_run = self._run_sorted(block, h, option, keep)
        return y.index_select(0, torch.argsort(rows_run))

    def written_out(self, i, block, h, choice, mask):
        skip_k = self.skip_index
        computed = (choice != skip_k).nonzero().squeeze(1)
        y_skip = block.skip(h)
        m_skip = gated.rows(mask[:, skip_k], y_skip)
        m_nonskip = gated.rows(mask.sum(1) - mask[:, skip_k], y_skip)
        y_run = in_order(self, block, h, choice, choice != skip_k) if len(computed) else None
        alt, n = self._alternatives(i, choice)
        with torch.no_grad(), frozen_state(block):
            y_alt = in_order(self, block, h, alt)
        y_comp = y_alt if y_run is None else y_alt.index_copy(0, computed, y_run)
        m_a = mask.gather(1, alt.unsqueeze(1)).squeeze(1)
        m_alt = gated.rows((n > 0) * (m_a.detach() + n * (m_a - m_a.detach())), y_skip)
        return (m_nonskip - m_alt) * y_comp + m_alt * y_alt + m_skip * y_skip

    reference = toy("routed", FOUR).train()
    reference._routed = written_out.__get__(reference)
    torch.manual_seed(7)
    expected = _gate_ce_grads(reference, X8, FORCED8, 1)
    assert expected.abs().max() > 1e-4
    assert torch.allclose(fused, expected, atol=1e-6, rtol=1e-4)


# two forward groups of two options (FW 4 and FW 6, BW differing) and one alone (FW 2)
GROUPED = [SKIP, Precision.fwbw(2, 6, 4), Precision.fwbw(4, 6, 4), Precision.fwbw(4, 12, 4), Precision.fwbw(6, 8, 4),
           Precision.fwbw(6, 12, 4)]
FORCED_G = torch.tensor([[0, 0], [1, 1], [2, 2], [3, 3], [4, 4], [5, 5], [1, 3], [2, 0]])


def _last_block_draws(estimator: str, draws: int, execution: str = "routed",
                      statistics: str = "computed") -> torch.Tensor:
    """dL/dz of the last block's gate logits under CE, one row per draw: (draws, B, K). Every layer of the
    backbone runs in eval mode (running ranges and BN statistics, set by a few train-mode batches first), so a
    sample's outputs do not depend on the other samples and masked execution's gradient is the exact one; the
    last block's ``dL/dh`` comes from the fp32 head, free of gradient-quantization noise."""
    model = toy("routed", GROUPED, estimator=estimator).train()
    torch.manual_seed(5)
    with torch.no_grad():  # the same running statistics for every execution and estimator
        for _ in range(3):
            model(torch.randn(16, 1, 8, 8), torch.randint(0, len(GROUPED), (16, 2)))
    model.backbone.eval()  # the GatedModel itself stays in train mode: the estimator runs
    model.execution = execution
    model.routed_statistics = statistics  # after the statistics above, which it would change
    x = torch.randn(len(FORCED_G), 1, 8, 8, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(9)
    return torch.stack([_gate_ce_grads(model, x, FORCED_G, 1)[:, -1] for _ in range(draws)])


def test_routed_exact_estimator_gives_masked_gate_gradient():
    """``exact`` runs every other forward group for every sample: the gate's CE gradient is masked's."""
    masked = _last_block_draws("sampled", 1, "masked")[0]
    exact = _last_block_draws("exact", 1)[0]
    sampled = _last_block_draws("sampled", 1)[0]
    assert masked.abs().max() > 1e-4
    assert torch.allclose(exact, masked, atol=1e-6, rtol=1e-4)
    assert not torch.allclose(sampled, masked, atol=1e-6, rtol=1e-4)  # one draw of an estimate is not exact


def test_routed_exact_estimator_runs_every_other_forward_group():
    """``exact`` runs each forward group (FW bit-width) once, for every sample not in it, and puts its contrast
    on every option of the group."""
    model = toy("routed", GROUPED, estimator="exact").train()
    block, h, choice = model.blocks[1], torch.randn(len(FORCED_G), 8, 8, 8), FORCED_G[:, 1]
    alts = model._estimates(1, block, h, choice)
    fw_of = [None if o.skip else o.act for o in GROUPED]
    assert sorted(len(rows) for _, rows, _ in alts) == sorted(
        sum(fw_of[int(c)] != f for c in choice) for f in (2, 4, 6))
    for _, rows, w in alts:
        fws = {fw_of[k] for k in range(len(GROUPED)) if w[0, k]}
        assert len(fws) == 1 and all(fw_of[int(choice[r])] not in fws for r in rows)
        assert torch.equal(w, w[:1].expand_as(w)) and set(w.unique().tolist()) == {0.0, 1.0}


@pytest.mark.slow
def test_routed_grouped_estimator_is_unbiased_with_less_variance_than_sampled():
    """``grouped`` draws the alternative among the other forward groups (FW bit-widths) and gives the options
    of the chosen one's group the chosen output exactly: the same expectation as ``sampled`` for a computed
    sample's options (masked's), at a smaller spread. (A skipped sample's non-skip options share one stand-in
    in both, whose mean differs per option by design, so the comparison is on the computed samples.)"""
    masked = _last_block_draws("sampled", 1, "masked")[0]
    computed = FORCED_G[:, 1] != 0
    scale = masked[computed].abs().max()
    spread = {}
    for estimator in ("sampled", "grouped"):
        draws = _last_block_draws(estimator, 200)[:, computed]
        assert (draws.mean(0) - masked[computed]).abs().max() < 0.15 * scale, estimator
        spread[estimator] = float(((draws - masked[computed]) ** 2).mean())
    assert spread["grouped"] < 0.6 * spread["sampled"]  # 0.35 on this toy


@pytest.mark.slow
def test_routed_sample_fraction_keeps_the_gate_gradient_unbiased(monkeypatch):
    """Running the alternative for half the batch, its contrast weighted by 2, has the same expected gate
    gradient as running it for every sample. Each row is computed as part of the whole batch here, so that
    the subset's own batch statistics (a real, separate effect) do not enter the comparison."""
    run = GatedModel._run_sorted

    def as_part_of_the_batch(self, block, h, option, keep=None):
        y, rows = run(self, block, h, option)  # every sample, then the kept ones' rows in the batch's order
        kept = torch.arange(len(option)) if keep is None else keep.nonzero().squeeze(1)
        return y.index_select(0, torch.argsort(rows)).index_select(0, kept), kept

    monkeypatch.setattr(GatedModel, "_run_sorted", as_part_of_the_batch)
    draws, means = 300, {}
    for fraction in (1.0, 0.5):
        model = toy("routed", FOUR).train()
        model.sample_fraction = fraction
        torch.manual_seed(11)
        means[fraction] = _gate_ce_grads(model, X8, FORCED8, draws) / draws
    scale = means[1.0].abs().max()
    assert scale > 1e-4
    assert (means[0.5] - means[1.0]).abs().max() < 0.25 * scale  # a weight of 1 instead of 2: 0.4 * scale


def test_routed_warmup_runs_masked_first(monkeypatch):
    cfg = parse_config({**DIGITS, "optim": {"iterations": 6}, "schedule": {
        "kind": "dfq", "target_cp": 2.0, "execution": "routed", "routed_warmup": 0.5}})
    seen = []
    original = GatedModel.forward

    def spy(self, x, forced=None):
        if self.training:
            seen.append(self.execution)
        return original(self, x, forced)

    monkeypatch.setattr(GatedModel, "forward", spy)
    train_and_evaluate(cfg)
    assert seen == ["masked"] * 3 + ["routed"] * 3


def test_cost_gradient_is_the_same_in_both_modes():
    grads = []
    x = torch.randn(4, 1, 8, 8)
    for mode in ("masked", "routed"):
        model = toy(mode).eval()  # eval: the same batch statistics, so the same gate inputs in both modes
        _, trace = model(x)
        cost_per_sample(trace, option_kappa(OPTS), torch.ones(2)).mean().backward()
        grads.append(model.gate.proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1])


def test_sign_rules():
    assert [sign_dfq(c, 3.0) for c in (2.9, 3.0, 3.1)] == [-1.0, 1.0, 1.0]
    assert [sign_dfq(c, 3.0, 0.5) for c in (2.4, 2.8, 3.2, 3.6)] == [-1.0, -0.1, 0.1, 1.0]
    assert [sign_fractrain(c, 3.0, 0.5) for c in (2.9, 3.2, 3.5)] == [-1.0, 0.0, 1.0]
    assert cp0_for_total(2.25, 0.5, 4) == 1.5


DIGITS = {"model": {"name": "resnet8"}, "data": {"dataset": "digits", "batch_size": 64}}


@pytest.mark.slow
def test_dfq_run_reports_cp_and_bit_allocation():
    cfg = parse_config({**DIGITS, "optim": {"epochs": 3},
                        "schedule": {"kind": "dfq", "target_cp": 2.0, "execution": "routed"}})
    r = train_and_evaluate(cfg)
    last = r.history[-1]
    alloc = last["bit_allocation"]
    assert alloc["options"] == ["skip", "2/6", "3/6", "4/6", "4/12", "6/8", "6/12"]
    # fractions are rounded to 5 places
    assert len(alloc["fractions"]) == 3 and all(sum(row) == pytest.approx(1.0, abs=1e-4) for row in alloc["fractions"])
    assert last["target_cp"] == 2.0 and 0.0 <= last["cp_gated"] <= 100 * 144 / 3072
    assert {f"alloc_fw_b{i:02d}" for i in range(3)} <= last.keys()
    assert r.metrics["cp"] < 100 and r.metrics["train_bitops"] < r.metrics["fp32_bitops"]


@pytest.mark.slow
def test_fractrain_target_steps_up_at_turning_points(tmp_path):
    cfg = parse_config({**DIGITS, "optim": {"epochs": 4},
                        "schedule": {"kind": "fractrain", "cp0": 1.5, "cp_step": 0.5, "num_turning_points": 3,
                                     "eval_every": 4, "epsilon": 5.0, "alpha": 1.0, "execution": "routed"}})
    saved = {}
    r = train_and_evaluate(cfg, report=lambda m, save: saved.setdefault(m["epoch"], save(tmp_path / str(m["epoch"]))))
    events = [e for e in r.metrics["events"] if e["reason"] == "turning point"]
    assert [e["target_cp"] for e in events] == [2.0, 2.5, 3.0]
    targets = [h["target_cp"] for h in r.history]
    assert targets == sorted(targets) and targets[-1] == 3.0
    assert set(r.metrics["cp_per_stage"]) <= {"0", "1", "2", "3"} and r.metrics["targets"] == [1.5, 2.0, 2.5, 3.0]
    resumed = train_and_evaluate(cfg, resume_from=tmp_path / "2")
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in r.history]
    assert resumed.metrics["events"] == r.metrics["events"]


def test_block_costs_under_every_cost_model():
    model = toy()
    counter = BitOpsCounter(model.backbone.layer_table((1, 8, 8)), model.backbone.layer_map)
    costs = BlockCosts(counter, OPTS, 2, model.gate_macs())
    choices = torch.tensor([[0, 1], [1, 2], [1, 1]])  # block 0: skip, 4/8, 4/8; block 1: 4/8, 6/12, 4/8
    out = costs.batch_costs(choices)
    assert out["bitops"] == costs.batch_bitops(choices)  # the same exact int
    fixed = [x for x in counter.table if x.block is None]
    b0 = [x for x in counter.table if x.block == 0]
    b1 = [x for x in counter.table if x.block == 1]
    m = {k: sum(x.macs for x in layers) for k, layers in (("fixed", fixed), (0, b0), (1, b1))}
    proj = next(x for x in b1 if x.name.endswith(".proj"))
    # MACs: fp32 layers for every sample, each block at the chosen option; a skipped block 0 (no projection): 0
    assert out["macs"] == 3 * (3 * m["fixed"] + 2 * m[0] + 3 * m[1])
    # int_units (4/8 with 4-bit weights: 16 + 32 + 32 = 80; 6/12 with 4-bit weights: 8*4 + 16*4 + 8*16 = 224)
    assert out["int_units"] == 3 * m["fixed"] * 3 * 1024 + 2 * m[0] * 80 + 2 * m[1] * 80 + m[1] * 224
    # memory: the weights of block 1 are read once per option chosen in the batch (4/8 and 6/12), block 0 once
    w = {blk: sum(x.weights for x in layers) for blk, layers in ((0, b0), (1, b1))}
    wf = sum(x.weights for x in fixed)
    per_sample = (3 * sum(x.inputs * 64 + x.outputs * 64 for x in fixed)
                  + 2 * sum(x.inputs * 8 + x.outputs * 16 for x in b0)
                  + 2 * sum(x.inputs * 8 + x.outputs * 16 for x in b1) + sum(x.inputs * 12 + x.outputs * 24 for x in b1))
    per_iter = wf * 96 + w[0] * 40 + 2 * w[1] * 40
    assert proj.weights > 0 and out["memory"] == (per_sample + per_iter) / 8


@pytest.mark.parametrize("schedule, field", [
    ({"routed_warmup": 0.2}, "schedule.routed_warmup"),  # masked execution: nothing to warm up
    ({"execution": "routed", "routed_estimator": "skip", "routed_sample_fraction": 0.5},
     "schedule.routed_sample_fraction"),
    ({"execution": "routed", "routed_estimator": "exact", "routed_sample_fraction": 0.5},
     "schedule.routed_sample_fraction"),
    ({"routed_sample_fraction": 0.0}, "schedule.routed_sample_fraction"),
    ({"execution": "routed", "routed_warmup": 1.0}, "schedule.routed_warmup"),
    ({"execution": "routed", "option_state": "per_option"}, "schedule.option_state"),  # one pass, one set of stats
    ({"option_state": "apart"}, "schedule.option_state"),
    ({"execution": "routed", "routed_statistics": "all"}, "schedule.routed_statistics"),
    ({"routed_statistics": "batch"}, "schedule.routed_statistics"),  # masked: the whole batch already
])
def test_routed_knobs_are_refused_where_they_mean_nothing(schedule, field):
    from engine.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config({**DIGITS, "schedule": {"kind": "dfq", "target_cp": 3.0, **schedule}})
    assert field in str(info.value) and "allowed" in str(info.value)


@pytest.mark.parametrize("schedule, fraction, statistics", [
    ({"execution": "routed"}, 0.5, "batch"),  # the default (methods.md §6.3): half the batch, batch statistics
    ({"execution": "routed", "routed_estimator": "grouped"}, 0.5, "batch"),
    ({"execution": "routed", "routed_estimator": "skip"}, 1.0, "batch"),  # no alternative to draw
    ({"execution": "routed", "routed_estimator": "exact"}, 1.0, "batch"),
    ({"execution": "routed", "routed_sample_fraction": 1.0, "routed_statistics": "computed"}, 1.0, "computed"),
    ({"execution": "masked"}, 1.0, "computed"),  # masked runs every option over the whole batch
])
def test_routed_defaults_follow_the_execution_and_reach_the_model(schedule, fraction, statistics):
    from engine.data.catalog import INFO
    from engine.train import prepare

    cfg = parse_config({**DIGITS, "schedule": {"kind": "dfq", "target_cp": 3.0, **schedule}})
    assert (cfg.schedule.routed_sample_fraction, cfg.schedule.routed_statistics) == (fraction, statistics)
    model, _ = prepare(cfg, INFO["digits"], torch.device("cpu"))
    assert (model.sample_fraction, model.routed_statistics) == (fraction, statistics)
    again = parse_config(cfg.model_dump(mode="json"))  # a dumped config (MLflow params, resume) reads back the same
    assert again.schedule == cfg.schedule


def test_per_option_state_gives_each_option_its_own_running_statistics():
    """Each option's pass updates only its own copy of the block's BN statistics and activation ranges, from the
    same start as a block that ran that option alone (methods.md §6.3)."""
    import copy

    model = toy("masked", state="per_option").train()
    block0 = copy.deepcopy(model.backbone.blocks[0])  # the untouched statistics
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    forced = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 1], [0, 2], [2, 2], [1, 0], [2, 1]])
    h0 = model.backbone.features(x, FP32)
    model(x, forced)
    names = [n for n, b in block0.named_buffers() if b.is_floating_point()]
    start = dict(block0.named_buffers())
    for k, opt in enumerate(OPTS):
        alone = copy.deepcopy(block0)
        alone.skip(h0) if opt.skip else alone(h0, opt)
        mine = dict(alone.named_buffers())
        unchanged = []
        for j, n in enumerate(names):
            own = getattr(model, f"option_state_0_{k}_{j}")
            assert torch.allclose(own, mine[n], atol=1e-6), (k, n)
            unchanged.append(torch.equal(own, start[n]))
        assert all(unchanged) == opt.skip, k  # the identity skip path has no statistics
    bn = names.index("bn2.running_mean")
    assert not torch.allclose(getattr(model, f"option_state_0_1_{bn}"), getattr(model, f"option_state_0_2_{bn}"))


def test_per_option_state_evaluates_each_sample_with_its_options_statistics():
    model = toy("masked", state="per_option").train()
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    for _ in range(3):
        model(x, torch.randint(0, 3, (8, 2), generator=torch.Generator().manual_seed(5)))
    model.eval()
    bb = model.backbone
    with torch.no_grad():
        for k in (1, 2):
            got = model(x, torch.full((8, 2), k))[0]
            h = bb.features(x, FP32)
            for i, block in enumerate(bb.blocks):
                model._use_state(i, k)
                h = block(h, OPTS[k])
            assert torch.allclose(got, bb.head(h, FP32), atol=1e-5)
            for i in range(len(bb.blocks)):
                model._use_state(i, 3 - k)  # the other option's statistics give another output
            h = bb.features(x, FP32)
            for block in bb.blocks:
                h = block(h, OPTS[k])
            assert not torch.allclose(got, bb.head(h, FP32), atol=1e-3)


@pytest.mark.parametrize("schedule", [{"option_state": "per_option"},
                                      {"option_state": "skip_apart", "execution": "routed"}])
@pytest.mark.slow
def test_option_state_run_resumes_exactly(tmp_path, schedule):
    # exactness needs no full epoch: a few hundred samples an epoch
    cfg = parse_config({**DIGITS, "data": {**DIGITS["data"], "train_subset": 384}, "optim": {"epochs": 2},
                        "schedule": {"kind": "dfq", "target_cp": 3.0, **schedule}})
    saved = {}

    def report(metrics, save):
        saved[metrics["epoch"]] = save(tmp_path / f"epoch{metrics['epoch']}")

    full = train_and_evaluate(cfg, report=report)
    resumed = train_and_evaluate(cfg, resume_from=tmp_path / "epoch1")
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]
    assert resumed.metrics["accuracy"] == full.metrics["accuracy"]


@pytest.mark.parametrize("execution", ["masked", "routed"])
def test_skip_apart_keeps_the_fp32_projection_statistics_apart(execution):
    """skip_apart: the skip path of a downsampling block (its projection in fp32) updates only the skip copy of
    the block's statistics, the computed options only the other (methods.md §6.3); a block whose skip path is
    the identity keeps no copies, and the statistics only the computed options use stay the block's own."""
    import copy

    model = toy(execution, state="skip_apart").train()
    assert not any(n.startswith("option_state_0_") for n, _ in model.named_buffers())  # identity skip: nothing apart
    fresh = copy.deepcopy(model.backbone.blocks[1])
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    forced = torch.tensor([[1, 0], [1, 1], [1, 2], [1, 0], [1, 1], [1, 2], [1, 0], [1, 0]])
    with torch.no_grad():
        h1 = copy.deepcopy(model.backbone.blocks[0])(model.backbone.features(x, FP32), OPTS[1])
    model(x, forced)
    names = [n for n, b in fresh.named_buffers() if b.is_floating_point() and n.startswith(("proj.", "proj_bn."))]
    assert len([n for n, _ in model.named_buffers() if n.startswith("option_state_1_")]) == 2 * len(names)
    alone = copy.deepcopy(fresh)
    alone.skip(h1)  # the fp32 projection over every sample
    computed = copy.deepcopy(fresh)
    with torch.no_grad():
        if execution == "masked":  # every computed option over the whole batch, in order
            computed(h1, OPTS[1]), computed(h1, OPTS[2])
        else:  # one pass over the samples that compute, each at its option
            model._run_sorted(computed, h1, forced[:, 1], forced[:, 1] != 0)
    for want, key in ((dict(alone.named_buffers()), "0"), (dict(computed.named_buffers()), "computed")):
        for j, n in enumerate(names):
            assert torch.allclose(getattr(model, f"option_state_1_{key}_{j}"), want[n], atol=1e-5), (key, n)
    bn = names.index("proj_bn.running_mean")
    assert not torch.allclose(getattr(model, f"option_state_1_0_{bn}"), getattr(model, f"option_state_1_computed_{bn}"))


def test_skip_apart_changes_no_training_step_only_evaluation():
    """Training normalises with batch statistics, so keeping the skip path's running statistics apart leaves
    every training step as it was; evaluation differs, and both executions evaluate alike."""
    models = {"shared": toy("routed"), "skip_apart": toy("routed", state="skip_apart")}
    losses = {}
    forced = torch.tensor([[1, 0], [2, 1], [1, 2], [2, 0]] * 8)
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(7))
    for state, model in models.items():
        for bn in model.modules():  # running statistics that move quickly, so evaluation shows them
            if isinstance(bn, torch.nn.BatchNorm2d):
                bn.momentum = 0.5
        torch.manual_seed(11)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[state] = []
        for step in range(4):  # the gate's own choices, then a mix with skip at the downsampling block
            logits, _trace = model.train()(x, None if step < 2 else forced)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[state].append(float(loss.detach()))
    assert losses["shared"] == losses["skip_apart"]
    with torch.no_grad():
        shared = models["shared"].eval()(x, forced)[0]
        apart = models["skip_apart"].eval()(x, forced)[0]
        masked = toy("masked", state="skip_apart")
        masked.load_state_dict(models["skip_apart"].state_dict())
        assert torch.allclose(masked.eval()(x, forced)[0], apart, atol=1e-5)
    skipped = forced[:, 1] == 0
    assert not torch.allclose(shared[skipped], apart[skipped], atol=1e-3)


# one computed option, its errors unquantized: a training step draws nothing at random but the alternatives
TWO = [SKIP, Precision.fwbw(4, 32, 4)]


def test_routed_batch_statistics_train_as_masked_does():
    """``routed_statistics: batch``: the samples that skip a block run its pass too (at their alternative), so
    BN and the activation ranges see the whole batch as in masked execution. With one computed option the
    alternative is that option, and a routed step is masked's: the same logits, every gradient (the gate's
    and the weights', through BN) and every running statistic. Over the computed samples alone they differ."""
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(12))
    y = torch.arange(8) % 10
    forced = torch.tensor([[0, 1], [1, 0], [1, 1], [0, 0], [1, 1], [0, 1], [1, 0], [1, 1]])

    def step(execution, statistics):
        model = toy(execution, TWO, state="skip_apart", statistics=statistics).train()
        logits, _ = model(x, forced)
        torch.nn.functional.cross_entropy(logits, y).backward()
        return (logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                {n: b.clone() for n, b in model.named_buffers()})

    masked, batch, computed = step("masked", "computed"), step("routed", "batch"), step("routed", "computed")
    assert torch.allclose(batch[0], masked[0], atol=1e-5)
    assert batch[1].keys() == masked[1].keys() and any(n.startswith("gate.") for n in masked[1])
    for n, g in masked[1].items():
        assert torch.allclose(batch[1][n], g, atol=1e-5, rtol=1e-4), n
    for n, b in masked[2].items():
        assert torch.allclose(batch[2][n], b, atol=1e-5), n
    assert not torch.allclose(computed[0], masked[0], atol=1e-3)
    moved = [n for n in masked[2] if n.endswith("running_mean") and not torch.allclose(computed[2][n], masked[2][n])]
    assert moved  # the computed samples' statistics are not the batch's


@pytest.mark.parametrize("estimator", ["sampled", "grouped"])
def test_routed_batch_statistics_keep_the_estimate_draw_for_draw(estimator):
    """With blocks that do not depend on the batch (eval-mode backbone), the whole-batch pass changes nothing
    the gate sees: the skipped samples' alternatives come from that pass instead of the forward-only one, and
    the gate's CE gradient is the same for the same draw. (One draw: the backward pass of the whole batch
    draws more stochastic-rounding noise, so later draws differ.)"""
    grads = {s: _last_block_draws(estimator, 1, statistics=s) for s in ("computed", "batch")}
    assert grads["computed"].abs().max() > 1e-4
    assert torch.allclose(grads["batch"], grads["computed"], atol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_block_floor_keeps_every_gated_block_computing_where_a_low_target_collapses_them():
    """At a gated cp target the options reach only by skipping (just above the cheapest the network can run,
    which skips every block it can for free), the controller drives blocks to skip for every input (a collapse);
    ``block_floor`` keeps at least that share of each block's inputs computing, and the gated cp counts the moved
    samples."""
    results = {}
    for floor in (0.0, 0.5):
        cfg = parse_config({**DIGITS, "optim": {"epochs": 2}, "schedule": {
            "kind": "dfq", "target_cp": 1.0, "execution": "routed", "block_floor": floor}})
        results[floor] = train_and_evaluate(cfg)
    skip = {f: [r.history[-1][f"alloc_skip_b{i:02d}"] for i in range(3)] for f, r in results.items()}
    assert max(skip[0.0]) > 0.9  # without the floor a block collapses to skip
    assert max(skip[0.5]) <= 0.5 + 1e-9  # with it no block skips more than half its inputs
    # without the floor the target is met; with it the floor binds: the computing half costs more than the
    # target allows, which the gated cp shows
    assert results[0.0].history[-1]["cp_gated"] == pytest.approx(1.0, abs=0.05)
    assert results[0.5].history[-1]["cp_gated"] > 1.15


def test_floor_skips_moves_the_least_decided_skippers_only():
    from engine.dfq.gate import floor_skips

    p = torch.tensor([[0.9, 0.1, 0.0], [0.6, 0.0, 0.4], [0.2, 0.8, 0.0], [0.7, 0.1, 0.2], [0.5, 0.3, 0.2]])
    choice = p.argmax(1)  # skip (0) for rows 0, 1, 3, 4
    assert floor_skips(p, choice, 0, 0.6).tolist() == [0, 2, 1, 0, 1]  # 3 of 5 compute: rows 1 and 4 move
    assert floor_skips(p, choice, 0, 0.2).tolist() == choice.tolist()  # one computes already
    assert floor_skips(p, choice, 0, 0.0).tolist() == choice.tolist()
