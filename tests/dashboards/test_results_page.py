"""``fractune results``: the markdown results page, generated from a real sweep's MLflow runs."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from pathlib import Path

import pytest
import yaml

from dashboards.results_page import comparable, method_label, split_seeds, summarise, trends
from engine.config.experiment import parse_config, set_path
from results import store
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.objectives import PERPLEXITY_OBJECTIVE as PPL
from tests.conftest import copy_store, run_main

STUDY = {
    "name": "mini_study",
    "description": "four methods, two seeds",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 1}},
    "parameters": {"schedule": {"grid": [
        {"kind": "fp32"},
        {"kind": "static", "fw": 8, "bw": 8},
        {"kind": "pfq", "mode": "manual", "fw": [4, 8], "bw": [8, 8]},
        {"kind": "cpt", "fw_min": 3, "fw_max": 8, "num_cycles": 2}]}},
    "seeds": [0, 1],
    "budget": {"max_concurrent_trials": 1},
    "resources": {"cpu": 1},
}


def _config(point: dict):
    """The resolved config of a point, as `fractune results` gets it (the engine parses the logged config)."""
    tree = {"model": {"name": "tiny"}, "data": {"dataset": "digits"}, "optim": {"epochs": 3}}
    for path, value in point.items():
        set_path(tree, path, value)
    return parse_config(tree)


def _row(point, seed, acc, ops, cp=float("nan"), **costs):
    return {"point": point, "config": _config(point), "seed": seed, "accuracy": acc, "train_bitops": ops, "cp": cp,
            "costs": {"bitops": ops, **costs}}


def _label(schedule: dict) -> str:
    return method_label({"schedule": schedule}, _config({"schedule": schedule}))


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
    assert method_label(point, _config(point)) == "FP32, optim.lr=0.05"
    assert method_label({"optim.lr": 0.05}, _config({"optim.lr": 0.05})) == "optim.lr=0.05"


def test_a_logged_config_reads_the_settings_it_predates_as_its_engine_ran_them():
    """A run logged before a gated setting existed ran without it: it reads back as the engine then ran, not as
    the engine's current default (routed's defaults are the half batch and batch statistics)."""
    from dashboards.results_page import as_logged

    old = _config({"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}}).to_dict()
    for key in ("option_state", "routed_sample_fraction", "routed_statistics"):
        del old["schedule"][key]
    cfg = parse_config(as_logged(old))
    assert (cfg.schedule.option_state, cfg.schedule.routed_sample_fraction, cfg.schedule.routed_statistics) == \
        ("shared", 1.0, "computed")
    assert cfg.schedule.label() == "DFQ cp 3% routed (sampled, whole batch, computed statistics, shared state)"
    new = _config({"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}}).to_dict()
    assert parse_config(as_logged(new)) == parse_config(new)  # a log that has them keeps them
    assert parse_config(new).schedule.label() == "DFQ cp 3% routed (sampled)"
    masked = _config({"schedule": {"kind": "dfq", "target_cp": 3.0}}).to_dict()
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
    rows = [_row(p, s, 0.9, 100.0 - i) for i, p in enumerate(points) for s in (0, 1)]
    pairs = {(c["method"], c["reference"]) for c in trends(summarise(rows, ACC), ACC) if c["claim"].startswith("FracTrain costs")}
    assert pairs == {("FracTrain cp 1.5+0.5 routed (sampled) beta 1", "DFQ cp 3% routed (sampled) beta 1"),
                     ("FracTrain cp 2+0.5 routed (sampled) beta 1", "DFQ cp 3.5% routed (sampled) beta 1")}


def test_summary_statistics_savings_and_trend_rule():
    fp32, sbm, low = ({"schedule": {"kind": "fp32"}}, {"schedule": {"kind": "static", "fw": 8, "bw": 8}},
                      {"schedule": {"kind": "pfq", "mode": "auto"}})
    rows = [_row(fp32, 0, 0.90, 1000.0), _row(fp32, 1, 0.92, 1000.0),
            _row(sbm, 0, 0.89, 100.0), _row(sbm, 1, 0.91, 100.0),
            _row(low, 0, 0.80, 40.0), _row(low, 1, 0.84, 60.0)]
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
    rows = [_row(sbm, s, a, 100.0) for s, a in ((0, 0.904), (1, 0.905), (2, 0.903))]
    rows += [_row(frac, s, a, 60.0) for s, a in ((0, 0.811), (1, 0.898), (2, 0.900))]
    groups = {g["method"]: g for g in summarise(rows, ACC)}
    fr = groups["FracTrain cp 1.5+0.5 masked"]
    assert fr["accuracy_mean"] >= 0.904 - 2 * fr["accuracy_std"]  # the old allowance would have passed it
    check = next(c for c in trends(list(groups.values()), ACC) if c["method"] == fr["method"])
    assert check["holds"] is False and check["split_seeds"] == [[0.811], [0.898, 0.900]]
    assert split_seeds(groups["FW8/BW8"], ACC) is None
    # its seeds close together again: comparable, one cluster
    rows[4] = _row(frac, 0, 0.897, 60.0)
    fr = next(g for g in summarise(rows, ACC) if g["kind"] == "fractrain")
    assert comparable(fr, groups["FW8/BW8"], ACC) and split_seeds(fr, ACC) is None


def test_dynamic_precision_is_checked_against_the_interpolated_static_front():
    """The static rows' front of the means, linear between the rows that bracket the gated method's BitOPs:
    on or above it with the worst seed holds; below it, or cheaper than every static row, does not."""
    st = {fw: {"schedule": {"kind": "static", "fw": fw, "bw": 8}} for fw in (4, 6, 8)}
    rows = [_row(st[4], s, 0.86, 40.0) for s in (0, 1)] + [_row(st[6], s, 0.90, 80.0) for s in (0, 1)]
    rows += [_row(st[8], s, 0.91, 120.0) for s in (0, 1)]
    above, below = {"schedule": {"kind": "dfq", "target_cp": 2.0}}, {"schedule": {"kind": "dfq", "target_cp": 3.0}}
    cheap = {"schedule": {"kind": "dfq", "target_cp": 1.0}}
    rows += [_row(above, 0, 0.885, 60.0), _row(above, 1, 0.883, 60.0)]  # front at 60: 0.88
    rows += [_row(below, 0, 0.87, 60.0), _row(below, 1, 0.90, 60.0)]  # mean 0.885, worst 0.87 < 0.88
    rows += [_row(cheap, 0, 0.85, 30.0), _row(cheap, 1, 0.85, 30.0)]
    checks = {c["method"]: c for c in trends(summarise(rows, ACC), ACC) if c["claim"].startswith("Dynamic precision")}
    a, b, c = (checks[f"DFQ cp {t}% masked"] for t in (2, 3, 1))
    assert a["holds"] is True and a["reference"] == "static front (FW4/BW8 .. FW6/BW8)"
    assert a["accuracy_delta_pp"] == pytest.approx(0.4)
    assert a["savings"] == pytest.approx(1 - 60.0 / (40.0 + 40.0 * (0.884 - 0.86) / 0.04))  # the front's cost at 0.884
    assert b["holds"] is False and b["why_not"] == "worst seed -1.00 pp against the front"
    assert c["holds"] is False and "cheaper than every static row" in c["why_not"]


def test_savings_and_ranking_under_each_cost_model():
    from dashboards.results_page import cost_model_section, front_of, rankings

    fp32, sbm, fw6 = ({"schedule": {"kind": "fp32"}}, {"schedule": {"kind": "static", "fw": 8, "bw": 8}},
                      {"schedule": {"kind": "static", "fw": 6, "bw": 8}})
    rows = [_row(fp32, 0, 0.90, 1000.0, int_units=1000.0), _row(sbm, 0, 0.89, 100.0, int_units=100.0),
            _row(fw6, 0, 0.89, 70.0, int_units=100.0), _row(fw6, 1, 0.89, 70.0, int_units=110.0)]
    groups = {g["method"]: g for g in summarise(rows, ACC)}
    g = groups["FW6/BW8"]
    assert g["costs_mean"] == {"bitops": 70.0, "int_units": 105.0}
    assert g["savings_by_model"]["bitops"] == {"fp32": pytest.approx(0.93), "fw8bw8": pytest.approx(0.3)}
    assert g["savings_by_model"]["int_units"] == {"fp32": pytest.approx(0.895), "fw8bw8": pytest.approx(-0.05)}
    assert rankings(list(groups.values())) == {"bitops": ["FW6/BW8", "FW8/BW8", "FP32"],
                                               "int_units": ["FW8/BW8", "FW6/BW8", "FP32"]}
    # the front follows the model: FW6/BW8 dominates FW8/BW8 in BitOPs, not on integer units
    assert [r["method"] for r in front_of(list(groups.values()), ACC)] == ["FW6/BW8", "FP32"]
    assert [r["method"] for r in front_of(list(groups.values()), ACC, "int_units")] == ["FW8/BW8", "FP32"]
    text = "\n".join(cost_model_section(list(groups.values())))
    assert "| FW6/BW8 | +93.0% / +30.0% | +89.5% / -5.0% |" in text
    assert "- int_units: **FW8/BW8**, **FW6/BW8**, FP32" in text


def test_ranking_joins_equal_costs_and_a_sweep_without_references_shows_no_savings():
    """Equal costs are one tier (MACs do not see bits), and a method is bold only where the methods cheaper than it
    change; with no FP32 or FW8/BW8 row the savings table, empty in every cell, gives way to a sentence."""
    from dashboards.results_page import cost_model_section

    w4 = [{"schedule": {"kind": "static", "fw": fw, "bw": bw, "weight_bits": 4}} for fw, bw in ((4, 6), (4, 8))]
    dfq = {"schedule": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"}}
    rows = [_row(w4[0], 0, 0.80, 60.0, macs=10.0), _row(w4[1], 0, 0.81, 75.0, macs=10.0),
            _row(dfq, 0, 0.80, 72.0, macs=10.5)]
    text = "\n".join(cost_model_section(summarise(rows, ACC)))
    assert "| method |" not in text and "no FP32 and no FW8/BW8 row" in text
    assert "- bitops: FW4/BW6 W4, DFQ cp 3% routed (sampled), FW4/BW8 W4" in text
    # under MACs the two static rows tie; DFQ, dearer than both, is bold: FW4/BW8 is no longer cheaper than it
    assert "- macs: FW4/BW6 W4 = **FW4/BW8 W4**, **DFQ cp 3% routed (sampled)**" in text


@pytest.fixture(scope="module")
def mini_study(ray_local, tmp_path_factory, store_template):
    from orchestrator.cli.main import main

    folder = tmp_path_factory.mktemp("mini_study")
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    uri = copy_store(store_template, folder / "m.db")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["sweep", str(spec), "--tracking-uri", uri, "--storage", str(folder / "runs"), "--quiet",
                     "--no-report", "--json"])
    assert code == 0, buf.getvalue()[-3000:]
    return {"folder": folder, "uri": uri}


@pytest.mark.slow
def test_results_page_is_generated_from_the_mlflow_runs(mini_study):
    folder, uri = mini_study["folder"], mini_study["uri"]
    notes = folder / "notes.md"
    notes.write_text("## Analysis\n\nWritten by a person.\n")
    out_md = folder / "docs" / "results.md"
    out_md.parent.mkdir()  # --out must be in an existing folder (a missing one is refused: test_bad_input)
    code, out, summary = run_main("results", "mini_study", "--tracking-uri", uri, "--out", str(out_md), "--notes",
                                  str(notes), "--json")
    assert code == 0, out[-3000:]
    page = out_md.read_text()

    # every number in the table comes from the runs: recompute one group independently
    c = store.client(uri)
    parent = store.sweep_parent(c, "mini_study")
    children = store.child_runs(c, parent)
    assert len(children) == 8 and summary["finished"] == 8
    sbm = [run for run in children if run.data.params.get("schedule.kind") == "static"]
    acc = [run.data.metrics["accuracy"] for run in sbm]
    fp32 = [run.data.metrics["train_bitops"] for run in children if run.data.params.get("schedule.kind") == "fp32"]
    row = next(line for line in page.splitlines() if line.startswith("| FW8/BW8"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[1] == "2"
    assert cells[2] == f"{100 * statistics.fmean(acc):.2f} +/- {100 * statistics.stdev(acc):.2f}"
    saving = 1 - statistics.fmean(run.data.metrics["train_bitops"] for run in sbm) / statistics.fmean(fp32)
    assert cells[4] == f"{100 * saving:+.1f}%"
    # each seed's accuracy and BitOPs side by side, a column per seed
    by_seed = {int(run.data.params["seed"]): run.data.metrics for run in sbm}
    seeds_row = next(line for line in page.splitlines() if line.startswith("| FW8/BW8 |") and "%" not in line)
    assert [x.strip() for x in seeds_row.strip("|").split("|")][1:] == [
        f"{100 * by_seed[seed]['accuracy']:.2f} / {by_seed[seed]['train_bitops'] / 1e12:.3f}" for seed in sorted(by_seed)]
    assert len([line for line in page.splitlines() if line.startswith("| ") and "+/-" in line]) == 4
    assert "## The papers' trends, checked" in page and page.rstrip().endswith("Written by a person.")
    assert {t["method"] for t in summary["trends"]} >= {"FW8/BW8", "CPT FW3->8/BW8"}
    # no path of this machine on the page: outside the repository only the last two parts are named
    assert "--out .../docs/results.md" in page and "Do not edit by hand" in page and str(folder) not in page
    assert "\n## Setting\n\n- spec file: `.../mini_study0/spec.yaml`\n- spec: " in page.replace(folder.name, "mini_study0")

    plot = Path(summary["plot"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({plot.name})" in page
    logged = {a.path for a in c.list_artifacts(parent.info.run_id, "results")}
    seeds_plot = Path(summary["seeds_plot"])  # one panel per seed: the static rows, every other method
    assert seeds_plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({seeds_plot.name})" in page
    assert logged == {"results/results.md", "results/results_pareto.png", "results/results_seeds.png"}
    # every cost model side by side; FW8/BW8 against itself saves nothing under any model
    assert "## Savings under each cost model" in page
    row = next(line for line in page.splitlines() if line.startswith("| FW8/BW8 |") and "/ +0.0% |" in line)
    assert row.count("/ +0.0%") == 5
    assert set(summary["rankings"]) == {"bitops", "macs", "int_units", "energy", "memory"}


def test_results_front_under_another_cost_model(mini_study):
    folder, uri = mini_study["folder"], mini_study["uri"]
    code, _, out = run_main("results", "mini_study", "--tracking-uri", uri, "--out", str(folder / "e.md"),
                            "--no-log", "--objective", "energy", "--json")
    assert code == 0 and out["objective"] == "energy"
    energy = {m["method"]: m["costs_mean"]["energy"] for m in out["methods"]}
    assert energy["FP32"] == max(energy.values())
    assert out["pareto"][0] == min((m for m in out["methods"] if m["method"] in out["pareto"]),
                                   key=lambda m: m["costs_mean"]["energy"])["method"]


def test_results_bad_input_is_one_line(mini_study, capsys):
    code = run_main("results", "no_such_sweep", "--tracking-uri", mini_study["uri"])[0]
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no_such_sweep" in err
    code = run_main("results", "mini_study", "--tracking-uri", mini_study["uri"], "--notes", "/nonexistent/notes.md")[0]
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--notes" in err


def test_pfq_is_checked_against_the_static_run_at_its_final_precision():
    sbm = {"schedule": {"kind": "static", "fw": 8, "bw": 8}}
    sbm16 = {"schedule": {"kind": "static", "fw": 8, "bw": 16}}
    pfq16 = {"schedule": {"kind": "pfq", "mode": "auto", "fw": [3, 4, 6, 8], "bw": [6, 8, 12, 16]}}
    pfq8 = {"schedule": {"kind": "pfq", "mode": "manual", "fw": [4, 8], "bw": [8, 8]}}
    rows = [_row(p, s, 0.9, ops) for p, ops in ((sbm, 100.0), (sbm16, 200.0), (pfq16, 60.0), (pfq8, 70.0))
            for s in (0, 1)]
    refs = {c["method"]: c["reference"] for c in trends(summarise(rows, ACC), ACC)}
    assert refs["PFQ auto FW3-4-6-8/BW6-8-12-16"] == "FW8/BW16"
    assert refs["PFQ manual FW4-8/BW8-8"] == "FW8/BW8"


# A language-model sweep, logged by hand into a sqlite store in this process (no Ray, no server): per method
# (test perplexity of seeds 0 and 1, next-token accuracy, training BitOPs). The next-token accuracies rank the
# methods differently on purpose: a page that followed accuracy would put FW8/BW8 on the front and FP32 off it.
LM_BASE = {"model": {"name": "transformer_tiny"}, "data": {"dataset": "fortunes", "seq_len": 32, "vocab_size": 2048},
           "optim": {"optimizer": "adam", "lr": 0.003, "epochs": 1}}
LM_METHODS = {
    "fp32": ({"kind": "fp32"}, (100.0, 102.0), 0.30, 1000e9),
    "static": ({"kind": "static", "fw": 8, "bw": 8}, (102.0, 103.0), 0.35, 100e9),
    "pfq": ({"kind": "pfq", "mode": "auto", "fw": [3, 4, 6, 8], "bw": [6, 6, 8, 8]}, (101.5, 102.5), 0.25, 60e9),
    "cpt": ({"kind": "cpt", "fw_min": 3, "fw_max": 8, "num_cycles": 4}, (110.0, 112.0), 0.20, 50e9),
}


def _lm_sweep(uri: str, name: str = "lm_mini", params: dict | None = None) -> None:
    from mlflow.entities import Metric

    c = store.client(uri)
    exp = c.create_experiment(name)
    parent = c.create_run(exp, run_name=name, tags={"fractune.kind": "sweep", store.SWEEP_TAG: f"{name}-1"})
    for k, v in (params or {}).items():
        c.log_param(parent.info.run_id, k, v)
    c.log_dict(parent.info.run_id, {"name": name, "description": "language models, two seeds", "base": LM_BASE,
                                    "seeds": [0, 1]}, "sweep_spec.yaml")
    for kind, (schedule, ppls, acc, ops) in LM_METHODS.items():
        for seed, ppl in enumerate(ppls):
            run = c.create_run(exp, run_name=f"{kind} s{seed}", tags={
                store.PARENT_TAG: parent.info.run_id, "fractune.kind": "trial", store.SWEEP_TAG: f"{name}-1",
                store.TRIAL_TAG: f"{kind}_{seed}", store.PLANNED_TAG: "1", "fractune.swept": "schedule",
                store.POINT_TAG: json.dumps({"schedule": schedule}), "fractune.schedule": kind})
            rid = run.info.run_id
            c.log_param(rid, "seed", seed)
            c.log_batch(rid, metrics=[Metric(k, v, 0, 1) for k, v in (
                ("perplexity", ppl), ("accuracy", acc + 0.01 * seed), ("train_bitops", ops), ("cum_cp", ops / 1e10),
                ("epoch", 1), ("wall_seconds", 30.0))])
            c.log_dict(rid, {**LM_BASE, "name": name, "seed": seed, "schedule": schedule}, "config.yaml")
            c.set_terminated(rid)
    c.set_terminated(parent.info.run_id)


def _lm_rows() -> list[dict]:
    return [{"point": {"schedule": schedule}, "seed": seed, "perplexity": ppl, "accuracy": acc, "train_bitops": ops,
             "cp": ops / 1e10, "costs": {"bitops": ops}}
            for schedule, ppls, acc, ops in LM_METHODS.values() for seed, ppl in enumerate(ppls)]


def test_language_model_results_page_ranks_on_perplexity(tmp_path, monkeypatch):
    from dashboards import pngs
    uri = f"sqlite:///{tmp_path / 'lm.db'}"
    _lm_sweep(uri)
    labels = {}
    save = pngs._save
    monkeypatch.setattr(pngs, "_save", lambda fig, path: labels.update(
        y=fig.axes[0].get_ylabel(), title=fig.axes[0].get_title()) or save(fig, path))
    code, _, out = run_main("results", "lm_mini", "--tracking-uri", uri, "--out", str(tmp_path / "lm.md"), "--json")
    assert code == 0, out
    page = (tmp_path / "lm.md").read_text()

    # the JSON names the task objective and its direction (the cost objective stays `objective`)
    assert out["task_objective"] == "perplexity" and out["direction"] == "minimize" and out["objective"] == "bitops"
    assert "2% above the reference's mean" in out["comparable_rule"]
    # the front of the method means on (perplexity min, BitOPs min): FW8/BW8 is dominated by PFQ (cheaper and
    # lower perplexity); FP32 has the lowest perplexity, so it stays (on accuracy it would be the other way)
    assert out["pareto"] == ["CPT FW3->8/BW8", "PFQ auto FW3-4-6-8/BW6-6-8-8", "FP32"]
    sbm = next(m for m in out["methods"] if m["method"] == "FW8/BW8")
    assert sbm["perplexity_mean"] == pytest.approx(102.5) and sbm["perplexity_std"] == pytest.approx(0.5 ** 0.5)
    assert sbm["perplexity_delta_vs_fp32_pct"] == pytest.approx(100 * (102.5 / 101 - 1))
    assert "accuracy_mean" not in sbm and "accuracy_delta_vs_fw8bw8_pp" not in sbm

    # the trends: lower perplexity is better. CPT's +8.3% against FW8/BW8 fails, PFQ's -0.5% holds, FW8/BW8's
    # +1.5% against FP32 holds (its worst seed within 2% of FP32's mean)
    checks = {t["method"]: t for t in out["trends"]}
    assert checks["CPT FW3->8/BW8"]["holds"] is False
    assert checks["CPT FW3->8/BW8"]["why_not"] == "perplexity above the reference"
    assert checks["CPT FW3->8/BW8"]["perplexity_delta_pct"] == pytest.approx(100 * (111 / 102.5 - 1))
    assert checks["PFQ auto FW3-4-6-8/BW6-6-8-8"]["holds"] is True and checks["FW8/BW8"]["holds"] is True
    assert checks["FW8/BW8"]["claim"] == "8-bit training (FW8/BW8, SBM) matches FP32 perplexity"
    # that claim asks for more than half of FP32's BitOPs saved (an LM's fp32 output layer can keep it from that)
    few = trends([{**g, "train_bitops_mean": 800e9} if g["method"] == "FW8/BW8" else g for g in
                  summarise([{**r, "config": _config(r["point"])} for r in _lm_rows()], PPL)], PPL)
    assert next(c for c in few if c["method"] == "FW8/BW8")["why_not"] == \
        "BitOPs saving 20.0% not above the 50% this claim asks"

    # the page: perplexity with its direction and rule stated, never accuracy
    assert "accuracy" not in page.lower()
    assert "## Test perplexity and training BitOPs" in page and "lower is better" in page
    assert "(test perplexity min, training cost min)" in page
    row = next(line for line in page.splitlines() if line.startswith("| FW8/BW8"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[:3] == ["FW8/BW8", "2", "102.50 +/- 0.71"] and cells[6:8] == ["+1.5", "+0.0"]
    assert [line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| ") and "+/-" in line] == \
        ["FP32 *", "FW8/BW8", "PFQ auto FW3-4-6-8/BW6-6-8-8 *", "CPT FW3->8/BW8 *"]
    assert ("Rule: a method holds a claim when it saves BitOPs against the reference and its worst seed's test "
            "perplexity is no more than 2% above the reference's mean (lower is better).") in page
    assert "| ppl. change (%) |" in page and "| +8.3 | 50.0% | no (perplexity above the reference) |" in page
    assert labels == {"y": "test perplexity (mean +/- std over seeds; lower is better)",
                      "title": "Test perplexity vs training cost (bitops) per method"}


def test_perplexity_comparable_rule_is_relative_on_the_worst_seed():
    ref = {"perplexity_mean": 100.0, "perplexity_std": 0.1}
    assert comparable({"perplexity_mean": 101.9, "perplexity_std": 0.1}, ref, PPL)  # within 2% of 100
    assert not comparable({"perplexity_mean": 102.1, "perplexity_std": 0.1}, ref, PPL)
    assert comparable({"perplexity_mean": 80.0, "perplexity_std": 0.1}, ref, PPL)  # lower is better
    seeds = {0: {"perplexity": 100.5}, 1: {"perplexity": 103.3}}  # mean 101.9, worst seed 3.3 % above
    assert not comparable({"perplexity_mean": 101.9, "perplexity_std": 2.0, "per_seed": seeds}, ref, PPL)


def test_results_page_names_the_spec_file_that_made_it(tmp_path):
    """The Setting's first line: the parent run's ``spec_file``; a sweep that predates it, the spec of its name in
    search_spaces/ or docs/studies/, said to be found by name; no line when there is none."""
    uri = f"sqlite:///{tmp_path / 'lm.db'}"
    _lm_sweep(uri, "lm_recorded", {"spec_file": "docs/studies/lm_recorded.yaml"})
    _lm_sweep(uri, "lm_demo")  # a preset's name, no spec_file param: an older sweep
    _lm_sweep(uri, "study_fmnist_routed_half")  # a one-off spec's name
    _lm_sweep(uri, "lm_mini")  # no such file
    pages = {}
    for name in ("lm_recorded", "lm_demo", "study_fmnist_routed_half", "lm_mini"):
        code, _, out = run_main("results", name, "--tracking-uri", uri, "--out", str(tmp_path / f"{name}.md"),
                                "--no-log")
        assert code == 0, out
        pages[name] = (tmp_path / f"{name}.md").read_text().splitlines()
    first = {name: page[page.index("## Setting") + 2] for name, page in pages.items()}
    assert first["lm_recorded"] == "- spec file: `docs/studies/lm_recorded.yaml`"
    by_name = " (found by the sweep's name: the sweep did not record its spec file)"
    assert first["lm_demo"] == "- spec file: `search_spaces/lm_demo.yaml`" + by_name
    assert first["study_fmnist_routed_half"] == "- spec file: `docs/studies/study_fmnist_routed_half.yaml`" + by_name
    assert first["lm_mini"].startswith("- spec: ") and not any("spec file" in line for line in pages["lm_mini"])


def test_the_paired_rule_holds_refutes_or_leaves_undecided():
    """The spec's rule on the deciding pairs' differences; control pairs never count."""
    from dashboards.paired import decide, interval
    from search_spaces.spec import Paired

    rule = Paired(claim="c", pairs=[{"arm": {"a": 1}, "twin": {"a": 2}}], refute_margin=0.3)

    def verdict(*diffs, control=()):
        pairs = [{"control": False, "seeds": [{"difference": d} for d in diffs]},
                 {"control": True, "seeds": [{"difference": d} for d in control]}]
        return decide(pairs, rule)["verdict"]

    assert verdict(0.1, 0.0, 0.4) == "holds"
    assert verdict(0.0, 0.0) == "undecided"  # every pair >= 0 but the mean is not > 0
    assert verdict(-0.5, -0.2, -0.4) == "refuted"
    assert verdict(-0.1, -0.2, -0.3) == "undecided"  # all below 0, the mean within the margin
    assert verdict(0.5, -0.1) == "undecided"
    assert verdict(0.2, 0.3, control=(-5.0,)) == "holds"
    mean, low, high = interval([1.0, 2.0, 3.0])  # t(2) = 4.303, sd 1: half-width 4.303 / sqrt(3)
    assert (mean, round(low, 4), round(high, 4)) == (2.0, round(2 - 4.303 / 3**0.5, 4), round(2 + 4.303 / 3**0.5, 4))


PAIRED = {
    "name": "mini_paired",
    "description": "DFQ against a static twin, paired by seed, with a masked control on one seed",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 1},
             "quant": {"layer_map": "gated"}},
    "stages": [
        {"name": "paired", "parameters": {"schedule": {"grid": [
            {"kind": "static", "fw": 4, "bw": 8, "weight_bits": 4},
            {"kind": "dfq", "options": "reference", "target_cp": 3.0, "execution": "routed"}]}}},
        {"name": "control", "seeds": [0], "parameters": {"schedule": {"grid": [
            {"kind": "dfq", "options": "reference", "target_cp": 3.0, "execution": "masked"}]}}}],
    "seeds": [0, 1],
    "budget": {"max_concurrent_trials": 1},
    "resources": {"cpu": 1},
    "paired": {"claim": "Dynamic precision beats static precision of equal cost", "pairs": [
        {"arm": {"schedule.kind": "dfq", "schedule.execution": "routed"}, "twin": {"schedule.kind": "static"}},
        {"arm": {"schedule.kind": "dfq", "schedule.execution": "masked"}, "twin": {"schedule.kind": "static"},
         "control": True}]},
}


@pytest.mark.slow
def test_a_paired_study_page_states_its_rule_then_shows_its_evidence(ray_local, tmp_path, store_template):
    """A staged sweep of independent stages (a control on one seed) with a paired section: the page states the
    rule before the numbers, pairs the runs by seed with the differences recomputed here from MLflow, gives the
    rule's verdict, shows what the gate allocated and the pairs' figure, and leaves out the columns that are empty
    in every row (no FP32 or FW8/BW8 row here)."""
    from dashboards.paired import decide
    from search_spaces.spec import Paired

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(PAIRED, sort_keys=False))
    uri = copy_store(store_template, tmp_path / "m.db")
    code, out, _ = run_main("sweep", str(spec), "--tracking-uri", uri, "--storage", str(tmp_path / "runs"),
                            "--quiet", "--no-report", "--json")
    assert code == 0, out[-3000:]
    out_md = tmp_path / "paired.md"
    code, out, summary = run_main("results", "mini_paired", "--tracking-uri", uri, "--out", str(out_md), "--json")
    assert code == 0, out[-3000:]
    page = out_md.read_text()

    c = store.client(uri)
    parent = store.sweep_parent(c, "mini_paired")
    runs = {(run.data.params["schedule.kind"], run.data.params.get("schedule.execution"), int(run.data.params["seed"])):
            run.data.metrics for run in store.child_runs(c, parent)}
    assert len(runs) == 5 and summary["finished"] == 5
    # the header's wall time: the parent run's, which both stages ran under
    minutes = round((parent.info.end_time - parent.info.start_time) / 60_000)
    assert f"5 trials, 5 finished, in {minutes} min of wall time." in page
    diffs = {seed: 100 * (runs["dfq", "routed", seed]["accuracy"] - runs["static", None, seed]["accuracy"])
             for seed in (0, 1)}
    control = 100 * (runs["dfq", "masked", 0]["accuracy"] - runs["static", None, 0]["accuracy"])
    test = summary["paired"]
    assert [s["difference"] for s in test["pairs"][0]["seeds"]] == pytest.approx([diffs[0], diffs[1]])
    assert [s["difference"] for s in test["pairs"][1]["seeds"]] == pytest.approx([control])
    pairs = [{"control": False, "seeds": [{"difference": d} for d in diffs.values()]}]
    assert test["verdict"] == decide(pairs, Paired.model_validate(PAIRED["paired"]))["verdict"]
    assert f"**Verdict: {test['verdict']}.**" in page

    assert page.index("**Decision rule**") < page.index("| pair | seed |") < page.index("## Accuracy and training")
    routed = [line for line in page.splitlines() if line.startswith("| DFQ cp 3% routed (sampled) reference vs "
                                                                      "FW4/BW8 W4 |")]
    assert [line.split("|")[2].strip() for line in routed[:2]] == ["0", "1"]  # then its summary row
    assert [line.split("|")[2].strip() for line in page.splitlines()
            if line.startswith("| DFQ cp 3% masked reference vs FW4/BW8 W4 (control) |")][:1] == ["0"]
    header = next(line for line in page.splitlines() if line.startswith("| method | seeds | accuracy %"))
    assert "vs FP32" not in header and "vs FW8/BW8" not in header and "gated cp %" in header
    assert "## What the gate allocated" in page and "| method | block 0 | block 1 |" in page
    plot = Path(test and summary["pairs_plot"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({plot.name})" in page
    assert str(tmp_path) not in page
