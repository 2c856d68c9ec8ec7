"""DFQ's cp controllers (docs/methods.md §6.5): the dual price settles on a synthetic cost process with lag and
noise, the reference keeps its exact bang-bang sign rule, and a price moves a real gate's decisions."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.controller import DualController, ReferenceController, build_controller
from engine.gate import gated_cp, normalised_cost, option_kappa
from engine.models import LayerMap, build_model
from engine.models.gated import GatedModel
from engine.precision import SKIP, Precision
from engine.schedule_config import DFQSchedule, FracTrainSchedule


class LaggedCostProcess:
    """A stand-in for a gated network: its cp falls exponentially with the price, follows a change of price
    with a first-order lag of ``tau`` iterations, drifts (the gate learning to prefer precision) and is
    observed with multiplicative batch noise."""

    def __init__(self, cp_at_zero: float, sensitivity: float, tau: float, drift: float, noise: float, seed: int):
        self.cp0, self.k, self.tau, self.drift, self.noise = cp_at_zero, sensitivity, tau, drift, noise
        self.rng = random.Random(seed)
        self.level = cp_at_zero
        self.t = 0

    def observe(self, price: float) -> float:
        self.t += 1
        wanted = self.cp0 * (1 + self.drift * self.t) * math.exp(-self.k * price)
        self.level += (wanted - self.level) / self.tau
        return self.level * (1 + self.rng.gauss(0, self.noise))


@pytest.mark.parametrize("target", [1.5, 3.0])
@pytest.mark.parametrize("plant", [
    dict(cp_at_zero=2.4, sensitivity=0.5, tau=1.0, drift=0.0, noise=0.05),   # fast, as at the start of training
    dict(cp_at_zero=2.4, sensitivity=0.2, tau=10.0, drift=0.0, noise=0.10),  # sluggish and noisy
    dict(cp_at_zero=4.0, sensitivity=1.0, tau=5.0, drift=1e-3, noise=0.10),  # drifting towards precision
])
def test_dual_controller_settles_within_five_percent(target, plant):
    ctl = DualController(beta=0.128, gain=DFQSchedule().controller_gain)
    proc = LaggedCostProcess(seed=0, **plant)
    cps = []
    for _ in range(1200):
        cp = proc.observe(ctl.price)
        ctl.update(cp, target)
        cps.append(cp)
    settled = sum(cps[-300:]) / 300
    assert abs(settled / target - 1) <= 0.05
    worst_window = max(abs(sum(cps[i:i + 100]) / 100 / target - 1) for i in range(600, 1100, 100))
    assert worst_window <= 0.05  # no oscillation: every later window of 100 iterations is on target too


def test_dual_controller_price_is_bounded_and_resumes():
    ctl = DualController(beta=1.0, gain=0.5, limit=3.0)
    for _ in range(100):
        ctl.update(cp=10.0, target=1.0)  # a target the network can never reach
    assert ctl.price == 3.0 and ctl.weight(10.0, 1.0) == 3.0
    again = DualController(beta=1.0, gain=0.5, limit=3.0)
    again.load_state_dict(ctl.state_dict())
    assert again.price == ctl.price


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
