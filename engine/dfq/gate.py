"""DFQ's gate, cost term and gated cp (FracTrain 3.2; docs/methods.md §6.1, §6.4).

Gate (SkipNet-style recurrent gate): for block ``l`` the embedding of its input ``h_{l-1}`` (a (B, C) summary
of it: the global average pool of an image, the first position of a language model's sequence, methods.md
§11.1; -> 1x1 conv C->gate_dim -> ReLU -> 1x1 conv gate_dim->embed_dim; the 1x1 convs on a pooled vector are
linear layers) is one time step of a single LSTM shared over depth (state zeroed per forward, carried block
to block); a linear layer gives the logits ``z_l`` over the K precision options, per sample. The gated model
prices them (``z - price * c``, the dual controller of methods.md §6.5) and takes ``p_l = softmax``; the
choice is ``u_l = onehot(argmax p_l)`` in train and eval (no sampling), and the straight-through mask is
``m_l = u_l + p_l - sg(p_l)``: the forward value is the one-hot, the backward the softmax Jacobian.
A block floor (methods.md §6.5) turns the least decided skippers of a block into computing samples
(``floor_skips``).
Options a block cannot take (skip on a stride-2 MobileNetV2 block) get probability 0.

Cost term, per sample (the reference's batch sum made independent of the batch size, methods.md §9):
``c_i = sum_l omega_l sum_k m_ilk kappa_lk / mean(omega)`` with ``kappa_k = (a_k w + g_k w + a_k g_k) / 1024``
(the FW, EB and GC effective MACs of one MAC), and ``loss = CE + weight * mean_i c_i`` with the controller's
weight. cp over the gated blocks is ``100 * sum_l omega_l sum_k u_lk kappa_lk / (3 sum_l omega_l)`` per sample.
``kappa`` is one cost per option (K,), the papers' form, or one per block and option (L, K): a skip costs what
its path runs in that block (engine.dfq.basis, methods.md §6.4). The reference's sign rules (``sign_dfq``,
``sign_fractrain``) live here; engine.dfq.controller uses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.numerics.precision import Precision


class Embedding(nn.Module):
    """The gate's embedding of a block input: ``C -> gate_dim``, ReLU, ``gate_dim -> embed_dim`` (the reference's
    CIFAR networks), or with ``layers=1`` one linear layer ``C -> embed_dim`` (its ImageNet ResNets, execution
    ``conv``; ``gate_dim`` unused)."""

    def __init__(self, channels: int, gate_dim: int, embed_dim: int, layers: int = 2):
        super().__init__()
        self.fc1 = nn.Linear(channels, gate_dim if layers == 2 else embed_dim)
        self.fc2 = nn.Linear(gate_dim, embed_dim) if layers == 2 else None
        for fc in (self.fc1, self.fc2):  # He-normal, fan-out, as the reference's 1x1 gate convs
            if fc is not None:
                nn.init.normal_(fc.weight, 0.0, (2.0 / fc.out_features) ** 0.5)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, C) summary of the block input (``QModel.gate_summary``), or a (B, C, H, W) image pooled here
        -> (B, embed_dim)."""
        if h.dim() == 4:
            h = h.mean(dim=(2, 3))
        return self.fc1(h) if self.fc2 is None else self.fc2(F.relu(self.fc1(h)))

    def macs(self) -> int:
        return sum(fc.in_features * fc.out_features for fc in (self.fc1, self.fc2) if fc is not None)


class RecurrentGate(nn.Module):
    def __init__(self, block_channels: list[int], num_options: int, allowed: torch.Tensor,
                 gate_dim: int = 32, embed_dim: int = 16, hidden_dim: int = 16, embed_layers: int = 2):
        super().__init__()
        self.embeds = nn.ModuleList(Embedding(c, gate_dim, embed_dim, embed_layers) for c in block_channels)
        self.lstm = nn.LSTM(embed_dim, hidden_dim)
        self.proj = nn.Linear(hidden_dim, num_options)
        nn.init.normal_(self.proj.weight, 0.0, (2.0 / (hidden_dim * num_options)) ** 0.5)
        # (L, K) bool: which options each block may take
        self.register_buffer("allowed", allowed.clone(), persistent=False)

    def step(self, block: int, h: torch.Tensor, state):
        """The logits z_l for block ``block`` from its input's summary ``h`` ((B, C), or a (B, C, H, W) image):
        (logits (B, K), LSTM state); options the block cannot take are at -inf."""
        out, state = self.lstm(self.embeds[block](h).unsqueeze(0), state)
        return self.proj(out[0]).masked_fill(~self.allowed[block], float("-inf")), state


def straight_through(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(choice (B,), mask (B, K)): the mask's value is one-hot(argmax p), its gradient that of p."""
    choice = p.argmax(dim=-1)  # ties go to the first option (the reference's numpy argmax gave multi-hot)
    hard = F.one_hot(choice, p.shape[-1]).to(p.dtype)
    return choice, hard + (p - p.detach())  # grouped so the value is exactly one-hot


def floor_skips(p: torch.Tensor, choice: torch.Tensor, skip_k: int, floor: float) -> torch.Tensor:
    """The choices (B,) with at least ``ceil(floor * B)`` samples computing the block (methods.md §6.5, "Block
    floor"): where more samples chose to skip, the skippers whose skip was the least decided (the smallest gap
    between the skip's priced probability and the best computing option's) take that computing option. On the
    device, without a read on the host: the number to move is a tensor, compared with each skipper's rank."""
    b = len(choice)
    skipping = choice == skip_k
    others = p.detach().clone()
    others[:, skip_k] = -1.0  # below any probability: the best computing option
    best, alt = others.max(dim=1)
    gap = torch.where(skipping, p.detach()[:, skip_k] - best, torch.full_like(best, float("inf")))
    rank = torch.empty_like(choice)
    rank[torch.argsort(gap, stable=True)] = torch.arange(b, device=choice.device)
    excess = skipping.sum() - (b - math.ceil(floor * b))
    return torch.where(skipping & (rank < excess), alt, choice)


@dataclass
class GateTrace:
    """One forward's gate decisions: masks (B, L, K) with straight-through gradients, hard choices (B, L), the
    priced probabilities (B, L, K) and the gate's own logits before the price (B, L, K; detached)."""

    masks: torch.Tensor
    choices: torch.Tensor
    probs: torch.Tensor
    logits: torch.Tensor | None = None


def option_kappa(options: list[Precision]) -> torch.Tensor:
    """kappa_k = (a w + g w + a g) / 1024: effective MACs of the three passes per MAC, relative to one 32x32
    MAC (0 for skip; ``Precision.bitops_per_mac``, methods.md §6.4)."""
    return torch.tensor([o.bitops_per_mac() / 1024.0 for o in options], dtype=torch.float64)


def per_block(kappa: torch.Tensor, blocks: int) -> torch.Tensor:
    """``kappa`` as one cost per block and option, (L, K): a per-option (K,) one repeated for every block."""
    return kappa.expand(blocks, -1) if kappa.dim() == 1 else kappa


def kappa_of(kappa: torch.Tensor, choices: torch.Tensor) -> torch.Tensor:
    """The cost of each choice, shaped like ``choices`` (..., L); ``kappa`` (K,) or (L, K)."""
    k = per_block(kappa.to(choices.device), choices.shape[-1])
    return k[torch.arange(k.shape[0], device=choices.device), choices]


def normalised_cost(kappa: torch.Tensor, omega: torch.Tensor, computing: torch.Tensor | None = None) -> torch.Tensor:
    """c_lk = (omega_l / mean omega) (kappa_lk / mean kappa of the computing options): (L, K), about 1 for a
    typical option; the unit of the dual controller's price (methods.md §6.5). ``computing`` (K,) bool marks the
    options that compute a block (default: those with a non-zero cost)."""
    k = per_block(kappa, len(omega))
    cells = k[:, computing] if computing is not None else k
    cells = cells[cells > 0]
    scale = cells.mean() if len(cells) else torch.tensor(1.0, dtype=kappa.dtype)
    return (omega / omega.mean()).view(-1, 1).to(kappa.dtype) * (k / scale)


def cost_per_sample(trace: GateTrace, kappa: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """c_i = sum_l omega_l sum_k m_ilk kappa_lk / mean(omega), differentiable through the masks: (B,)."""
    om = omega.to(trace.masks)
    k = per_block(kappa.to(trace.masks), trace.masks.shape[1])
    return torch.einsum("blk,lk,l->b", trace.masks, k, om) / om.mean()


def ada_beta_scale(cost: torch.Tensor, beta: float, ce: torch.Tensor) -> torch.Tensor:
    """The reference's ``--ada_beta``: where the cost term's size ``beta * cost`` exceeds a tenth of the batch's
    CE, the factor that scales it down to that tenth, else 1. Made of detached values, so the term's gradient is
    scaled by the same factor (train_dfq.py, train_frac.py: ``computation_loss *= loss_cls / 10 /
    computation_loss.detach()``)."""
    size, cap = beta * cost.detach(), ce.detach().to(cost.dtype) / 10
    return torch.where(size > cap, cap / size, torch.ones_like(size))


def cp_at_prices(logits: torch.Tensor, prices: torch.Tensor, option_cost: torch.Tensor, kappa: torch.Tensor,
                 omega: torch.Tensor) -> torch.Tensor:
    """The gated cp a batch would have at each candidate price, its logits held fixed: (P,) for prices (P,).

    The decision at price ``q`` is ``argmax_k (z_lk - q c_lk)`` (ties to the first option, as ``argmax``); for
    fixed logits cp never rises with the price. Exact for the first block; for the later ones it holds their
    logits, which in the network depend on the earlier blocks' decisions, fixed (methods.md §6.5)."""
    z = logits.detach().to(torch.float64)  # (B, L, K)
    c = option_cost.to(z)  # (L, K)
    scored = z.unsqueeze(0) - prices.to(z).view(-1, 1, 1, 1) * c  # (P, B, L, K)
    choices = scored.argmax(-1)  # (P, B, L)
    k = kappa_of(kappa.to(z), choices)
    om = omega.to(z)
    return 100.0 * (k * om).sum((1, 2)) / (3.0 * om.sum() * z.shape[0])


def price_for_target(logits: torch.Tensor, option_cost: torch.Tensor, kappa: torch.Tensor, omega: torch.Tensor,
                     target: float, limit: float, steps: int = 32) -> float:
    """The price that puts this batch's gated cp at ``target`` (logits held fixed): the boundary of the
    monotone step function ``cp_at_prices``, found by a vectorised search over ``[-limit, limit]`` (one grid of
    ``steps`` prices per round, four rounds); +-limit when the target is beyond what the options reach."""
    lo, hi = -limit, limit
    for _ in range(4):
        grid = torch.linspace(lo, hi, steps, dtype=torch.float64)
        cps = cp_at_prices(logits, grid, option_cost, kappa, omega)
        above = (cps > target).nonzero()
        if len(above) == 0:  # even the lowest price keeps cp at or under the target
            return lo if lo == -limit else float(grid[0])
        i = int(above[-1])  # the last price still above the target
        if i == steps - 1:
            return hi
        lo, hi = float(grid[i]), float(grid[i + 1])
    return hi  # the lowest price found at or under the target (within (2 limit) / 31^4 of the boundary)


def gated_cp(choices: torch.Tensor, kappa: torch.Tensor, omega: torch.Tensor) -> float:
    """cp (percent of fp32) over the gated blocks, from hard choices (B, L); the reference's formula."""
    return float(gated_cp_tensor(choices, kappa, omega))


def gated_cp_tensor(choices: torch.Tensor, kappa: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """``gated_cp`` as a float64 scalar on the choices' device: a GPU step reads it with its other values."""
    om = omega.to(choices.device)
    k = kappa_of(kappa, choices)  # (B, L)
    return 100.0 * (k * om).sum() / (3.0 * om.sum() * choices.shape[0])


def sign_dfq(cp: float, target: float, relax: float = 0.0) -> float:
    """DFQ's sign rule: -1 below T - r, +1 at or above T + r, -0.1 / +0.1 inside the relax band."""
    if cp < target - relax:
        return -1.0
    if cp >= target + relax:
        return 1.0
    return 0.1 if cp >= target else -0.1


def sign_tensor(cp: torch.Tensor, target: float, rule: str, band: float) -> torch.Tensor:
    """``sign_dfq`` (rule ``dfq``, ``band`` the relax) or ``sign_fractrain`` of a cp held on the device,
    computed there: the sign weighs the loss before the host reads anything of the step."""
    one, zero = torch.ones_like(cp), torch.zeros_like(cp)
    if rule == "fractrain":
        inside = zero
    else:
        inside = torch.where(cp >= target, 0.1 * one, -0.1 * one)
    return torch.where(cp < target - (0.0 if rule == "fractrain" else band), -one,
                       torch.where(cp >= target + band, one, inside))


def sign_fractrain(cp: float, target: float, band: float = 0.0) -> float:
    """FracTrain's rule: -1 below T, +1 at or above T + band, 0 in between."""
    if cp < target:
        return -1.0
    if cp >= target + band:
        return 1.0
    return 0.0
