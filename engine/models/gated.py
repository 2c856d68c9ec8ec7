"""DFQ's gated networks: any fractune backbone with residual ``blocks`` plus a recurrent gate that picks each
block's precision option per input (algorithms.md 3.2-3.3).

Two execution modes give the same forward values for the same choices (in eval mode; in train mode the
batch statistics of BN and of the activation ranges are those of the batch each option sees):

* ``masked`` (the reference): every option runs on the whole batch, ``h_l = sum_k m_lk * y_lk``. The gate's
  CE gradient is ``<dL/dh_l, y_lk>`` for every option k, which is why every candidate is materialised.
* ``routed``: samples are grouped by their chosen option and each group runs only at that option; the skip
  path (an identity, or the block's 1x1 projection in fp32) runs for every sample. Gradient estimator: the
  straight-through mask as in ``masked``, with every unchosen non-skip option assumed to produce the chosen
  option's output: ``h = (sum_{k != skip} m_k) * y_c + m_skip * y_skip``. The gate's CE gradient then compares
  computing the block with skipping it, ``dL/dp_k = <dL/dh, y_c>`` for non-skip k and ``<dL/dh, y_skip>``
  for skip, which is the masked estimator when the options' outputs differ only by quantization noise; a
  sample that skipped gets no CE signal between options. The cost term's gradient needs no outputs and is
  identical in both modes. (Without a skip option, the CE gives the gate no signal in this mode.)
"""

from __future__ import annotations

import torch
from torch import nn

from engine.gate import GateTrace, RecurrentGate, straight_through
from engine.models.base import QModel
from engine.precision import FP32, Precision


class GatedModel(nn.Module):
    def __init__(self, backbone: QModel, options: list[Precision], execution: str = "masked",
                 gate_dim: int = 32, embed_dim: int = 16, hidden_dim: int = 16):
        super().__init__()
        self.backbone = backbone
        self.options = list(options)
        self.execution = execution
        allowed = torch.tensor([[not (o.skip and not getattr(b, "can_skip", False)) for o in self.options]
                                for b in backbone.blocks])
        if not allowed.any(dim=1).all():
            raise ValueError("every block needs at least one option it can take")
        self.skip_index = next((k for k, o in enumerate(self.options) if o.skip), None)
        self.gate = RecurrentGate([b.in_channels for b in backbone.blocks], len(self.options), allowed,
                                  gate_dim, embed_dim, hidden_dim)
        # the dual controller's price on the options' normalised costs (engine.controller): (L, K) and a scalar;
        # saved with the model, so evaluation and a resumed run decide as training did
        self.register_buffer("option_cost", torch.zeros(len(backbone.blocks), len(self.options)))
        self.register_buffer("price", torch.zeros(()))

    def set_option_cost(self, cost: torch.Tensor) -> None:
        self.option_cost.copy_(cost.to(self.option_cost))

    def set_price(self, price: float) -> None:
        self.price.fill_(price)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.backbone.blocks

    def _option(self, block: nn.Module, k: int, h: torch.Tensor) -> torch.Tensor:
        opt = self.options[k]
        return block.skip(h) if opt.skip else block(h, opt)

    def _masked(self, i: int, block: nn.Module, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = None
        for k in range(len(self.options)):
            if not bool(self.gate.allowed[i, k]):
                continue
            y = self._option(block, k, h) * mask[:, k].view(-1, 1, 1, 1)
            out = y if out is None else out + y
        return out

    def _routed(self, i: int, block: nn.Module, h: torch.Tensor, choice: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        skip_k = self.skip_index
        computed = choice if skip_k is None else choice.masked_fill(choice == skip_k, -1)
        y_skip = block.skip(h) if skip_k is not None and bool(self.gate.allowed[i, skip_k]) else None
        parts, order = [], []
        for k in torch.unique(computed).tolist():
            idx = (computed == k).nonzero().squeeze(1)
            parts.append(y_skip.index_select(0, idx) if k < 0 else block(h.index_select(0, idx), self.options[k]))
            order.append(idx)
        perm = torch.cat(order)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(len(perm), device=perm.device)
        y = torch.cat(parts).index_select(0, inverse)  # the chosen option's output (skip path if skipped)
        if y_skip is None:  # no skip option: every option "computes"; the value is the chosen output
            return y * mask.gather(1, choice.unsqueeze(1)).view(-1, 1, 1, 1)
        # h = (sum of the non-skip masks) * y + m_skip * y_skip: one-hot in value; the gate's CE gradient
        # compares computing the block (the chosen output) with skipping it (see the module docstring)
        m_skip = mask[:, skip_k]
        m_comp = mask.sum(1) - m_skip
        return m_comp.view(-1, 1, 1, 1) * y + m_skip.view(-1, 1, 1, 1) * y_skip

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, GateTrace]:
        """Logits and the gate's decisions. ``forced`` (B, L) overrides the choices (tests, analysis)."""
        bb = self.backbone
        h = bb.features(x, FP32)  # the layer map keeps the stem fp32 in DFQ
        state = None
        masks, choices, probs = [], [], []
        priced = bool(self.price != 0)
        for i, block in enumerate(bb.blocks):
            z, state = self.gate.step(i, h, state)
            if priced:  # the decision argmax_k (z_lk - price * c_lk) (methods.md §6.5)
                z = z - self.price * self.option_cost[i]
            p = torch.softmax(z, dim=-1)
            choice, mask = straight_through(p)
            if forced is not None:
                choice = forced[:, i]
                mask = torch.nn.functional.one_hot(choice, p.shape[-1]).to(p.dtype) + (p - p.detach())
            h = self._masked(i, block, h, mask) if self.execution == "masked" else self._routed(i, block, h, choice, mask)
            masks.append(mask)
            choices.append(choice)
            probs.append(p)
        logits = bb.head(h, FP32)
        return logits, GateTrace(torch.stack(masks, 1), torch.stack(choices, 1), torch.stack(probs, 1))

    def gate_macs(self) -> int:
        """Forward MACs of the gate for one sample (embeddings, LSTM steps, projection); kept apart."""
        g = self.gate
        lstm = 4 * g.lstm.hidden_size * (g.lstm.input_size + g.lstm.hidden_size)
        emb = sum(e.fc1.in_features * e.fc1.out_features + e.fc2.in_features * e.fc2.out_features for e in g.embeds)
        return emb + len(g.embeds) * (lstm + g.proj.in_features * g.proj.out_features)
