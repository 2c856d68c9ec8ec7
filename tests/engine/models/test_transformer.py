"""The Transformer language model (docs/methods.md §11): quantized attention, causality, per-token MACs, the
quantized matmul's gradients, perplexity, the text corpora and short training runs of each schedule."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from engine.config.experiment import parse_config
from engine.cost.bitops import BitOpsCounter
from engine.data.datasets import load_data
from engine.data.text import EOS, UNK, TokenSplit, build_vocab
from engine.errors import ConfigError, DataError
from engine.models import build_model
from engine.models.transformer import causal_attention
from engine.numerics import autograd, quant
from engine.numerics.layers import QLinear, QMatmul
from engine.numerics.precision import FP32, Precision
from engine.run_metrics import perplexity
from engine.train import evaluate, train_and_evaluate
from tests.conftest import run_main

P48 = Precision.fwbw(4, 8)


def test_attention_at_fp32_equals_sdpa_with_causal_mask():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    ours = causal_attention(q, k, v, FP32, QMatmul(), QMatmul())
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ours, ref, atol=1e-6)
    quantized = causal_attention(q, k, v, P48, QMatmul(), QMatmul())
    assert not torch.allclose(quantized, ref, atol=1e-4)  # the matmuls really are quantized at FW4
    assert torch.allclose(quantized, ref, atol=0.5)


@pytest.mark.parametrize("prec", [FP32, P48])
def test_a_later_token_changes_no_earlier_logit(prec):
    torch.manual_seed(0)
    model = build_model("transformer_tiny", 1, 40)
    x = torch.randint(0, 40, (3, 9))
    F.cross_entropy(model(x, prec), torch.randint(0, 40, (27,))).backward()  # train mode: running ranges set
    model.eval()  # eval: every quantizer uses its running range, so nothing depends on later positions
    x2 = x.clone()
    x2[:, 6] = (x2[:, 6] + 1) % 40
    a, b = model(x, prec).view(3, 9, 40), model(x2, prec).view(3, 9, 40)
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_qmatmul_gradients_match_the_three_node_reference():
    """One node == STE(Qa(A)) @ STE(Qa(B)) followed by the gradient quantizer, with the same rounding noise."""
    torch.manual_seed(1)
    a0, b0 = torch.randn(2, 4, 5), torch.randn(2, 5, 3)
    g = torch.randn(2, 4, 3)
    a1, b1 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    torch.manual_seed(7)
    autograd.qmatmul(a1, b1, Precision(act=4, grad=6), None, (-1.0, 1.5)).backward(g)
    a2, b2 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    aq = a2 + (quant.quantize_tensor(a2.detach(), 4) - a2).detach()
    bq = b2 + (quant.quantize(b2.detach(), 4, -1.0, 1.5) - b2).detach()
    y = autograd.quantize_grad(aq @ bq, 6)
    torch.manual_seed(7)
    y.backward(g)
    assert torch.allclose(a1.grad, a2.grad, atol=1e-6) and torch.allclose(b1.grad, b2.grad, atol=1e-6)
    # and the formula itself, with the error left at 32 bits: dA = G B_q^T, dB = A_q^T G
    a3, b3 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    autograd.qmatmul(a3, b3, Precision(act=4, grad=32), None, None).backward(g)
    aq, bq = quant.quantize_tensor(a0, 4), quant.quantize_tensor(b0, 4)
    assert torch.allclose(a3.grad, g @ bq.transpose(1, 2), atol=1e-6)
    assert torch.allclose(b3.grad, aq.transpose(1, 2) @ g, atol=1e-6)


def _measured_macs_per_token(model, t: int) -> dict[str, int]:
    """MACs per token counted from the shapes the layers really see in one forward pass."""
    names = {m: n for n, m in model.named_modules() if isinstance(m, QLinear | QMatmul)}
    macs: dict[str, int] = {}

    def hook(mod, inp, out):
        if isinstance(mod, QLinear):
            macs[names[mod]] = mod.in_features * mod.out_features
        else:  # (B, H, T, k) @ (B, H, k, n): B*H*T*k*n MACs over B*T tokens
            a, b = inp[0], inp[1]
            macs[names[mod]] = a.shape[1] * a.shape[2] * a.shape[3] * b.shape[3] // t

    hs = [m.register_forward_hook(hook) for m in names]
    model.eval()
    model(torch.zeros(1, t, dtype=torch.long), FP32)
    for h in hs:
        h.remove()
    return macs


def test_macs_per_token_of_a_tiny_model_match_a_hand_count():
    d, ff, layers, vocab, t = 32, 64, 2, 50, 16  # transformer_tiny
    model = build_model("transformer_tiny", 1, vocab)
    table = model.layer_table((t,))
    per_block = 3 * d * d + t * d + t * d + d * d + d * ff + ff * d  # qkv, scores, context, out, ff1, ff2
    assert per_block == 9216
    assert sum(x.macs for x in table) == layers * per_block + d * vocab == 20032
    assert {x.name: x.macs for x in table} == _measured_macs_per_token(model, t)
    assert [x.role for x in table].count("attn") == 2 * layers and table[-1].role == "fc"


def test_bitops_of_attention_use_fw_for_both_operands():
    model = build_model("transformer_tiny", 1, 50)
    counter = BitOpsCounter(model.layer_table((16,)), model.layer_map)
    prec = Precision.fwbw(4, 8, weight=6)  # a weight width apart from FW: attention has no weights
    rows = {r["layer"]: r for r in counter.per_layer(prec)}
    assert rows["blocks.0.attn.scores"]["bitops"] == 16 * 32 * (4 * 4 + 8 * 4 + 4 * 8)
    assert rows["blocks.0.ff1"]["bitops"] == 32 * 64 * (4 * 6 + 8 * 6 + 4 * 8)
    assert rows["fc"]["bitops"] == 32 * 50 * 3072  # the output layer stays fp32 by default


def test_cost_models_price_the_lm_per_token():
    """Every cost model prices the attention matmuls with both operands at FW and no weights (methods.md §11)."""
    from engine.cost.cost_models import build_models, energy_mac_pj, int_units_mac

    d, h, t, vocab = 32, 2, 16, 50
    model = build_model("transformer_tiny", 1, vocab)
    table = {x.name: x for x in model.layer_table((t,))}
    scores, context, ff1 = table["blocks.0.attn.scores"], table["blocks.0.attn.context"], table["blocks.0.ff1"]
    assert (scores.weights, scores.inputs, scores.outputs) == (0, 2 * d, h * t)
    assert (context.weights, context.inputs, context.outputs) == (0, h * t + d, d)
    assert (ff1.weights, ff1.inputs, ff1.outputs) == (d * 64, d, 64)
    counter = BitOpsCounter(list(table.values()), model.layer_map, build_models())
    prec = Precision.fwbw(4, 8, weight=6)
    only = {name: BitOpsCounter([table[name]], model.layer_map, build_models()) for name in table}
    one = {name: c.costs(prec, 1) for name, c in only.items()}
    zero = {name: c.costs(prec, 0) for name, c in only.items()}
    m = scores.macs
    assert one["blocks.0.attn.scores"]["macs"] == 3 * m
    assert one["blocks.0.attn.scores"]["bitops"] == m * (4 * 4 + 8 * 4 + 4 * 8)
    assert one["blocks.0.attn.scores"]["int_units"] == m * (int_units_mac(4, 4) + int_units_mac(8, 4) + int_units_mac(4, 8))
    assert one["blocks.0.attn.scores"]["energy"] == pytest.approx(m * (energy_mac_pj(4, 4) + 2 * energy_mac_pj(4, 8)))
    # memory: operands at FW (read by FW and GC), output errors at BW (read by EB and GC), no weight traffic
    assert one["blocks.0.attn.scores"]["memory"] == (2 * d * 2 * 4 + h * t * 2 * 8) / 8
    assert zero["blocks.0.attn.scores"]["memory"] == zero["blocks.0.attn.context"]["memory"] == 0
    assert zero["blocks.0.ff1"]["memory"] == d * 64 * (2 * 6 + 32) / 8  # weights once per iteration
    assert counter.costs(prec, 1)["bitops"] == counter.per_sample(prec)


def test_cost_cli_transformer_base_wikitext103():
    code, _, out = run_main("cost", "--model", "transformer_base", "--dataset", "wikitext103", "--precision", "8/8",
                            "--fc", "quantized", "--json")
    d, ff, layers, t, vocab = 512, 2048, 6, 256, 267735
    per_block = 4 * d * d + 2 * d * ff + 2 * t * d
    assert code == 0 and out["forward_macs_per_token"] == layers * per_block + d * vocab == 157527552
    assert out["ratio_vs_fp32"] == 64 * 3 / 3072 and out["vocab_size"] == vocab
    assert out["output_layer_share"] == d * vocab / out["forward_macs_per_token"]
    code, _, fp32_fc = run_main("cost", "--model", "transformer_base", "--dataset", "wikitext103", "--precision",
                                "8/8", "--json")  # the output layer fp32, as training runs it by default
    body = layers * per_block
    assert fp32_fc["ratio_vs_fp32"] == pytest.approx((body * 192 + d * vocab * 3072) / (out["forward_macs_per_token"] * 3072))
    code, _, _ = run_main("cost", "--model", "transformer_base", "--dataset", "cifar10", "--precision", "8/8")
    assert code == 2


def test_perplexity_is_exp_of_the_mean_token_cross_entropy():
    torch.manual_seed(0)
    model = build_model("transformer_tiny", 1, 30)
    split = TokenSplit(torch.randint(0, 30, (200,)), 9)  # 22 sequences: batches of 5 leave a short last one
    _, loss = evaluate(model, lambda x: model(x, FP32), split, 5, torch.device("cpu"))
    x, y = next(split.batches(len(split), shuffle=False))
    with torch.no_grad():
        model.eval()
        ref = F.cross_entropy(model(x, FP32), y)
    assert loss == pytest.approx(float(ref), rel=1e-5)
    assert perplexity(loss) == pytest.approx(math.exp(float(ref)), rel=1e-5)
    assert perplexity(float("nan")) != perplexity(float("nan")) and perplexity(800.0) == math.inf


def test_token_split_targets_are_the_next_tokens():
    split = TokenSplit(torch.arange(23), 5)
    assert len(split) == 4
    x, y = next(split.batches(2, shuffle=False))
    assert x.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] and y.tolist() == list(range(1, 11))


def test_vocabulary_from_training_only_with_a_cap():
    lines = [["b", "a", "b"], ["c", "b"]]
    vocab = build_vocab(lines, None)
    assert list(vocab) == ["b", EOS, "a", "c", UNK]  # by frequency, ties by first occurrence; <unk> added
    assert list(build_vocab(lines, 3)) == ["b", EOS, UNK]


def write_wikitext(folder, n_train: int = 400, seed: int = 0):
    """A WikiText-layout corpus with strong sequential structure (a model must beat the unigram easily)."""
    rng = random.Random(seed)
    subjects, verbs, objects = ["the cat", "a dog", "my friend", "the king"], ["sees", "likes", "eats"], \
        ["the fish", "an apple", "<unk>", "the moon"]

    def lines(n):
        return [" = Title = "] + [f" {rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} . " for _ in range(n)]

    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("valid", 60), ("test", 60)):
        extra = [" the zebra sees the moon . "] if name == "test" else []  # a word unseen in training
        (folder / f"wiki.{name}.tokens").write_text("\n".join(lines(n) + extra) + "\n")
    return folder


LM_BASE = {
    "name": "lm", "device": "cpu", "model": {"name": "transformer_tiny"},
    "data": {"dataset": "wikitext2", "seq_len": 16, "batch_size": 8, "eval_batch_size": 32},
    "optim": {"optimizer": "adam", "lr": 0.01, "weight_decay": 0.0, "lr_schedule": "constant", "epochs": 2},
}


def lm_config(data_dir, schedule: dict, **optim):
    tree = {**LM_BASE, "schedule": schedule}
    tree["data"] = {**tree["data"], "data_dir": str(data_dir)}
    tree["optim"] = {**tree["optim"], **optim}
    return parse_config(tree)


def test_wikitext_layout_vocabulary_and_errors(tmp_path):
    folder = write_wikitext(tmp_path / "wt")
    cfg = lm_config(folder, {"kind": "fp32"})
    data = load_data(cfg.data)
    assert data.info.classes == 19  # 16 words and "." "=" "Title" <eos> of the training split; "zebra" is <unk>
    assert data.info.tokens == len(data.train.stream) and data.val is not None
    (folder / "wiki.test.tokens").unlink()
    with pytest.raises(DataError, match="wiki.test.tokens"):
        load_data(cfg.data)
    code, _, _ = run_main("train", "--set", f"data.data_dir={folder}", str(_yaml(tmp_path, cfg)))
    assert code == 2


def test_a_sequence_longer_than_a_split_is_refused_naming_the_longest_that_fits(tmp_path):
    folder = write_wikitext(tmp_path / "wt")
    cfg = lm_config(folder, {"kind": "fp32"})
    full = load_data(cfg.data)
    longest = min(len(full.train.stream), len(full.test.stream)) - 1
    data = load_data(cfg.data.model_copy(update={"seq_len": longest}))
    assert len(data.test) == 1 and data.test.tokens == longest  # the bound the refusal names holds one sequence
    with pytest.raises(DataError) as err:
        load_data(cfg.data.model_copy(update={"seq_len": longest + 1}))
    assert str(err.value).startswith(f"data.seq_len: got {longest + 1}; allowed: <= {longest} (the "
                                 f"{cfg.data.dataset} train and test splits hold "), err


def _yaml(tmp_path, cfg):
    import yaml

    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


def test_configs_that_do_not_fit_a_language_model_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="model.name"):
        parse_config({"model": {"name": "resnet20"}, "data": {"dataset": "wikitext103"}})
    with pytest.raises(ConfigError, match="model.name"):
        parse_config({"model": {"name": "transformer_tiny"}, "data": {"dataset": "digits"}})
    with pytest.raises(ConfigError, match="quant.quantize_embedding"):  # gated: the embedding stays fp32
        parse_config({"model": {"name": "transformer_tiny"}, "data": {"dataset": "fortunes"},
                      "quant": {"quantize_embedding": True}, "schedule": {"kind": "dfq", "target_cp": 3.0}})


def test_static_lm_beats_the_unigram_and_counts_bitops_per_token(tmp_path):
    cfg = lm_config(write_wikitext(tmp_path / "wt"), {"kind": "static", "fw": 8, "bw": 8})
    m = train_and_evaluate(cfg).metrics
    assert m["task"] == "language_model" and m["perplexity"] == pytest.approx(math.exp(m["test_loss"]))
    assert m["perplexity"] < 0.6 * m["unigram_perplexity"]
    counter_fp32 = m["fp32_bitops"] / m["train_tokens"]
    assert counter_fp32 == m["forward_macs_per_token"] * 3072  # every counted "sample" is a token
    assert m["savings_vs_fw8bw8"] == 0.0 and m["bitops_per_token"] < counter_fp32
    assert m["tokens_per_second"] > 0
    costs = m["costs"]  # every cost model counts the same token samples, run and references alike
    assert costs["bitops"]["total"] == m["train_bitops"] and costs["bitops"]["fp32"] == m["fp32_bitops"]
    assert costs["macs"]["total"] == costs["macs"]["fp32"] == 3 * m["forward_macs_per_token"] * m["train_tokens"]
    assert 0 < costs["energy"]["total"] < costs["energy"]["fp32"] and m["train_cost_memory"] > 0


@pytest.mark.parametrize("schedule", [
    {"kind": "cpt", "fw_min": 3, "fw_max": 8, "num_cycles": 2},
    {"kind": "cpt", "fw_min": "auto", "fw_max": 8, "num_cycles": 2,  # the range test on next-token accuracy
     "prt": {"candidates": [2, 4, 6], "iterations_per_bit": 2, "window": 1}},
    {"kind": "pfq", "mode": "manual", "fw": [4, 6, 8], "bw": [6, 8, 8], "switch_at": [0.3, 0.6]},
    {"kind": "pfq", "mode": "auto", "fw": [4, 6, 8], "bw": [6, 8, 8]},
])
def test_cyclic_and_progressive_schedules_train_the_lm(tmp_path, schedule):
    cfg = lm_config(write_wikitext(tmp_path / "wt", n_train=150), schedule, epochs=1)
    m = train_and_evaluate(cfg).metrics
    assert math.isfinite(m["perplexity"]) and m["perplexity"] < m["unigram_perplexity"] * 1.5
    assert m["savings_vs_fw8bw8"] > 0  # below 8 bits for part of the run
    assert m["cp"] == pytest.approx(100 * m["train_bitops"] / m["fp32_bitops"])
    if "prt" in m:  # its tokens are priced in the run's totals and in both references alike
        assert m["prt"]["iterations"] == 6 and 2 <= m["prt"]["fw_min"] <= 8
        assert m["fp32_bitops"] == (m["train_tokens"] + 6 * 8 * 16) * m["forward_macs_per_token"] * 3072
        assert m["costs"]["macs"]["fp32"] == 3 * (m["train_tokens"] + 6 * 8 * 16) * m["forward_macs_per_token"]


def test_schedule_preview_prices_an_lm_per_token(tmp_path):
    from engine.data.catalog import INFO
    from engine.preview import preview

    cfg = lm_config(write_wikitext(tmp_path / "wt"), {"kind": "static", "fw": 8, "bw": 8})
    out = preview(cfg)
    tokens = cfg.run_length().total_iterations * cfg.data.batch_size * cfg.data.seq_len
    vocab = INFO["wikitext2"].classes  # a preview reads no corpus: the released vocabulary (data.vocab_size caps it)
    macs = sum(x.macs for x in build_model("transformer_tiny", 1, vocab).layer_table((cfg.data.seq_len,)))
    assert out["costs"]["macs"]["fp32"] == 3 * macs * tokens  # per token, a batch of sequences an iteration
    assert out["costs"]["bitops"]["ratio_vs_fp32"] < 1
    capped = preview(cfg.model_copy(update={"data": cfg.data.model_copy(update={"vocab_size": 50})}))
    assert capped["costs"]["macs"]["fp32"] < out["costs"]["macs"]["fp32"]
