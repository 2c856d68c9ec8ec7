"""DFQ and FracTrain on the Transformer language models (docs/methods.md §11.1): the gate per sequence and
block, causality of the gated model in masked and routed execution, routed == masked, skip = the residual
stream, the quantized matmul at per-sequence precision, cost per token by hand and a short gated run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engine.config.experiment import parse_config
from engine.cost.bitops import BitOpsCounter
from engine.dfq.gate import gated_cp, normalised_cost, option_kappa
from engine.dfq.gated import GatedModel
from engine.dfq.gated_runner import BlockCosts
from engine.errors import ConfigError
from engine.models import LayerMap, build_model
from engine.numerics import autograd, quant
from engine.numerics.layers import QMatmul
from engine.numerics.precision import FP32, SKIP, MixedPrecision, Precision
from engine.train import train_and_evaluate
from tests.engine.models.test_transformer import lm_config, write_wikitext

OPTS = [SKIP, Precision.fwbw(3, 6, 4), Precision.fwbw(4, 8, 4), Precision.fwbw(6, 12, 4)]
V, T = 40, 9


def gated_lm(execution="masked", seed=0, estimator="sampled") -> GatedModel:
    torch.manual_seed(seed)
    backbone = build_model("transformer_tiny", 1, V)
    backbone.set_layer_map(LayerMap(stem=False, fc=False, head=False))  # the gated layer map
    return GatedModel(backbone, OPTS, execution, routed_estimator=estimator)


def warmed(execution="masked", seed=0) -> GatedModel:
    """A gated LM after one training step at every option (every quantizer's running range set), in eval mode."""
    model = gated_lm(execution, seed)
    model.set_option_cost(normalised_cost(option_kappa(OPTS), torch.ones(2, dtype=torch.float64)))
    x = torch.randint(0, V, (4, T), generator=torch.Generator().manual_seed(seed))
    for k in range(len(OPTS)):
        forced = torch.full((4, 2), k)
        logits, _ = model(x, forced)
        F.cross_entropy(logits, torch.randint(0, V, (4 * T,))).backward()
    return model.eval()


def test_forward_shapes_and_one_decision_per_sequence_and_block():
    model = gated_lm("routed").train()
    x = torch.randint(0, V, (5, T))
    logits, trace = model(x)
    assert logits.shape == (5 * T, V)
    assert trace.choices.shape == (5, 2) and trace.masks.shape == (5, 2, len(OPTS))
    assert torch.allclose(trace.probs.sum(-1), torch.ones(5, 2))
    F.cross_entropy(logits, torch.randint(0, V, (5 * T,))).backward()
    assert model.gate.proj.weight.grad is not None and model.backbone.blocks[0].ff1.weight.grad is not None


def _forced_choices(b: int) -> torch.Tensor:
    return torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [1, 1], [2, 2]])[:b]


@pytest.mark.parametrize("execution", ["masked", "routed"])
def test_a_later_token_changes_no_earlier_logit_of_the_gated_model(execution):
    """Eval mode: the gate reads each block input at position 0 only, so neither the choice nor any quantizer
    lets token t' > t reach the logit at t (a mean over the positions would leak through the choice)."""
    model = warmed(execution)
    model.set_price(0.3)  # a priced decision, as the dual controller gives at evaluation
    x = torch.randint(0, V, (6, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, ta = model(x)
        for pos in (1, 4, T - 1):
            x2 = x.clone()
            x2[:, pos] = (x2[:, pos] + 7) % V
            b, tb = model(x2)
            assert torch.equal(ta.choices, tb.choices)  # the decision depends on token 0 only
            a3, b3 = a.view(6, T, V), b.view(6, T, V)
            assert torch.equal(a3[:, :pos], b3[:, :pos])
            assert not torch.allclose(a3[:, pos:], b3[:, pos:])
        # forced mixed choices (every option in one batch): still causal
        forced = _forced_choices(6)
        x2 = x.clone()
        x2[:, 5] = (x2[:, 5] + 1) % V
        a3, b3 = model(x, forced)[0].view(6, T, V), model(x2, forced)[0].view(6, T, V)
        assert torch.equal(a3[:, :5], b3[:, :5])


def test_the_gate_reads_no_later_position_and_a_mean_over_positions_would():
    """Why position 0 (methods.md §11.1): the gate's logits of every block ignore a change at any later token;
    with the gate reading the mean over the T positions (the same model, only its summary replaced) they move,
    so a choice, and through it the logits of earlier positions, could depend on a later token."""
    model = warmed("masked")
    x = torch.randint(0, V, (6, T), generator=torch.Generator().manual_seed(5))
    x2 = x.clone()
    x2[:, T - 1] = (x2[:, T - 1] + 11) % V
    with torch.no_grad():
        assert torch.equal(model(x)[1].logits, model(x2)[1].logits)
        model.backbone.gate_summary = lambda h: h.mean(dim=1)
        assert not torch.allclose(model(x)[1].logits, model(x2)[1].logits)


def test_routed_and_masked_give_the_same_eval_logits_for_the_same_choices():
    masked = warmed("masked")
    routed = gated_lm("routed").eval()
    routed.load_state_dict(masked.state_dict())
    x = torch.randint(0, V, (6, T), generator=torch.Generator().manual_seed(4))
    forced = _forced_choices(6)
    with torch.no_grad():
        a, ta = masked(x, forced)
        b, tb = routed(x, forced)
        assert torch.equal(ta.choices, tb.choices)
        assert torch.allclose(a, b, atol=1e-5)
        free_a, fa = masked(x)
        free_b, fb = routed(x)
    assert torch.equal(fa.choices, fb.choices) and torch.allclose(free_a, free_b, atol=1e-5)


@pytest.mark.parametrize("execution", ["masked", "routed"])
def test_skipping_every_block_gives_the_residual_stream(execution):
    model = warmed(execution)
    bb = model.backbone
    x = torch.randint(0, V, (3, T))
    with torch.no_grad():
        logits, _ = model(x, torch.zeros(3, 2, dtype=torch.long))  # option 0 is skip in every block
        ref = bb.head(bb.features(x, FP32), FP32)  # the model with every block skipped
    assert torch.equal(logits, ref)


def test_qmatmul_at_mixed_precision_quantizes_each_sequence_at_its_bits():
    """Rows (dim 0: sequences) grouped by option: each group's rows equal the single-precision node on those
    rows with the same ranges (one per operand over the whole batch), forward and backward (the error of each
    group at its own BW over its own range, the same rounding noise)."""
    torch.manual_seed(0)
    a0, b0 = torch.randn(5, 2, 6, 4), torch.randn(5, 2, 4, 6)
    groups = ((0, 2, Precision.fwbw(3, 6)), (2, 5, Precision.fwbw(6, 12)))
    ra, rb = quant.tensor_range(a0), quant.tensor_range(b0)
    g = torch.randn(5, 2, 6, 6)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    y = autograd.qmatmul(a, b, MixedPrecision(groups, weight=32), ra, rb)
    torch.manual_seed(9)
    y.backward(g)
    torch.manual_seed(9)
    for s, e, p in groups:  # the reference, group by group in the same order (the same noise draws)
        a1, b1 = a0[s:e].clone().requires_grad_(), b0[s:e].clone().requires_grad_()
        y1 = autograd.qmatmul(a1, b1, p, ra, rb)
        assert torch.allclose(y[s:e], y1, atol=1e-6)
        assert torch.allclose(y1, quant.quantize(a0[s:e], p.act, *ra) @ quant.quantize(b0[s:e], p.act, *rb),
                              atol=1e-6)
        y1.backward(g[s:e])
        assert torch.allclose(a.grad[s:e], a1.grad, atol=1e-6) and torch.allclose(b.grad[s:e], b1.grad, atol=1e-6)
    # the layer: one range per operand over the batch, each running range updated once; eval: running ranges
    mm = QMatmul(0)
    mixed = MixedPrecision(groups, 32)
    out = mm(a0, b0, mixed)
    assert torch.allclose(out[:2], quant.quantize(a0[:2], 3, *ra) @ quant.quantize(b0[:2], 3, *rb), atol=1e-6)
    assert float(mm.run_range) == pytest.approx(0.1 * (ra[1] - ra[0]))  # m = 0.9 on the old value (0)
    assert float(mm.run_range_b) == pytest.approx(0.1 * (rb[1] - rb[0]))
    mm.eval()
    one = mm(a0[2:], b0[2:], Precision.fwbw(6, 12))
    assert torch.allclose(mm(a0, b0, mixed)[2:], one, atol=1e-6)


def test_gated_cost_per_token_by_hand_for_transformer_tiny():
    """omega = a block's MACs per token (qkv, scores, context, out, ff1, ff2); BitOPs per token at the chosen
    options, the embedding (not a GEMM) and the fp32 output layer for every token; the gate per sequence."""
    d, ff, vocab, t = 32, 64, 50, 16
    model = build_model("transformer_tiny", 1, vocab)
    model.set_layer_map(LayerMap(stem=False, fc=False, head=False))
    counter = BitOpsCounter(model.layer_table((t,)), model.layer_map)
    gated = GatedModel(model, OPTS)
    costs = BlockCosts(counter, OPTS, 2, gated.gate_macs())
    linear, attn = 3 * d * d + d * d + d * ff + ff * d, 2 * t * d  # per token and block
    assert costs.block_macs == [linear + attn] * 2 == [9216, 9216]
    assert costs.fixed == d * vocab * 3072  # the output layer in fp32; the embedding lookup is not counted

    def block(opt: Precision) -> int:  # linears at (a, w, g); attention's matmuls at (a, a, g), no weights
        return linear * opt.bitops_per_mac() + attn * (opt.act * opt.act + 2 * opt.grad * opt.act)

    assert costs.table[0] == [block(o) if not o.skip else 0 for o in OPTS]
    choices = torch.tensor([[0, 1], [3, 2], [1, 1]])  # three sequences of t tokens each
    expected = t * (3 * costs.fixed + costs.table[0][0] + costs.table[1][1] + costs.table[0][3]
                    + costs.table[1][2] + costs.table[0][1] + costs.table[1][1])
    assert costs.batch_bitops(choices, tokens=t) == expected
    assert costs.batch_costs(choices, tokens=t)["bitops"] == expected
    assert costs.batch_costs(choices, tokens=t)["macs"] == 3 * t * (3 * d * vocab + 5 * (linear + attn))
    # the gated cp per sequence is the per-token cp (every sequence has t tokens)
    kappa, omega = option_kappa(OPTS), torch.ones(2, dtype=torch.float64)
    assert gated_cp(choices, kappa, omega) == pytest.approx(
        100 * float(kappa[0] + kappa[1] + kappa[3] + kappa[2] + 2 * kappa[1]) / (3 * 2 * 3))
    # the gate: embeddings (d -> 32 -> 16) per block, an LSTM step (16 -> 16) and the projection (16 -> K) per
    # block, once per sequence (t tokens)
    gate = 2 * (d * 32 + 32 * 16) + 2 * (4 * 16 * (16 + 16) + 16 * len(OPTS))
    assert gated.gate_macs() == gate and costs.gate == 3 * gate * 1024


def test_gated_lm_configs_are_accepted_and_fp32_layers_enforced(tmp_path):
    base = {"model": {"name": "transformer_tiny"}, "data": {"dataset": "fortunes"}}
    cfg = parse_config({**base, "schedule": {"kind": "dfq", "target_cp": 3.0}})
    assert cfg.gated and cfg.layer_map(stem_default=False) == LayerMap(stem=False, fc=False, head=False,
                                                                        depthwise=cfg.layer_map(False).depthwise)
    assert cfg.schedule.omega_kind("transformer_tiny") == "macs"
    parse_config({**base, "schedule": {"kind": "fractrain", "cp0": 2.0, "execution": "routed"}})
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "quant": {"quantize_fc": True, "quantize_embedding": True},
                      "schedule": {"kind": "dfq", "target_cp": 3.0}})
    lines = str(err.value).splitlines()
    assert any("quant.quantize_fc" in x and "True" in x and "allowed: false" in x for x in lines)
    assert any("quant.quantize_embedding" in x and "allowed: false" in x for x in lines)
    with pytest.raises(ConfigError, match="schedule.target_cp"):
        parse_config({**base, "schedule": {"kind": "dfq", "target_cp": 50.0}})


def test_a_short_routed_fractrain_run_on_a_tiny_corpus(tmp_path):
    cfg = lm_config(write_wikitext(tmp_path / "wt", n_train=150),
                    {"kind": "fractrain", "cp0": 2.0, "cp_step": 1.0, "num_turning_points": 1, "eval_every": 3,
                     "execution": "routed", "options": ["skip", "3/6", "4/8", "6/8"]}, epochs=2)
    m = train_and_evaluate(cfg).metrics
    assert math.isfinite(m["perplexity"]) and m["perplexity"] < m["unigram_perplexity"] * 1.5
    tokens = m["train_tokens"]
    assert tokens % cfg.data.seq_len == 0
    assert m["fp32_bitops"] == tokens * m["forward_macs_per_token"] * 3072  # references per token
    assert m["costs"]["bitops"]["total"] == m["train_bitops"] < m["fw8bw8_bitops"]
    assert 0 < m["cp_last_epoch"] <= 100 * (6 * 4 + 8 * 4 + 6 * 8) / 3072  # at most every block at 6/8
    assert abs(m["cp_last_epoch"] / m["target_cp"] - 1) < 0.5, (m["cp_last_epoch"], m["target_cp"])
    # the gate ran once per sequence and block
    model = build_model("transformer_tiny", 1, m["vocab_size"])
    gate_macs = GatedModel(model, cfg.schedule.option_precisions(cfg.model.name)).gate_macs()
    assert m["gate_bitops"] == tokens // cfg.data.seq_len * 3 * gate_macs * 1024
