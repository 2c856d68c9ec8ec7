"""Precision schedules: manual/auto PFQ, CPT cycles, previews and the precision range test."""

from __future__ import annotations

import math

import pytest

from engine.config.experiment import parse_config
from engine.preview import preview
from engine.run_length import RunLength
from engine.schedules.curves import CPT, AutoPFQ, ManualPFQ, cyclic_bits
from engine.schedules.prt import choose_fw_min
from engine.train import train_and_evaluate
from tests.conftest import ROOT, run_main

DIGITS = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}}


def sched(**kw):
    return parse_config({"schedule": kw}).schedule


def test_manual_pfq_uniform_and_given_switch_points():
    s = ManualPFQ(sched(kind="pfq", mode="manual"), RunLength(100, 10))
    bits = [(s.precision(t).act, s.precision(t).grad) for t in (0, 24, 25, 49, 50, 74, 75, 99)]
    assert bits == [(3, 6), (3, 6), (4, 6), (4, 6), (6, 8), (6, 8), (8, 8), (8, 8)]
    s = ManualPFQ(sched(kind="pfq", mode="manual", fw=[4, 8], bw=[8, 8], switch_at=[0.9]), RunLength(100, 10))
    assert s.precision(89).act == 4 and s.precision(90).act == 8
    assert s.precision(0).weight == 4  # weights follow FW unless weight_bits is set


def test_cpt_cycle_shape_and_occupancy():
    # 3 + 5 (1 - cos(pi t / 10)) / 2 = 3, 3.12, 3.48, 4.03, 4.73, 5.5 (half to even: 6), 6.27, 6.97, 7.52, 7.88
    assert [cyclic_bits(t, 3, 8, 10) for t in range(12)] == [3, 3, 3, 4, 5, 6, 6, 7, 8, 8, 3, 3]
    occupancy = [sum(cyclic_bits(t, 3, 8, 2000) == b for t in range(2000)) / 2000 for b in range(3, 9)]
    assert occupancy == pytest.approx([0.205, 0.164, 0.1305, 0.131, 0.1645, 0.2045], abs=0.001)
    # ceil (the paper's formula) visits fw_min only at the start of each cycle
    assert sum(cyclic_bits(t, 3, 8, 2000, "ceil") == 3 for t in range(2000)) == 1
    s = CPT(sched(kind="cpt", fw_min=2, fw_max=6, bw_min=6, bw_max=10, num_cycles=4), RunLength(400, 10))
    assert s.period == 100 and s.precision(0).act == 2 and s.precision(0).grad == 6 and s.precision(99).grad == 10


def test_cpt_rounds_a_half_as_the_reference_writes_it():
    """2 -> 8 over a 150-iteration cycle: at a third and two thirds of it the exact value is 3.5 and 6.5. The
    reference's ``rint(lo + 0.5 (hi - lo) (1 + cos(pi (t mod T) / T + pi)))`` lands just below both halves in
    double, so it trains at 3 and 6 bits there; ``lo + (hi - lo) (1 - cos(pi t / T)) / 2`` lands just above."""
    assert [cyclic_bits(t, 2, 8, 150) for t in (50, 100)] == [3, 6]
    assert 2 + 6 * (1 - math.cos(math.pi * 50 / 150)) / 2 > 3.5  # the other form would have given 4


def test_cpt_cycles_tile_a_run_that_does_not_divide_evenly():
    # 357 iterations, 4 cycles: floor division (89) would start a fifth cycle at iteration 356, at 3 bits
    s = CPT(sched(kind="cpt", fw_min=3, fw_max=8, num_cycles=4), RunLength(357, 10))
    bits = [s.precision(t).act for t in range(357)]
    starts = [t for t in range(1, 357) if bits[t] < bits[t - 1]]
    assert len(starts) == 3 and bits[0] == 3 and bits[-1] == 8  # four cycles, the run ends at the top
    assert all(bits[t] == 3 for t in [0, *starts])


def test_cpt_needs_at_least_one_iteration_per_cycle():
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="schedule.num_cycles: got 32; allowed: <= the run's 20 iterations"):
        CPT(sched(kind="cpt"), RunLength(20, 10))


@pytest.mark.slow
def test_preview_cpt_3to8_matches_the_spec():
    code, text, out = run_main("schedule", str(ROOT / "examples" / "cpt_3to8.yaml"), "--json")
    assert code == 0, text
    assert out["iterations"] == 64000
    assert out["cost_ratio_vs_fp32"] == pytest.approx(0.03958, abs=0.00005)
    assert out["savings_vs_fw8bw8"] == pytest.approx(0.367, abs=0.001)
    assert out["mean_bw_bits"] == 8.0 and out["mean_fw_bits"] == pytest.approx(5.5, abs=0.01)


def test_preview_of_static_and_pfq():
    cfg = parse_config({**DIGITS, "optim": {"iterations": 1000}, "schedule": {"kind": "static", "fw": 8, "bw": 8}})
    assert preview(cfg)["cost_ratio_vs_fw8bw8"] == pytest.approx(1.0)
    pfq = parse_config({**DIGITS, "optim": {"iterations": 1000}, "schedule": {"kind": "pfq"}})
    out = preview(pfq)
    expected = sum((a * a + 2 * a * g) / 3072 for a, g in zip([3, 4, 6, 8], [6, 6, 8, 8])) / 4
    assert out["cost_ratio_vs_fp32"] == pytest.approx(expected) and out["deterministic"] is False


def test_auto_pfq_switches_at_turning_points_and_can_be_forced():
    cfg = sched(kind="pfq", eval_every=2, epsilon=0.5, alpha=1.0)
    s = AutoPFQ(cfg, RunLength(1000, 10))
    for t in range(9):
        assert s.precision(t).act == 3
        s.observe(t, 1.0)
    s.observe(9, 1.0)  # the fifth window ends at iteration 9: turning point, new stage from iteration 10
    assert s.precision(10).act == 4 and s.events[-1]["reason"] == "turning point" and s.events[-1]["iteration"] == 10
    forced = AutoPFQ(sched(kind="pfq", force_final_at=0.5), RunLength(100, 10))
    assert forced.precision(49).act == 3 and forced.precision(50).act == 8
    assert forced.events[-1]["reason"] == "forced" and forced.events[-1]["stage"] == 3


def test_choose_fw_min():
    fw_min, gains = choose_fw_min({2: 0.10, 3: 0.11, 4: 0.35, 5: 0.40}, threshold=0.05)
    assert fw_min == 4 and gains[4] == pytest.approx(0.24)
    assert choose_fw_min({2: 0.5, 3: 0.51}, threshold=0.05)[0] == 2  # no jump: the lowest trains already


@pytest.mark.slow
def test_auto_pfq_run_resumes_with_its_indicator(tmp_path):
    cfg = parse_config({**DIGITS, "optim": {"epochs": 3},
                        "schedule": {"kind": "pfq", "eval_every": 3, "epsilon": 0.3, "alpha": 0.8}})
    saved = {}
    full = train_and_evaluate(cfg, report=lambda m, save: saved.setdefault(m["epoch"], save(tmp_path / str(m["epoch"]))))
    resumed = train_and_evaluate(cfg, resume_from=tmp_path / "1")
    assert [h["stage"] for h in resumed.history] == [h["stage"] for h in full.history]
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]
    assert full.metrics["events"] == resumed.metrics["events"]


def test_cpt_with_auto_fw_min_runs_the_range_test():
    cfg = parse_config({**DIGITS, "optim": {"epochs": 2},
                        "schedule": {"kind": "cpt", "fw_min": "auto", "num_cycles": 2,
                                     "prt": {"candidates": [2, 4, 6], "iterations_per_bit": 10, "window": 5}}})
    r = train_and_evaluate(cfg)
    prt = r.metrics["prt"]
    assert prt["fw_min"] in (2, 4, 6) and prt["iterations"] == 30 and set(prt["accuracies"]) == {"2", "4", "6"}
    assert {h["cpt_fw_min"] for h in r.history} == {float(prt["fw_min"])}
    assert r.metrics["train_bitops"] > 0


@pytest.mark.parametrize("total", [357, 3564, 64000])
def test_eval_windows_splits_a_run_of_any_length_into_the_same_number_of_windows(total):
    """``eval_windows: 160`` reads the reference's 160 windows (of 400 iterations in 64,000) in any run: the
    indicator sees a window's loss every total // 160 iterations, and FracTrain's staging the same."""
    from engine.schedules.indicator import Staging

    cfg = sched(kind="fractrain", eval_windows=160)
    staging = Staging(cfg, cfg.num_turning_points, RunLength(total, 100), lambda st: {})
    seen = []
    staging.indicator.update = lambda loss: seen.append(loss) and False
    for it in range(total):
        staging.observe(it, float(it))
    assert 160 <= len(seen) < 160 + 160 * 160 / total + 1  # the remainder of total // 160 adds windows at most
    assert seen[0] == pytest.approx(sum(range(total // 160)) / (total // 160))  # the first window's mean loss
    with pytest.raises(Exception, match="eval_windows or eval_every"):
        sched(kind="pfq", eval_windows=10, eval_every=30)
    # a resolved config's dump holds the defaults beside eval_windows: it parses back to the same config
    resolved = parse_config({"schedule": {"kind": "fractrain", "eval_windows": 160}})
    assert parse_config(resolved.to_dict()) == resolved
