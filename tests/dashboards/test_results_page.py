"""``fractune results``: the markdown results page, generated from a real sweep's MLflow runs."""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from results import store
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.objectives import PERPLEXITY_OBJECTIVE as PPL
from results.summary import summarise, trends
from tests.conftest import copy_store, run_main
from tests.results.rows import config_of, row

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


def test_savings_and_ranking_under_each_cost_model():
    from dashboards.results_page import cost_model_section
    from results.summary import front_of, rankings

    fp32, sbm, fw6 = ({"schedule": {"kind": "fp32"}}, {"schedule": {"kind": "static", "fw": 8, "bw": 8}},
                      {"schedule": {"kind": "static", "fw": 6, "bw": 8}})
    rows = [row(fp32, 0, 0.90, 1000.0, int_units=1000.0), row(sbm, 0, 0.89, 100.0, int_units=100.0),
            row(fw6, 0, 0.89, 70.0, int_units=100.0), row(fw6, 1, 0.89, 70.0, int_units=110.0)]
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
    rows = [row(w4[0], 0, 0.80, 60.0, macs=10.0), row(w4[1], 0, 0.81, 75.0, macs=10.0),
            row(dfq, 0, 0.80, 72.0, macs=10.5)]
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
    exp = c.create_experiment(name, artifact_location=store.artifact_root(uri, name))  # not ./mlruns of the cwd
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


def test_language_model_results_page_ranks_on_perplexity(tmp_path, sqlite_uri, monkeypatch):
    from dashboards import pngs
    uri = sqlite_uri
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
                  summarise([{**r, "config": config_of(r["point"])} for r in _lm_rows()], PPL)], PPL)
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


def test_an_infinite_perplexity_is_read_back_as_infinite_and_kept_off_the_front(tmp_path, sqlite_uri):
    """MLflow's SQL store keeps an infinite metric as the largest float. A diverged language model's perplexity
    (engine.run_metrics: infinite once the loss is beyond exp's range), on the cheapest trial, comes back as
    infinite: never on the front, and the report's analysis runs over the other trials."""
    from mlflow.entities import Metric

    uri = sqlite_uri
    _lm_sweep(uri)
    c = store.client(uri)
    parent = store.sweep_parent(c, "lm_mini")
    schedule = {"kind": "static", "fw": 2, "bw": 8}
    run = c.create_run(parent.info.experiment_id, run_name="static s2", tags={
        store.PARENT_TAG: parent.info.run_id, "fractune.kind": "trial", store.SWEEP_TAG: "lm_mini-1",
        store.TRIAL_TAG: "static_2", store.PLANNED_TAG: "1", "fractune.swept": "schedule",
        store.POINT_TAG: json.dumps({"schedule": schedule}), "fractune.schedule": "static"})
    rid = run.info.run_id
    c.log_param(rid, "seed", 2)
    c.log_batch(rid, metrics=[Metric(k, v, 0, 1) for k, v in (
        ("perplexity", math.inf), ("accuracy", 0.0), ("train_bitops", 10e9), ("cum_cp", 1.0), ("epoch", 1),
        ("wall_seconds", 30.0))])
    c.log_dict(rid, {**LM_BASE, "name": "lm_mini", "seed": 2, "schedule": schedule}, "config.yaml")
    c.set_terminated(rid)
    assert c.get_run(rid).data.metrics["perplexity"] < math.inf  # what the store holds
    assert store.metrics(c.get_run(rid))["perplexity"] == math.inf
    code, _, out = run_main("pareto", "lm_mini", "--tracking-uri", uri, "--json")
    assert code == 0 and out["trials"] == 9 and rid not in {p["run_id"] for p in out["pareto"]}
    assert all(p["perplexity"] < 200 for p in out["pareto"])
    code, _, out = run_main("report", "lm_mini", "--tracking-uri", uri, "--out", str(tmp_path / "rep"), "--no-log",
                            "--json")
    assert code == 0 and rid not in {p["run_id"] for p in out["pareto"]}


def test_the_report_of_a_running_sweep_says_it_is_partial(tmp_path, sqlite_uri, capsys):
    uri = sqlite_uri
    _lm_sweep(uri, params={"planned_trials": 12})
    c = store.client(uri)
    c.update_run(store.sweep_parent(c, "lm_mini").info.run_id, "RUNNING")
    code, _, out = run_main("report", "lm_mini", "--tracking-uri", uri, "--out", str(tmp_path / "rep"), "--no-log",
                            "--json")
    assert code == 0 and out["status"] == "RUNNING" and out["partial"] is True
    line = "sweep lm_mini-1 is running: 8 of 12 trials done; what follows is partial"
    assert line in capsys.readouterr().err
    assert line[0].upper() + line[1:] in (tmp_path / "rep" / "report.html").read_text()


def test_a_folder_where_a_page_or_its_figure_goes_is_refused_before_anything_is_written(tmp_path, sqlite_uri, capsys):
    """``results``, ``compare`` and ``report`` write figures beside (or into) their ``--out``: a folder in the
    way of any of them is one line naming ``--out``, exit 2, and nothing written, not a failure midway."""
    from dashboards.report import REPORT_FILES

    uri = sqlite_uri
    _lm_sweep(uri)
    _lm_sweep(uri, "lm_other")
    capsys.readouterr()
    out = tmp_path / "out"
    for blocked, args in [("p_seeds.png", ("results", "lm_mini", "--out", str(out / "p.md"))),
                          ("c_fronts.png", ("compare", "lm_mini", "lm_other", "--out", str(out / "c.md"))),
                          ("rep/precision.png", ("report", "lm_mini", "--out", str(out / "rep")))]:
        (out / blocked).mkdir(parents=True)
        code = run_main(*args, "--tracking-uri", uri, "--no-log")[0] if args[0] != "compare" else \
            run_main(*args, "--tracking-uri", uri)[0]
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--out: got" in err[0] and "a folder; allowed: a file path" in err[0]
        assert [p for p in out.rglob("*") if p.is_file()] == [], err
        (out / blocked).rmdir()
    assert run_main("report", "lm_mini", "--tracking-uri", uri, "--no-log", "--out", str(out / "rep"))[0] == 0
    assert {p.name for p in (out / "rep").iterdir()} <= set(REPORT_FILES)  # the list the check reads is whole


def test_a_method_whose_config_is_unread_keeps_its_name_and_a_trial_without_metrics_is_named(tmp_path, sqlite_uri):
    """A store moved without its artifacts: a method's ``config.yaml`` cannot be read, so the page names it by its
    trials' method tag and says so, never as the default config's FP32. A trial that finished without a finite
    objective is named with what it lacks, not dropped in silence."""
    from urllib.parse import urlparse

    uri = sqlite_uri
    _lm_sweep(uri)
    c = store.client(uri)
    children = store.child_runs(c, store.sweep_parent(c, "lm_mini"))
    for run in children:
        if run.data.tags["fractune.schedule"] == "static":
            c.set_tag(run.info.run_id, store.METHOD_TAG, "FW8/BW8")
            (Path(urlparse(run.info.artifact_uri).path) / "config.yaml").unlink()
    cpt = next(r for r in children if r.info.run_name == "cpt s0")
    c.log_metric(cpt.info.run_id, "perplexity", math.nan, step=2)
    code, _, out = run_main("results", "lm_mini", "--tracking-uri", uri, "--out", str(tmp_path / "p.md"), "--no-log",
                            "--json")
    assert code == 0, out
    page = (tmp_path / "p.md").read_text()
    assert "**Configs unread:** the `config.yaml` of FW8/BW8 could not be read" in page
    assert [m["method"] for m in out["methods"]].count("FW8/BW8") == 1 and "base" not in page
    assert "left out: cpt s0 (perplexity no value)" in page


def test_results_page_names_the_spec_file_that_made_it(tmp_path, sqlite_uri):
    """The Setting's first line: the parent run's ``spec_file``; a sweep that predates it, the spec of its name in
    search_spaces/ or docs/studies/, said to be found by name; no line when there is none."""
    uri = sqlite_uri
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
    from results.paired import decide
    from search_spaces.schema import Paired

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
