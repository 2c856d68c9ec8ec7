"""DFQ's cp controllers (docs/methods.md §6.5): the dual price settles on a synthetic cost process with lag and
noise, the reference keeps its exact bang-bang sign rule, and a price moves a real gate's decisions."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.config.gated_schedule import DFQSchedule, FracTrainSchedule
from engine.dfq.controller import DualController, ReferenceController, build_controller
from engine.dfq.gate import gated_cp, normalised_cost, option_kappa
from engine.dfq.gated import GatedModel
from engine.models import LayerMap, build_model
from engine.numerics.precision import SKIP, Precision


class GateLikeProcess:
    """A stand-in for a gated network. Each batch's gated cp is a logistic step down in the price,
    ``cp(q) = cp_max / (1 + exp(k (q - b)))``: ``k`` is how sharply the gate's choices react to the price
    (large: an indifferent gate), ``b`` the gate's learned preference. The preference drifts towards precision
    (``drift`` per iteration) and, with a lag of ``tau`` iterations, learns the price the cost term teaches
    it; every batch adds noise to it. ``solve`` answers the controller's question (the price that would have
    put this batch on target) from a model that is off by ``mismatch`` nats, as holding later blocks' logits
    fixed is."""

    def __init__(self, k: float, tau: float, drift: float, noise: float, mismatch: float, seed: int,
                 cp_max: float = 4.69):
        self.k, self.tau, self.drift, self.noise, self.mismatch, self.cp_max = k, tau, drift, noise, mismatch, cp_max
        self.rng = random.Random(seed)
        self.b = 0.0

    def cp(self, price: float, b: float) -> float:
        return self.cp_max / (1.0 + math.exp(max(-60.0, min(60.0, self.k * (price - b)))))

    def batch(self, price: float, target: float) -> tuple[float, float]:
        """(the batch's cp at ``price``, the price the controller is told would have put it on target)."""
        self.b += self.drift - 0.2 * price / self.tau  # drift, and the cost term's pull
        b = self.b + self.rng.gauss(0.0, self.noise)
        solved = b + self.mismatch + math.log(self.cp_max / target - 1.0) / self.k
        return self.cp(price, b), solved


def run_controller(ctl, proc: GateLikeProcess, target: float, iterations: int = 1200) -> list[float]:
    cps = []
    for _ in range(iterations):
        cp, solved = proc.batch(ctl.price, target)
        ctl.update(cp, target, lambda solved=solved: solved)
        cps.append(cp)
    return cps


PLANTS = [
    dict(k=2.0, tau=20.0, drift=0.0, noise=0.1, mismatch=0.0),   # a confident gate, noisy batches
    dict(k=50.0, tau=20.0, drift=0.0, noise=0.02, mismatch=0.0),  # an indifferent gate: cp jumps with the price
    dict(k=2.0, tau=5.0, drift=0.01, noise=0.1, mismatch=0.3),    # drifting to precision, a biased model
    dict(k=10.0, tau=50.0, drift=0.005, noise=0.05, mismatch=-0.5),  # slow learning, the other bias
]


@pytest.mark.parametrize("target", [1.5, 3.0])
@pytest.mark.parametrize("plant", PLANTS)
def test_dual_controller_settles_within_five_percent(target, plant):
    d = DFQSchedule()
    ctl = DualController(beta=0.128, rate=d.controller_rate, gain=d.controller_gain)
    cps = run_controller(ctl, GateLikeProcess(seed=0, **plant), target)
    settled = sum(cps[-300:]) / 300
    assert abs(settled / target - 1) <= 0.05
    windows = [abs(sum(cps[i:i + 100]) / 100 / target - 1) for i in range(120, 1100, 100)]
    assert max(windows) <= 0.05  # after the first 10 % of iterations, every window of 100 is on target


def test_an_error_only_integral_controller_lags_a_drifting_gate_where_the_dual_one_holds():
    """The design's reason: a fixed gain on the error alone has to be small to stay quiet on noisy batches,
    and then it lags a gate that drifts towards precision; solving for the batch's price follows the drift."""
    drifting = PLANTS[3]
    lagging = run_controller(DualController(beta=0.128, rate=0.0, gain=0.02), GateLikeProcess(seed=0, **drifting), 3.0)
    assert max(abs(sum(lagging[i:i + 100]) / 100 / 3.0 - 1) for i in range(120, 1100, 100)) > 0.1
    d = DFQSchedule()
    held = run_controller(DualController(beta=0.128, rate=d.controller_rate, gain=0.02),
                          GateLikeProcess(seed=0, **drifting), 3.0)
    assert max(abs(sum(held[i:i + 100]) / 100 / 3.0 - 1) for i in range(120, 1100, 100)) <= 0.05


def test_dual_controller_price_is_bounded_and_resumes():
    ctl = DualController(beta=1.0, rate=0.2, gain=0.5, limit=3.0)
    for _ in range(100):
        ctl.update(cp=10.0, target=1.0, batch_price=lambda: 1e6)  # a target the network can never reach
    assert ctl.price == 3.0 and ctl.weight(10.0, 1.0) == 3.0
    assert ctl.offset <= 6.0  # anti-windup: the integral stops at twice the limit
    again = DualController(beta=1.0, rate=0.2, gain=0.5, limit=3.0)
    again.load_state_dict(ctl.state_dict())
    assert (again.price, again.base, again.offset) == (ctl.price, ctl.base, ctl.offset)


def test_reference_controller_keeps_the_sign_rules():
    dfq = ReferenceController(beta=0.128, rule="dfq", band=0.5)
    assert [dfq.weight(c, 3.0) for c in (2.4, 2.8, 3.2, 3.6)] == [-0.128, -0.128 * 0.1, 0.128 * 0.1, 0.128]
    plain = ReferenceController(beta=0.128, rule="dfq", band=0.0)
    assert [plain.weight(c, 3.0) for c in (2.99, 3.0, 3.01)] == [-0.128, 0.128, 0.128]
    frac = ReferenceController(beta=0.128, rule="fractrain", band=0.5)
    assert [frac.weight(c, 3.0) for c in (2.9, 3.2, 3.5)] == [-0.128, 0.0, 0.128]
    for _ in range(10):
        frac.update(5.0, 3.0)
    assert frac.price == 0.0  # the reference never prices the decision
    assert isinstance(build_controller(DFQSchedule(controller="reference")), ReferenceController)
    assert isinstance(build_controller(FracTrainSchedule()), DualController)


def test_a_price_moves_a_real_gate_towards_cheaper_options():
    torch.manual_seed(0)
    options = [SKIP, Precision.fwbw(2, 6, 4), Precision.fwbw(4, 8, 4), Precision.fwbw(6, 12, 4)]
    backbone = build_model("tiny", 1, 10)
    backbone.set_layer_map(LayerMap(stem=False, fc=False, head=False))
    model = GatedModel(backbone, options, "routed").eval()
    kappa, omega = option_kappa(options), torch.ones(2, dtype=torch.float64)
    model.set_option_cost(normalised_cost(kappa, omega))
    x = torch.randn(64, 1, 8, 8)
    cps = []
    with torch.no_grad():
        for price in (-20.0, -2.0, 0.0, 2.0, 20.0):
            model.set_price(price)
            cps.append(gated_cp(model(x)[1].choices, kappa, omega))
    assert cps == sorted(cps, reverse=True)  # a higher price never raises cp
    assert cps[0] == pytest.approx(100 * kappa[3].item() / 3) and cps[-1] == 0.0  # the extremes: 6/12, skip


def test_price_for_target_finds_the_boundary_of_the_batch_cp_step_function():
    """cp_at_prices at price 0 is the batch's argmax cp; price_for_target returns a price at which the batch is
    at or under the target while a slightly lower price is above it (methods.md §6.5)."""
    from engine.dfq.gate import cp_at_prices, price_for_target

    g = torch.Generator().manual_seed(0)
    options = [SKIP, Precision(act=4, weight=4, grad=8), Precision(act=6, weight=6, grad=8),
               Precision(act=8, weight=8, grad=8)]
    kappa = option_kappa(options)
    omega = torch.ones(5, dtype=torch.float64)
    cost = normalised_cost(kappa, omega)
    logits = torch.randn(64, 5, len(options), generator=g)
    at_zero = float(cp_at_prices(logits, torch.zeros(1), cost, kappa, omega)[0])
    assert at_zero == pytest.approx(gated_cp(logits.argmax(-1), kappa, omega))
    for target in (0.5, 1.5, 3.0):
        q = price_for_target(logits, cost, kappa, omega, target, limit=20.0)
        below, above = cp_at_prices(logits, torch.tensor([q + 1e-6, q - 1e-3]), cost, kappa, omega).tolist()
        assert below <= target < above
    assert price_for_target(logits, cost, kappa, omega, 100.0, limit=20.0) == -20.0  # beyond every option's reach
