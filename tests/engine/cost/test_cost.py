"""BitOPs accounting by hand (docs/methods.md §2)."""

from __future__ import annotations

import pytest
import torch

from engine.cost.bitops import BitOpsCounter, CostTotals, layer_cost
from engine.models import LayerMap, build_model
from engine.models.base import LayerInfo, QModel
from engine.numerics.layers import QConv2d
from engine.numerics.precision import FP32, SKIP, Precision


class OneConv(QModel):
    def __init__(self):
        super().__init__()
        self.conv = QConv2d(3, 16, 3, 1, 1, bias=False, role="body", block=0)
        self.blocks = torch.nn.ModuleList()

    def forward(self, x, prec):
        return self.conv(x, prec)


def test_one_conv_by_hand():
    # 3x3 conv 3->16 on 32x32, stride 1, pad 1: M = 16 * 3 * 3 * 3 * 32 * 32 = 442,368 MACs (the CIFAR stem)
    table = OneConv().layer_table((3, 32, 32))
    # weights 16*3*3*3, input 3*32*32, output 16*32*32 elements (the memory model's sizes)
    assert table == [LayerInfo("conv", "body", 0, 442_368, 432, 3072, 16_384)]
    c = layer_cost(442_368, Precision(act=4, weight=6, grad=8))
    assert (c.fw, c.eb, c.gc) == (442_368 * 4 * 6, 442_368 * 8 * 6, 442_368 * 4 * 8)
    counter = BitOpsCounter(table, LayerMap())
    assert counter.fp32_per_sample() == 3 * 442_368 * 32 * 32
    assert counter.per_sample(Precision.fwbw(8, 8)) == 3 * 442_368 * 64
    assert layer_cost(442_368, SKIP).total == 0


def test_resnet38_macs_match_the_architecture():
    model = build_model("resnet38", 3, 10)
    table = model.layer_table((3, 32, 32))
    by_role = {}
    for layer in table:
        by_role[layer.role] = by_role.get(layer.role, 0) + layer.macs
    assert by_role["stem"] == 442_368
    assert by_role["fc"] == 640
    # 16 plain blocks x 4,718,592 + 2 downsampling x 3,670,016, of which their two 1x1 projections 131,072 each
    assert by_role["body"] + by_role["shortcut"] == 82_837_504 and by_role["shortcut"] == 2 * 131_072
    total = sum(x.macs for x in table)
    assert abs(total - 83.28e6) / 83.28e6 < 0.005
    blocks = BitOpsCounter(table, LayerMap()).block_macs()
    assert blocks[0] == 4_718_592 and blocks[6] == 3_670_016 and len(blocks) == 18


def test_layer_map_drives_the_count():
    model = build_model("resnet20", 3, 10)
    table = model.layer_table((3, 32, 32))
    total = sum(x.macs for x in table)
    fc = 640
    stem = 442_368
    all_q = BitOpsCounter(table, LayerMap(stem=True, fc=True))
    assert all_q.per_sample(Precision.fwbw(8, 8)) / all_q.fp32_per_sample() == 0.0625
    ref = BitOpsCounter(table, LayerMap(stem=True, fc=False))  # the static-method reference: FC fp32
    assert ref.per_sample(Precision.fwbw(8, 8)) == 192 * (total - fc) + 3072 * fc
    dfq_like = BitOpsCounter(table, LayerMap(stem=False, fc=False))
    assert dfq_like.per_sample(Precision.fwbw(8, 8)) == 192 * (total - fc - stem) + 3072 * (fc + stem)
    assert ref.per_sample(FP32) == ref.fp32_per_sample() == 3072 * total


def test_mobilenetv2_depthwise_fixed_precision():
    model = build_model("mobilenetv2", 3, 10)
    table = model.layer_table((3, 32, 32))
    dws = sum(x.macs for x in table if x.role == "depthwise")
    assert dws == pytest.approx(11.76e6 / 2, rel=0.01)  # compute_flops.py's table counts 2 x MACs
    conv = sum(x.macs for x in table if x.role in ("body", "shortcut"))
    assert conv == pytest.approx(155.65e6 / 2, rel=0.01)
    lm = LayerMap(stem=True, fc=False, head=True, depthwise=Precision.fwbw(8, 16))
    counter = BitOpsCounter(table, lm)
    per = counter.per_layer(Precision.fwbw(4, 8))
    assert {r["precision"] for r in per if r["role"] == "depthwise"} == {"FW8/BW16"}
    assert {r["precision"] for r in per if r["role"] in ("body", "shortcut")} == {"FW4/BW8"}


def test_cost_totals():
    t = CostTotals()
    t.add(10, 160, 20)
    t.add(10, 160, 20)
    assert t.cp == pytest.approx(100 * 20 / 320)
    assert t.savings_vs_fp32 == pytest.approx(1 - 20 / 320)
    assert t.savings_vs_fw8bw8 == pytest.approx(0.5)
    u = CostTotals()
    u.load_state_dict(t.state_dict())
    assert u == t
