"""Hardware cost models by hand (engine/cost/cost_models.py; docs/methods.md §10)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from engine.config.experiment import parse_config
from engine.cost.bitops import BitOpsCounter, CostTotals
from engine.cost.cost_models import (
    FP32_MAC_PJ,
    build_models,
    energy_mac_pj,
    int_mult_pj,
    int_units_mac,
    load_cost_table,
    parse_cost_table,
)
from engine.errors import ConfigError
from engine.models import LayerMap, build_model
from engine.models.base import LayerInfo
from engine.numerics.precision import FP32, SKIP, Precision
from engine.schedules.curves import cyclic_bits

# the CIFAR stem: 3x3 conv 3->16 on 32x32, stride 1, pad 1
CONV = LayerInfo("conv", "body", 0, 442_368, weights=432, inputs=3072, outputs=16_384)
M = 442_368
P = Precision(act=4, weight=6, grad=8)  # FW (4, 6), EB (8, 6), GC (4, 8)


def one_conv(table=None) -> BitOpsCounter:
    return BitOpsCounter([CONV], LayerMap(), build_models(table=table))


def test_one_conv_under_every_model_by_hand():
    c = one_conv()
    got = c.costs(P, 10)
    assert got["bitops"] == 10 * M * (4 * 6 + 8 * 6 + 4 * 8) == 460_062_720  # the papers' BitOPs, an exact int
    assert got["bitops"] == 10 * c.per_sample(P)
    assert got["macs"] == 10 * 3 * M == 13_271_040
    # int_units: 4 -> 4, 6 -> 8, 8 -> 8: FW 4*8, EB 8*8, GC 4*8 = 128 per MAC
    assert got["int_units"] == 10 * M * 128 == 566_231_040
    # energy: each MAC an integer multiply (0.2 pJ * (x*y/64)^p, p = ln 15.5 / ln 16) + a 0.1 pJ int32 add
    p = math.log(15.5) / math.log(16)
    per_mac = sum(0.2 * (xy / 64) ** p + 0.1 for xy in (24, 48, 32))
    assert got["energy"] == pytest.approx(10 * M * per_mac, rel=1e-12)
    # by hand: 0.2 * (0.375^0.98855 + 0.75^0.98855 + 0.5^0.98855) + 3 * 0.1 = 0.07585 + 0.15050 + 0.10079 + 0.3
    assert per_mac == pytest.approx(0.62714, abs=1e-4)
    # memory: per sample 3072 inputs read twice at 4 bits + 16384 errors read twice at 8 bits = 35,840 bytes;
    # per iteration 432 weights read twice at 6 bits + their gradient written at 32 = 2,376 bytes
    assert got["memory"] == 10 * 35_840 + 2_376 == 360_776


def test_energy_anchors_are_horowitz_table_values():
    assert int_mult_pj(8, 8) == pytest.approx(0.2)
    assert int_mult_pj(32, 32) == pytest.approx(3.1)
    assert energy_mac_pj(8, 8) == pytest.approx(0.3)
    assert energy_mac_pj(32, 8) == FP32_MAC_PJ == pytest.approx(4.6)
    c = one_conv()
    assert c.costs(Precision.fwbw(8, 8), 1)["energy"] == pytest.approx(3 * 0.3 * M)  # 398,131.2 pJ
    assert c.costs(FP32, 1)["energy"] == pytest.approx(3 * 4.6 * M)
    assert energy_mac_pj(4, 4) < energy_mac_pj(4, 8) < energy_mac_pj(8, 8) < energy_mac_pj(16, 16)


def test_int_units_rounding_and_fp32():
    assert int_units_mac(3, 6) == 4 * 8
    assert int_units_mac(9, 8) == 16 * 8
    assert int_units_mac(17, 4) == 1024  # the 32-bit unit
    assert int_units_mac(32, 4) == 1024  # an fp32 operand: FP32 priced as FP32
    assert int_units_mac(12, 4, widths=(4, 8)) == 1024  # wider than every unit: the FP32 unit
    assert one_conv().costs(SKIP, 5) == {"bitops": 0, "macs": 0, "int_units": 0, "energy": 0, "memory": 0}


def resnet38(stem=True, fc=True) -> BitOpsCounter:
    table = build_model("resnet38", 3, 10).layer_table((3, 32, 32))
    return BitOpsCounter(table, LayerMap(stem=stem, fc=fc))


def ratio(counter: BitOpsCounter, series: list[Precision], model: str) -> float:
    run = math.fsum(n * counter.costs(p, 1)[model] for p, n in Counter(series).items())
    return run / (len(series) * counter.costs(FP32, 1)[model])


def test_bitops_unchanged_and_int_units_do_not_reward_odd_widths():
    c = resnet38()
    fw8 = Precision.fwbw(8, 8)
    assert c.costs(fw8, 1)["bitops"] / c.costs(FP32, 1)["bitops"] == 0.0625  # the ResNet-38 FW8/BW8 ratio
    # static FW6/BW8: cheaper than FW8/BW8 in BitOPs, the same on 8-bit integer units
    fw6 = Precision.fwbw(6, 8)
    assert c.costs(fw6, 1)["bitops"] < c.costs(fw8, 1)["bitops"]
    assert c.costs(fw6, 1)["int_units"] == c.costs(fw8, 1)["int_units"]
    # CPT 3 -> 8 (BW8, rint, 32 cycles of examples/cpt_3to8.yaml's 64,000 iterations): 36.7 % below FW8/BW8
    # in BitOPs, far less on integer units (3 and 4 bits run on 4-bit units, 5..8 bits on 8-bit units)
    total = 64_000
    series = [Precision.fwbw(cyclic_bits(t, 3, 8, total / 32), 8) for t in range(total)]
    ref = ratio(c, [fw8], "bitops")
    bitops_saving = 1 - ratio(c, series, "bitops") / ref
    int_saving = 1 - ratio(c, series, "int_units") / ratio(c, [fw8], "int_units")
    assert bitops_saving == pytest.approx(0.367, abs=0.002)
    assert 0 < int_saving < bitops_saving - 0.1
    # under energy the 3- and 4-bit iterations save, but the int32 accumulate is paid at every width
    energy_saving = 1 - ratio(c, series, "energy") / ratio(c, [fw8], "energy")
    assert 0 < energy_saving < bitops_saving


USER = {"name": "myaccel", "unit": "pJ", "fp32": 5.0, "costs": {"4x4": 0.1, "4x8": 0.15, "8x8": 0.25, "16x16": 1.0}}


def test_user_table_prices_pairs_and_rounds_up(tmp_path):
    table = parse_cost_table(USER)
    assert table.mac(4, 4) == 0.1
    assert table.mac(8, 3) == 0.15  # unordered pair, rounded up to 4x8
    assert table.mac(6, 6) == 0.25
    assert table.mac(17, 4) == 5.0  # no listed pair that wide: the fp32 price
    assert table.mac(32, 4) == 5.0
    c = one_conv(table)
    assert c.costs(P, 1)["table:myaccel"] == pytest.approx(M * (0.15 + 0.25 + 0.15))  # FW 4x6 -> 4x8, EB 8x6 -> 8x8, GC 4x8
    path = tmp_path / "t.yaml"
    path.write_text("name: myaccel\nfp32: 5\ncosts: {'8x8': 0.25}\n")
    assert load_cost_table(path).costs == {(8, 8): 0.25}


@pytest.mark.parametrize("tree,needle", [
    ({**USER, "costs": {"4x40": 0.1}}, "costs.4x40"),
    ({**USER, "costs": {"abc": 0.1}}, "costs.abc"),
    ({**USER, "costs": {"4x4": -1}}, "costs.4x4"),
    ({**USER, "costs": {"4x4": "cheap"}}, "costs.4x4"),
    ({k: v for k, v in USER.items() if k != "fp32"}, "fp32"),
    ({**USER, "colour": "red"}, "colour"),
    ({**USER, "costs": {}}, "costs"),
    ([1, 2], "expected a mapping"),
    ({**USER, "name": "n" * 65}, "name: got 'nnn"),  # a metric key holds it: MLflow's keys stop at 250
    ({**USER, "name": "ñandú"}, "name: got 'ñandú'; allowed: 1 to 64 ASCII letters"),
])
def test_user_table_errors_are_one_line(tree, needle):
    with pytest.raises(ConfigError) as err:
        parse_cost_table(tree)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_config_cost_section(tmp_path):
    path = tmp_path / "accel.yaml"
    path.write_text("name: acc\nfp32: 4\ncosts: {'8x8': 0.3}\n")
    cfg = parse_config({"cost": {"table": str(path), "int_widths": [2, 8, 32]}})
    names = [m.name for m in cfg.cost.models()]
    assert names == ["bitops", "macs", "int_units", "energy", "memory", "table:acc"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("fp32: 4\ncosts: {'8x99': 0.3}\n")
    with pytest.raises(ConfigError, match="8x99"):
        parse_config({"cost": {"table": str(bad)}})
    with pytest.raises(ConfigError, match="int_widths"):
        parse_config({"cost": {"int_widths": [8, 4]}})


def test_totals_per_model_merge_and_state():
    c = one_conv()
    t, epoch = CostTotals(), CostTotals()
    for _ in range(3):
        epoch.add_costs(c.costs(Precision.fwbw(8, 8), 4), c.costs(FP32, 4), c.costs(Precision.fwbw(8, 8), 4))
    t.merge(epoch)
    s = t.model_summary()
    assert s["bitops"]["savings_vs_fp32"] == pytest.approx(1 - 0.0625)
    assert s["int_units"]["savings_vs_fw8bw8"] == 0.0
    assert s["macs"]["savings_vs_fp32"] == 0.0
    u = CostTotals()
    u.load_state_dict(t.state_dict())
    assert u == t
