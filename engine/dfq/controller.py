"""DFQ's computation-percentage controllers (docs/methods.md §6.5).

The gate picks, per input and block, one of K precision options; a controller keeps the gated cp (the
papers' computation percentage over the gated blocks) at its target ``T``. Each controller gives the gated
model two numbers before every iteration and observes the batch's gated cp after the forward pass:

* ``price`` (nats per unit of normalised cost): the gate decides ``argmax_k (z_lk - price * c_lk)`` where
  ``z`` are its logits and ``c_lk = (omega_l / mean omega) (kappa_k / mean kappa)`` the option's normalised
  cost in block ``l``; the straight-through mask uses the softmax of the same priced logits.
* ``weight(cp)``: the coefficient of the per-sample cost term in the loss, ``loss = CE + weight * mean_i c_i``.

``reference`` (the papers' code, FracTrain eq. 2): price 0 and ``weight = s * beta`` with the sign ``s`` of the
current batch's cp against T, the bang-bang rule (DFQ: -1 below T - relax, +1 at or above T + relax, +-0.1 in
the band; FracTrain: -1 below T, +1 at or above T + band, 0 between). cp oscillates around T, and when the
gate's logits move slowly (a low learning rate, a weak CE signal) it swings far from T for whole epochs.

``dual`` (the default): the price is a Lagrange multiplier of the constraint ``cp = T``, used in the decision
(so cp responds to it at once, whatever the learning rate; for fixed logits a higher price never raises cp)
and, scaled by ``beta``, as the cost term's weight (so the gate learns the trade-off the price expresses).
The price is the sum of two states. ``base`` moves, after every iteration, a fraction ``rate`` of the way to
the price that would have put that batch exactly on target with its logits held fixed
(``engine.dfq.gate.price_for_target``, a search over the monotone step function cp(price)); ``offset`` integrates
``gain`` times the batch's relative cp error, which cancels what the fixed-logits model misses (later blocks'
logits depend on earlier decisions), so the mean error over a span goes to zero. Solving for the batch's own price
makes the step size independent of how sharply cp reacts to the price: a gate indifferent between options
(cp jumping with tiny price changes) and a confident one (cp barely moving) are both tracked, where a fixed
gain on the error alone oscillates on the first or lags on the second.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from engine.dfq.gate import sign_dfq, sign_fractrain, sign_tensor

PRICE_LIMIT = 50.0  # nats: far beyond any logit gap the gate produces; a bound that keeps a runaway finite


class ReferenceController:
    """The reference's sign-flipping cost term (FracTrain eq. 2, as the reference code has it)."""

    kind = "reference"

    def __init__(self, beta: float, rule: str, band: float):
        self.beta, self.rule, self.band = beta, rule, band
        self.price = 0.0
        self.last_sign = 0.0

    def weight(self, cp: float, target: float) -> float:
        s = sign_fractrain(cp, target, self.band) if self.rule == "fractrain" else sign_dfq(cp, target, self.band)
        self.last_sign = s
        return s * self.beta

    def loss_weight(self, cp: torch.Tensor, target: float) -> torch.Tensor:
        """``weight`` of a cp still on the device, computed there (``weight`` of the value read records the sign)."""
        return sign_tensor(cp, target, self.rule, self.band) * self.beta

    def update(self, cp: float, target: float, batch_price: Callable[[], float] | None = None) -> None:
        """Nothing to learn: the sign is recomputed from every batch."""

    def state_dict(self) -> dict:
        return {"kind": self.kind}

    def load_state_dict(self, state: dict) -> None:
        pass


class DualController:
    """The price as a Lagrange multiplier (module docstring), the sum of two states: ``base``, which moves a
    fraction ``rate`` of the way to the price that would have put each batch on target (its logits held
    fixed), and ``offset``, the integral of the relative cp error scaled by ``gain`` (it cancels whatever the
    fixed-logits model misses, so the mean error over a span goes to zero)."""

    kind = "dual"

    def __init__(self, beta: float, rate: float, gain: float, limit: float = PRICE_LIMIT):
        self.beta, self.rate, self.gain, self.limit = beta, rate, gain, limit
        self.base = 0.0
        self.offset = 0.0
        self.price = 0.0
        self.last_sign = 0.0

    def weight(self, cp: float, target: float) -> float:  # noqa: ARG002  (the price already holds the error)
        self.last_sign = math.copysign(1.0, self.price) if self.price else 0.0
        return self.beta * self.price

    def loss_weight(self, cp: torch.Tensor, target: float) -> float:  # noqa: ARG002
        """The price is known before the step: the weight needs nothing of the device."""
        return self.beta * self.price

    def update(self, cp: float, target: float, batch_price: Callable[[], float] | None = None) -> None:
        if batch_price is not None:
            self.base += self.rate * (batch_price() - self.base)
        lim = self.limit
        self.offset = max(-2 * lim, min(2 * lim, self.offset + self.gain * (cp / target - 1.0)))  # anti-windup
        self.price = max(-lim, min(lim, self.base + self.offset))

    def state_dict(self) -> dict:
        return {"kind": self.kind, "price": self.price, "base": self.base, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.price = float(state["price"])
        self.base = float(state.get("base", 0.0))
        self.offset = float(state.get("offset", self.price - self.base))


def build_controller(sched):
    """The controller a DFQ / FracTrain schedule config asks for."""
    rule = "fractrain" if sched.kind == "fractrain" else "dfq"
    if sched.controller == "reference":
        return ReferenceController(sched.beta, rule, sched.band if rule == "fractrain" else sched.relax)
    return DualController(sched.beta, sched.controller_rate, sched.controller_gain)
