"""What a gated run's cp is measured over (docs/methods.md §6.4, "Cost bases"): the basis its target names,
which its controller steers and both of which the run logs.

* ``gated`` (the papers' cp, the default): the gated blocks only, ``100 * sum_l omega_l kappa_l,c_l / (3 sum_l
  omega_l)`` per sample, ``kappa_k = (a w + g w + a g) / 1024`` for an option that computes the block; a layer
  at a fixed precision whatever the option (MobileNetV2's depthwise convs) at its own bits, so ``kappa_lk`` is
  the block's cost per MAC.
* ``model``: the whole model, ``100 * (fixed + gate + sum_l T_l,c_l) / FP32`` per sample: the layers outside the
  gated blocks (the stem, the FC, a MobileNetV2 head conv: fp32 in DFQ), the gate's own fp32 passes and each
  block at its chosen option, against the same network at FP32; the basis on which a gated run and a static run
  of the gated layer map (``quant.layer_map: gated``) cost the same when their cps are equal.

Under both a skip costs what its path runs (``BlockCosts``): nothing for an identity, the block's 1x1
projection in fp32 for a downsampling block, which costs more than computing the block at a typical option.
A controller that counted it as free could meet its target by skipping into a dearer path.

Each basis is one form, ``cp = offset + 100 * sum_l omega_l kappa_l,c_l / (3 sum_l omega_l)`` with a (L, K)
``kappa``: the gated basis has ``offset`` 0; the model basis ``omega`` 1 and ``kappa_lk = 3 L T_lk / FP32``, so
engine.dfq.gate's cp, cost term, price unit and price search serve both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.dfq.gate import gated_cp_tensor, normalised_cost, price_for_target
from engine.numerics.precision import Precision


@dataclass(frozen=True)
class CpBasis:
    """One basis: ``kappa`` (L, K) and ``omega`` (L,) float64, ``offset`` (percent, what no decision changes),
    ``allowed`` (L, K) bool (the options each block may take) and ``computing`` (K,) bool (non-skip options)."""

    name: str
    kappa: torch.Tensor
    omega: torch.Tensor
    offset: float
    allowed: torch.Tensor
    computing: torch.Tensor

    def cp_tensor(self, choices: torch.Tensor) -> torch.Tensor:
        """The batch's mean cp (percent), a float64 scalar on the choices' device."""
        return gated_cp_tensor(choices, self.kappa, self.omega) + self.offset

    def cp(self, choices: torch.Tensor) -> float:
        return float(self.cp_tensor(choices))

    def option_cost(self) -> torch.Tensor:
        """(L, K) float32: each option's cost in the unit of the dual controller's price (about 1 for a typical
        option), in the float32 the gated model's decisions use."""
        return normalised_cost(self.kappa, self.omega, self.computing).to(torch.float32)

    def price_for_target(self, logits: torch.Tensor, option_cost: torch.Tensor, target: float, limit: float) -> float:
        return price_for_target(logits, option_cost, self.kappa, self.omega, target - self.offset, limit)

    def reach(self) -> tuple[float, float]:
        """(lowest, highest) cp the options can give: every block at its cheapest, or dearest, allowed option."""
        big = torch.finfo(self.kappa.dtype).max
        lo = torch.where(self.allowed, self.kappa, big).min(1).values
        hi = torch.where(self.allowed, self.kappa, -big).max(1).values
        scale = 100.0 / (3.0 * float(self.omega.sum()))
        return (self.offset + scale * float((lo * self.omega).sum()),
                self.offset + scale * float((hi * self.omega).sum()))


def build_bases(options: list[Precision], table: list[list[int]], papers: list[list[int]], block_macs: list[int],
                fixed: int, gate: float, fp32: int, omega: torch.Tensor, allowed: torch.Tensor) -> dict[str, CpBasis]:
    """Both bases of a gated model. ``table`` (L, K): BitOPs per sample of each block at each option, a skip's
    path included; ``papers`` (L, K): the same priced as the papers' cp prices them (``BlockCosts.papers``);
    ``fixed``: the layers outside the blocks; ``gate``: the gate's BitOPs per sample; ``fp32``: the whole network
    at FP32 per sample; ``omega``: the papers' block weights (uniform, or MACs)."""
    blocks = len(table)
    computing = torch.tensor([not o.skip for o in options])
    bitops = torch.tensor(table, dtype=torch.float64)  # (L, K)
    macs = torch.tensor(block_macs, dtype=torch.float64).view(-1, 1)
    # per block MAC: the papers' kappa_k where every layer follows the option, exactly
    gated = torch.tensor(papers, dtype=torch.float64) / (1024.0 * macs)
    model = 3.0 * blocks * bitops / fp32
    return {
        "gated": CpBasis("gated", gated, omega.to(torch.float64), 0.0, allowed, computing),
        "model": CpBasis("model", model, torch.ones(blocks, dtype=torch.float64), 100.0 * (fixed + gate) / fp32,
                         allowed, computing),
    }
