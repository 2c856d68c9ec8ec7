"""results.summary: a sweep's methods from its rows (labels, means, savings), the papers' trends under the rule
the page states, the interpolated static front, and logged configs read as their engine ran them."""

from __future__ import annotations

import statistics

import pytest

from engine.config.experiment import parse_config
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.objectives import PERPLEXITY_OBJECTIVE as PPL
from results.summary import as_logged, comparable, method_label, split_seeds, summarise, trends
from tests.results.rows import config_of, row


def _label(schedule: dict) -> str:
    return method_label({"schedule": schedule}, config_of({"schedule": schedule}))


def test_labels_name_each_method_with_the_engines_values():
    assert _label({"kind": "fp32"}) == "FP32"
    assert _label({"kind": "static", "fw": 6, "bw": 8}) == "FW6/BW8"
    assert _label({"kind": "cpt", "fw_min": 3, "fw_max": 8, "num_cycles": 4}) == "CPT FW3->8/BW8"
    assert _label({"kind": "dfq", "target_cp": 4.0, "execution": "routed"}) == "DFQ cp 4% routed (sampled)"
    assert _label({"kind": "dfq", "target_cp": 3.0, "beta": 1.0, "controller": "reference"}) == \
        "DFQ cp 3% masked reference beta 1"
    assert _label({"kind": "pfq", "mode": "manual", "fw": [3, 8], "bw": [6, 8]}) == "PFQ manual FW3-8/BW6-8"
    # defaults are the engine's, not re-derived here: PFQ's bits, FracTrain's first target (1.5, or from cp_total)
    assert _label({"kind": "pfq"}) == "PFQ auto FW3-4-6-8/BW6-6-8-8"
    assert _label({"kind": "fractrain"}) == "FracTrain cp 1.5+0.5 masked"
    assert _label({"kind": "fractrain", "cp_total": 2.75, "execution": "routed"}) == "FracTrain cp 2+0.5 routed (sampled)"
    # execution settings away from their defaults are named, so a sweep over them gets one name per row
    assert _label({"kind": "dfq", "target_cp": 3.0, "execution": "routed", "routed_sample_fraction": 1.0,
                   "routed_statistics": "computed", "option_state": "shared"}) == \
        "DFQ cp 3% routed (sampled, whole batch, computed statistics, shared state)"
    assert _label({"kind": "dfq", "target_cp": 3.0, "execution": "routed", "routed_estimator": "grouped",
                   "routed_sample_fraction": 0.25, "routed_warmup": 0.1}) == \
        "DFQ cp 3% routed (grouped, alternative for 0.25, masked warm-up 0.1)"
    assert _label({"kind": "dfq", "target_cp": 3.0, "execution": "routed", "routed_estimator": "skip"}) == \
        "DFQ cp 3% routed (skip)"  # no alternative: the whole batch is its default
    assert _label({"kind": "dfq", "target_cp": 3.0, "option_state": "per_option"}) == "DFQ cp 3% masked (per_option state)"
    point = {"schedule": {"kind": "fp32"}, "optim.lr": 0.05}
    assert method_label(point, config_of(point)) == "FP32, optim.lr=0.05"
    assert method_label({"optim.lr": 0.05}, config_of({"optim.lr": 0.05})) == "optim.lr=0.05"


def test_a_logged_config_reads_the_settings_it_predates_as_its_engine_ran_them():
    """A run logged before a gated setting existed ran without it: it reads back as the engine then ran, not as
    the engine's current default (routed's defaults are the half batch and batch statistics)."""
    old = config_of({"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}}).to_dict()
    for key in ("option_state", "routed_sample_fraction", "routed_statistics"):
        del old["schedule"][key]
    cfg = parse_config(as_logged(old))
    assert (cfg.schedule.option_state, cfg.schedule.routed_sample_fraction, cfg.schedule.routed_statistics) == \
        ("shared", 1.0, "computed")
    assert cfg.schedule.label() == "DFQ cp 3% routed (sampled, whole batch, computed statistics, shared state)"
    new = config_of({"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}}).to_dict()
    assert parse_config(as_logged(new)) == parse_config(new)  # a log that has them keeps them
    assert parse_config(new).schedule.label() == "DFQ cp 3% routed (sampled)"
    masked = config_of({"schedule": {"kind": "dfq", "target_cp": 3.0}}).to_dict()
    del masked["schedule"]["routed_statistics"]
    assert parse_config(as_logged(masked)).schedule.label() == "DFQ cp 3% masked"


def test_fractrain_is_checked_against_dfq_at_its_final_target_with_the_same_gate():
    sbm = {"schedule": {"kind": "static", "fw": 8, "bw": 8}}
    gate = {"execution": "routed", "beta": 1.0}
    dfq = {cp: {"schedule": {"kind": "dfq", "target_cp": cp, **gate}} for cp in (1.5, 3.0, 3.5)}
    other_gates = [{"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}},  # the default beta
                   {"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "masked", "beta": 1.0}}]
    # cp0 unset: the engine's 1.5 -> 2 -> 2.5 -> 3; cp_total 2.75: 2 -> 2.5 -> 3 -> 3.5 (supplement eq. 1)
    default = {"schedule": {"kind": "fractrain", **gate}}
    total = {"schedule": {"kind": "fractrain", "cp_total": 2.75, **gate}}
    points = [sbm, *dfq.values(), *other_gates, default, total]
    rows = [row(p, s, 0.9, 100.0 - i) for i, p in enumerate(points) for s in (0, 1)]
    pairs = {(c["method"], c["reference"]) for c in trends(summarise(rows, ACC), ACC) if c["claim"].startswith("FracTrain costs")}
    assert pairs == {("FracTrain cp 1.5+0.5 routed (sampled) beta 1", "DFQ cp 3% routed (sampled) beta 1"),
                     ("FracTrain cp 2+0.5 routed (sampled) beta 1", "DFQ cp 3.5% routed (sampled) beta 1")}


def test_summary_statistics_savings_and_trend_rule():
    fp32, sbm, low = ({"schedule": {"kind": "fp32"}}, {"schedule": {"kind": "static", "fw": 8, "bw": 8}},
                      {"schedule": {"kind": "pfq", "mode": "auto"}})
    rows = [row(fp32, 0, 0.90, 1000.0), row(fp32, 1, 0.92, 1000.0),
            row(sbm, 0, 0.89, 100.0), row(sbm, 1, 0.91, 100.0),
            row(low, 0, 0.80, 40.0), row(low, 1, 0.84, 60.0)]
    groups = {g["method"]: g for g in summarise(rows, ACC)}
    assert [g["method"] for g in summarise(rows, ACC)] == ["FP32", "FW8/BW8", "PFQ auto FW3-4-6-8/BW6-6-8-8"]
    assert all(g["kind"] == g["config"].schedule.kind for g in groups.values())
    g = groups["PFQ auto FW3-4-6-8/BW6-6-8-8"]
    assert g["accuracy_mean"] == pytest.approx(0.82) and g["accuracy_std"] == pytest.approx(statistics.stdev([.8, .84]))
    assert g["savings_vs_fp32"] == pytest.approx(0.95) and g["savings_vs_fw8bw8"] == pytest.approx(0.5)
    assert g["accuracy_delta_vs_fw8bw8_pp"] == pytest.approx(-8.0)
    assert g["per_seed"] == {0: {"accuracy": 0.80, "train_bitops": 40.0}, 1: {"accuracy": 0.84, "train_bitops": 60.0}}
    checks = {c["method"]: c for c in trends(list(groups.values()), ACC)}
    # FW8/BW8's worst seed (0.89) is 2 points below FP32's mean (0.91): more than the 1-point tolerance
    assert checks["FW8/BW8"]["holds"] is False
    assert checks["PFQ auto FW3-4-6-8/BW6-6-8-8"]["holds"] is False
    assert checks["PFQ auto FW3-4-6-8/BW6-6-8-8"]["why_not"] == "accuracy below the reference"
    assert comparable(groups["FW8/BW8"], {**groups["FP32"], "accuracy_mean": 0.899}, ACC)  # worst seed within 1 point


def test_a_method_whose_seeds_disagree_is_not_comparable_and_is_flagged_split():
    """The worst seed decides, however wide the spread: a bimodal method (one seed 9 points down) is not
    comparable, where a mean-and-two-stds allowance would call it so, and its seeds are reported split."""
    sbm, frac = {"schedule": {"kind": "static", "fw": 8, "bw": 8}}, {"schedule": {"kind": "fractrain"}}
    rows = [row(sbm, s, a, 100.0) for s, a in ((0, 0.904), (1, 0.905), (2, 0.903))]
    rows += [row(frac, s, a, 60.0) for s, a in ((0, 0.811), (1, 0.898), (2, 0.900))]
    groups = {g["method"]: g for g in summarise(rows, ACC)}
    fr = groups["FracTrain cp 1.5+0.5 masked"]
    assert fr["accuracy_mean"] >= 0.904 - 2 * fr["accuracy_std"]  # the old allowance would have passed it
    check = next(c for c in trends(list(groups.values()), ACC) if c["method"] == fr["method"])
    assert check["holds"] is False and check["split_seeds"] == [[0.811], [0.898, 0.900]]
    assert split_seeds(groups["FW8/BW8"], ACC) is None
    # its seeds close together again: comparable, one cluster
    rows[4] = row(frac, 0, 0.897, 60.0)
    fr = next(g for g in summarise(rows, ACC) if g["kind"] == "fractrain")
    assert comparable(fr, groups["FW8/BW8"], ACC) and split_seeds(fr, ACC) is None


def test_dynamic_precision_is_checked_against_the_interpolated_static_front():
    """The static rows' front of the means, linear between the rows that bracket the gated method's BitOPs:
    on or above it with the worst seed holds; below it, or cheaper than every static row, does not."""
    st = {fw: {"schedule": {"kind": "static", "fw": fw, "bw": 8}} for fw in (4, 6, 8)}
    rows = [row(st[4], s, 0.86, 40.0) for s in (0, 1)] + [row(st[6], s, 0.90, 80.0) for s in (0, 1)]
    rows += [row(st[8], s, 0.91, 120.0) for s in (0, 1)]
    above, below = {"schedule": {"kind": "dfq", "target_cp": 2.0}}, {"schedule": {"kind": "dfq", "target_cp": 3.0}}
    cheap = {"schedule": {"kind": "dfq", "target_cp": 1.0}}
    rows += [row(above, 0, 0.885, 60.0), row(above, 1, 0.883, 60.0)]  # front at 60: 0.88
    rows += [row(below, 0, 0.87, 60.0), row(below, 1, 0.90, 60.0)]  # mean 0.885, worst 0.87 < 0.88
    rows += [row(cheap, 0, 0.85, 30.0), row(cheap, 1, 0.85, 30.0)]
    checks = {c["method"]: c for c in trends(summarise(rows, ACC), ACC) if c["claim"].startswith("Dynamic precision")}
    a, b, c = (checks[f"DFQ cp {t}% masked"] for t in (2, 3, 1))
    assert a["holds"] is True and a["reference"] == "static front (FW4/BW8 .. FW6/BW8)"
    assert a["accuracy_delta_pp"] == pytest.approx(0.4)
    assert a["savings"] == pytest.approx(1 - 60.0 / (40.0 + 40.0 * (0.884 - 0.86) / 0.04))  # the front's cost at 0.884
    assert b["holds"] is False and b["why_not"] == "worst seed -1.00 pp against the front"
    assert c["holds"] is False and "cheaper than every static row" in c["why_not"]


def test_pfq_is_checked_against_the_static_run_at_its_final_precision():
    sbm = {"schedule": {"kind": "static", "fw": 8, "bw": 8}}
    sbm16 = {"schedule": {"kind": "static", "fw": 8, "bw": 16}}
    pfq16 = {"schedule": {"kind": "pfq", "mode": "auto", "fw": [3, 4, 6, 8], "bw": [6, 8, 12, 16]}}
    pfq8 = {"schedule": {"kind": "pfq", "mode": "manual", "fw": [4, 8], "bw": [8, 8]}}
    rows = [row(p, s, 0.9, ops) for p, ops in ((sbm, 100.0), (sbm16, 200.0), (pfq16, 60.0), (pfq8, 70.0))
            for s in (0, 1)]
    refs = {c["method"]: c["reference"] for c in trends(summarise(rows, ACC), ACC)}
    assert refs["PFQ auto FW3-4-6-8/BW6-8-12-16"] == "FW8/BW16"
    assert refs["PFQ manual FW4-8/BW8-8"] == "FW8/BW8"


def test_perplexity_comparable_rule_is_relative_on_the_worst_seed():
    ref = {"perplexity_mean": 100.0, "perplexity_std": 0.1}
    assert comparable({"perplexity_mean": 101.9, "perplexity_std": 0.1}, ref, PPL)  # within 2% of 100
    assert not comparable({"perplexity_mean": 102.1, "perplexity_std": 0.1}, ref, PPL)
    assert comparable({"perplexity_mean": 80.0, "perplexity_std": 0.1}, ref, PPL)  # lower is better
    seeds = {0: {"perplexity": 100.5}, 1: {"perplexity": 103.3}}  # mean 101.9, worst seed 3.3 % above
    assert not comparable({"perplexity_mean": 101.9, "perplexity_std": 2.0, "per_seed": seeds}, ref, PPL)
