"""A gated config's cp targets checked on the built network before any run (engine.dfq.reach): where the config
alone cannot decide, validate and a sweep's checks refuse what training would refuse, and accept what it runs."""

from __future__ import annotations

import pytest

from engine.config.experiment import parse_config, target_undecided
from engine.errors import ConfigError
from engine.reach import exact_target_problems, parse_checked


def config(model="resnet38", dataset="cifar10", options="paper", **schedule):
    return parse_config({"model": {"name": model}, "data": {"dataset": dataset},
                         "schedule": {"kind": "dfq", "options": options, "weight_bits": 4, **schedule}})


def test_the_config_alone_decides_between_the_cheapest_and_the_dearest_computing_option():
    # paper options at 4-bit weights: 2/6 is the cheapest computing option, at 1.432 % of FP32
    assert not target_undecided(config(target_cp=1.5))
    assert not target_undecided(config(target_cp=4.6))
    assert target_undecided(config(target_cp=1.0))  # only skips reach it, at what their paths cost
    assert target_undecided(config(target_cp=3.0, cost_basis="model"))  # the whole model: only the network says
    assert not target_undecided(parse_config({"schedule": {"kind": "static"}}))


def test_a_target_only_skips_reach_is_checked_on_the_built_network():
    # most of ResNet-38's skips are identities, which cost nothing, so low targets are reachable; ResNet-8 has
    # few blocks, and a downsampling block's skip runs an fp32 projection: its floor is near 1 %
    assert exact_target_problems(config(target_cp=0.5)) == []
    [(field, value, allowed)] = exact_target_problems(config("resnet8", "fashion-mnist", target_cp=0.5))
    assert (field, value) == ("schedule.target_cp", 0.5) and allowed.startswith("allowed: 0.955..4.688")
    with pytest.raises(ConfigError, match=r"schedule\.target_cp: got 0\.5; allowed: 0\.955"):
        parse_checked({"model": {"name": "resnet8"}, "data": {"dataset": "fashion-mnist"},
                       "schedule": {"kind": "dfq", "options": "paper", "weight_bits": 4, "target_cp": 0.5}})


def test_mobilenetv2s_targets_are_checked_with_its_depthwise_convs_at_their_bits():
    """Every option's cost over MobileNetV2's blocks includes their depthwise convs at the fixed 8/8/16, so its
    reach is not the options' own: a target beyond the dearest option's cp alone is reachable, one above the
    cheapest's alone may not be, and only the network tells (methods.md §6.4)."""
    mbv2 = dict(model="mobilenetv2", options="reference")
    assert target_undecided(config(target_cp=3.0, **mbv2))
    assert exact_target_problems(config(target_cp=5.0, **mbv2)) == []  # 6/12 alone: 4.688 %
    [(field, value, allowed)] = exact_target_problems(config(target_cp=2.0, **mbv2))  # 3/6 alone: 1.758 %
    assert (field, value) == ("schedule.target_cp", 2.0) and allowed.startswith("allowed: 2.366..5.090")


def test_fractrain_stage_targets_and_the_model_basis_are_checked_alike():
    bad = parse_config({"model": {"name": "resnet8"}, "data": {"dataset": "fashion-mnist"},
                        "schedule": {"kind": "fractrain", "options": "paper", "weight_bits": 4, "cp0": 0.5,
                                     "cp_step": 0.5}})
    [(field, _, allowed)] = exact_target_problems(bad)
    assert field == "schedule.cp0" and "[0.5]" in allowed  # the first stage's target; 1.0 onwards reachable
    lo, hi = 2.184, 5.953  # resnet8 on the whole model: the fp32 stem and FC are always paid
    assert exact_target_problems(config("resnet8", "fashion-mnist", target_cp=3.0, cost_basis="model")) == []
    [(_, _, allowed)] = exact_target_problems(config("resnet8", "fashion-mnist", target_cp=2.0, cost_basis="model"))
    assert allowed.startswith(f"allowed: {lo:.3f}..{hi:.3f}")
