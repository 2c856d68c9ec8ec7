"""Causal Transformer language models (docs/methods.md §11): ``transformer_base`` and small presets.

Token embedding (scaled by sqrt(d)) + sinusoidal positions + dropout, then ``layers`` pre-LayerNorm blocks
(``x + attn(LN(x))``, then ``x + ff(LN(x))``), a final LayerNorm and the output layer over the vocabulary.
Every linear layer (the fused query/key/value projection, the attention output projection, both
feed-forward layers) is a ``QLinear`` at the scheduled precision; both attention matmuls (scores ``Q K^T``
and context ``P V``) are ``QMatmul`` (one ``autograd.qmatmul`` node each), operands at FW and dL/dY at BW.
LayerNorm, softmax, the residual additions and the embedding stay fp32; the output layer (role ``fc``,
``quant.quantize_fc``) and the embedding (role ``embed``, ``quant.quantize_embedding``) follow the schedule by
config.

``forward(tokens, prec)`` takes ``(B, T)`` token ids and returns ``(B * T, V)`` logits, one row per
predicted token, so the training loop's cross entropy, token accuracy and "BitOPs per sample" (here per
token) need no special case. A block (attention + feed-forward) is the unit DFQ and FracTrain gate, per
sequence (``engine.dfq.gated.GatedModel``; skip = the residual path, the block's identity): the gate reads
each block input at the first position only (``gate_summary``), whose representation depends on token 0
alone under causal attention, so the gated model stays strictly causal (methods.md §11.1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.base import LayerInfo, QModel, register_model
from engine.numerics import autograd, quant
from engine.numerics.layers import QLinear, QMatmul
from engine.numerics.precision import FULL_BITS, Precision


def sinusoids(length: int, dim: int, device=None) -> torch.Tensor:
    """The fixed sinusoidal position table (Vaswani et al. 2017), ``(length, dim)``."""
    pos = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prec: Precision, scores_mm: QMatmul,
                     context_mm: QMatmul, dropout: float = 0.0, training: bool = False) -> torch.Tensor:
    """Causal scaled dot-product attention over ``(B, H, T, dh)``; both matmuls quantized at ``prec`` (fp32:
    equals ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``); softmax in fp32."""
    t = q.shape[-2]
    scores = scores_mm(q, k.transpose(-1, -2), prec) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    if dropout and training:
        probs = F.dropout(probs, dropout, True)
    return context_mm(probs, v, prec)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, index: int, m: float, attn_dropout: float):
        super().__init__()
        self.heads, self.attn_dropout = heads, attn_dropout
        self.qkv = QLinear(d, 3 * d, role="body", block=index, act_momentum=m)
        self.out = QLinear(d, d, role="body", block=index, act_momentum=m)
        self.scores, self.context = QMatmul(index, m), QMatmul(index, m)

    def forward(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x, prec).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        ctx = causal_attention(q, k, v, prec, self.scores, self.context, self.attn_dropout, self.training)
        return self.out(ctx.transpose(1, 2).reshape(b, t, d), prec)


class TransformerBlock(nn.Module):
    """Pre-LN block: ``x + drop(attn(LN(x)))`` then ``x + drop(ff(LN(x)))``; DFQ's skip is the identity."""

    can_skip = True

    def __init__(self, d: int, heads: int, ff: int, index: int, m: float, dropout: float, attn_dropout: float):
        super().__init__()
        self.in_channels = d
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, index, m, attn_dropout)
        self.ff1 = QLinear(d, ff, role="body", block=index, act_momentum=m)
        self.ff2 = QLinear(ff, d, role="body", block=index, act_momentum=m)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        x = x + F.dropout(self.attn(self.ln1(x), prec), self.dropout, self.training)
        h = self.ff2(F.relu(self.ff1(self.ln2(x), prec)), prec)
        return x + F.dropout(h, self.dropout, self.training)

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        return x


class TransformerLM(QModel):
    """A decoder-only causal language model over a word vocabulary of ``vocab`` tokens."""

    stem_quantized_by_default = False  # no stem; the embedding is role ``embed`` (fp32 unless configured)
    is_language_model = True

    def __init__(self, vocab: int, d: int, heads: int, ff: int, layers: int, dropout: float = 0.1,
                 attn_dropout: float = 0.0, act_momentum: float = 0.9):
        super().__init__()
        if d % heads:
            raise ValueError(f"width {d} is not a multiple of {heads} heads")
        self.vocab, self.d, self.heads, self.ff, self.dropout = vocab, d, heads, ff, dropout
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(TransformerBlock(d, heads, ff, i, act_momentum, dropout, attn_dropout)
                                    for i in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.fc = QLinear(d, vocab, role="fc", act_momentum=act_momentum)
        nn.init.normal_(self.embed.weight, 0.0, d ** -0.5)
        for mod in self.modules():
            if isinstance(mod, QLinear):
                nn.init.xavier_uniform_(mod.weight)
                nn.init.zeros_(mod.bias)

    def features(self, tokens: torch.Tensor, prec: Precision) -> torch.Tensor:
        p = self.p("embed", prec)
        w = self.embed.weight
        if not p.is_fp32 and p.weight < FULL_BITS:  # weights at FW bits, straight through
            w = w + (quant.quantize_weight(w.detach(), p.weight) - w).detach()
        x = F.embedding(tokens, w) * math.sqrt(self.d)
        if not p.is_fp32:
            x = autograd.quantize_grad(x, p.grad)
        x = x + sinusoids(tokens.shape[1], self.d, tokens.device)
        return F.dropout(x, self.dropout, self.training)

    def gate_summary(self, h: torch.Tensor) -> torch.Tensor:
        """What DFQ's gate reads of a block input ``(B, T, d)``: the first position, ``(B, d)``. Under causal
        attention it depends on token 0 alone, so a per-sequence choice made from it changes no logit through
        a later token (a mean over the T positions would: methods.md §11.1)."""
        return h[:, 0]

    def head(self, x: torch.Tensor, prec: Precision) -> torch.Tensor:
        x = self.ln_f(x)
        return self.fc(x.reshape(-1, self.d), self.p("fc", prec))

    @torch.no_grad()
    def layer_table(self, input_shape: tuple[int, ...]) -> list[LayerInfo]:
        """Forward MACs per token for a sequence length ``input_shape[0]`` (methods.md §11): per block
        ``3d^2`` (qkv) + ``T d`` (scores) + ``T d`` (context) + ``d^2`` (out) + ``d ff`` + ``ff d``, and ``d V``
        for the output layer. Both attention matmuls are counted as the dense kernel runs them: every token
        against all ``T`` positions (the causal mask discards the upper half after computing it).

        The element counts the ``memory`` cost model prices (per token; methods.md §10): a linear layer's
        weights (``in x out``), its input (``in``) and output (``out``) features; an attention matmul has no
        weights, its inputs are both operands' rows for the token (scores: the query and the key, ``2d``;
        context: the ``H T`` attention probabilities and the value, ``H T + d``) and its outputs the rows it
        writes (scores: ``H T``; context: ``d``)."""
        (t,) = input_shape
        d, ff, h = self.d, self.ff, self.heads

        def linear(name: str, role: str, block: int | None, n_in: int, n_out: int) -> LayerInfo:
            return LayerInfo(name, role, block, n_in * n_out, weights=n_in * n_out, inputs=n_in, outputs=n_out)

        rows = []
        for i in range(len(self.blocks)):
            pre = f"blocks.{i}"
            rows += [linear(f"{pre}.attn.qkv", "body", i, d, 3 * d),
                     LayerInfo(f"{pre}.attn.scores", "attn", i, t * d, weights=0, inputs=2 * d, outputs=h * t),
                     LayerInfo(f"{pre}.attn.context", "attn", i, t * d, weights=0, inputs=h * t + d, outputs=d),
                     linear(f"{pre}.attn.out", "body", i, d, d),
                     linear(f"{pre}.ff1", "body", i, d, ff),
                     linear(f"{pre}.ff2", "body", i, ff, d)]
        rows.append(linear("fc", "fc", None, d, self.vocab))
        return rows


PRESETS = {  # name: (width, heads, feed-forward, layers)
    "transformer_base": (512, 8, 2048, 6),  # the FracTrain supplement's Transformer-base on WikiText-103
    "transformer_small": (128, 4, 512, 2),  # the embedded corpus's demo
    "transformer_tiny": (32, 2, 64, 2),  # tests
}


def _preset(name: str):
    d, heads, ff, layers = PRESETS[name]

    def build(in_channels: int = 1, num_classes: int = 10000, act_momentum: float = 0.9) -> TransformerLM:
        return TransformerLM(num_classes, d, heads, ff, layers, act_momentum=act_momentum)

    build.__doc__ = f"Causal Transformer LM: width {d}, {heads} heads, feed-forward {ff}, {layers} layers."
    return build


for _name in PRESETS:
    register_model(_name)(_preset(_name))
