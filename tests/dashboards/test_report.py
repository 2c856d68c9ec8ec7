"""The HTML report: its figures from hand-built data, and the real thing from a sweep logged through a real
MLflow server (written by `fractune sweep`, rebuilt by `fractune report`, logged on the parent run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dashboards import figures
from dashboards import html as H
from dashboards.data import bit_allocation, load_sweep
from results import store
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.pareto import pareto_rows
from tests.conftest import run_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(name, acc, cost, kind="static", **kw):
    return {"run_id": name, "name": name, "accuracy": acc, "train_bitops": cost, "schedule": kind, "seed": 0,
            "point": {"schedule.fw": kw.get("fw", 8)}, "cp": 1.0}


def test_pareto_figure_highlights_exactly_the_front():
    rows = [_row("a", 0.9, 1e9), _row("b", 0.8, 2e9), _row("c", 0.95, 5e10, "fp32"), _row("d", 0.7, 5e8, "pfq")]
    front = pareto_rows(rows)
    fig = figures.pareto_figure(rows, front, ACC)
    (trace,) = [t for t in fig.data if t.name == "Pareto front"]
    assert list(trace.y) == [0.7, 0.9, 0.95]  # b is dominated by a; cheapest first
    assert {t.name for t in fig.data} == {"static", "fp32", "pfq", "Pareto front"}
    assert fig.layout.xaxis.type == "log"  # 5e8 .. 5e10 spans two decades


def test_front_and_parallel_coordinates_under_a_cost_model():
    rows = [{**_row("a", 0.9, 1e9), "costs": {"bitops": 1e9, "energy": 5.0}},
            {**_row("b", 0.8, 2e9, fw=4), "costs": {"bitops": 2e9, "energy": 2.0}}]
    fig = figures.pareto_figure(rows, rows, ACC, "energy")
    (trace,) = [t for t in fig.data if t.name == "Pareto front"]
    assert list(trace.x) == [5.0, 2.0] and "pJ" in fig.layout.xaxis.title.text
    par = figures.parallel_figure(rows, ["schedule.fw"], ["bitops", "energy"], ACC)
    dims = {d.label: list(d.values) for d in par.data[0].dimensions}
    assert dims == {"schedule.fw": [8, 4], "accuracy": [0.9, 0.8], "bitops": [1e9, 2e9], "energy": [5.0, 2.0]}
    imp = figures.importance_figure({"evaluator": "fanova", "trials": 3, "accuracy": {"x": 1.0}, "energy": {"x": 1.0}})
    assert [a.text for a in imp.layout.annotations] == ["for accuracy", "for energy"]


def test_sensitivity_figure_has_error_bars_per_level():
    levels = {"schedule.epsilon": {"0.02": {"accuracy_mean": 0.9, "accuracy_std": 0.01, "train_bitops_mean": 1e9,
                                            "train_bitops_std": None, "n": 2},
                                   "0.1": {"accuracy_mean": 0.92, "accuracy_std": 0.02, "train_bitops_mean": 2e9,
                                           "train_bitops_std": 1e8, "n": 2}}}
    verdicts = {"schedule.epsilon": {"verdict": "moderate", "train_bitops_verdict": "sensitive"}}
    fig = figures.sensitivity_figure(levels, verdicts, ACC)
    acc, cost = fig.data
    assert list(acc.x) == ["0.02", "0.1"] and list(acc.error_y.array) == [0.01, 0.02]
    assert list(cost.y) == [1.0, 2.0] and list(cost.error_y.array) == [0.0, 0.1]  # GBitOPs; a missing std is 0
    assert "schedule.epsilon: accuracy (moderate)" in [a.text for a in fig.layout.annotations]


def test_the_page_is_self_contained():
    page = H.page("t", [("Accuracy", H.figure(figures.pareto_figure([_row("a", 0.9, 1e9)], [], ACC)))])
    assert "Plotly" in page and len(page) > 1_000_000  # plotly.js inline, once
    assert not re.search(r"<script[^>]+src=", page) and "<link" not in page
    assert page.count('class="plotly-graph-div"') == 1


def test_bit_allocation_falls_back_to_the_per_block_metrics(sqlite_uri):
    from mlflow.entities import Metric

    c = store.client(sqlite_uri)
    run = c.create_run(c.create_experiment("alloc"))
    rid = run.info.run_id
    metrics = [Metric(f"alloc_{p}_b{b:02d}", v + b, 0, epoch) for epoch, v in ((1, 3.0), (2, 4.0))
               for b in range(2) for p in ("fw", "bw")]
    c.log_batch(rid, metrics=metrics)
    alloc = bit_allocation(c, {"run_id": rid})
    assert alloc["epochs"] == [1, 2] and alloc["fw"] == [[3.0, 4.0], [4.0, 5.0]]  # block rows, epoch columns


def test_sweep_writes_and_logs_the_report(served_sweep, mlflow_server):
    report = Path(served_sweep["report"])
    html = report.read_text()
    for section in ("Trials", "Accuracy vs training BitOPs", "Parameters and objectives", "Parameter importance",
                    "Precision over training", "DFQ bit allocation"):
        assert f"<h2>{section}</h2>" in html, section
    assert html.count('class="plotly-graph-div"') == 5 and not re.search(r"<script[^>]+src=", html)
    assert "Hypervolume of the front" in html and "reference point accuracy 0" in html
    assert "Sensitivity" not in html  # not an ablation
    for png in served_sweep["report_pngs"]:
        assert Path(png).read_bytes()[:8] == PNG_MAGIC and Path(png).stat().st_size > 5000
    assert {Path(p).name for p in served_sweep["report_pngs"]} == {"pareto.png", "importance.png", "precision.png",
                                                                   "bit_allocation.png"}
    # logged on the parent run through the server (proxied artifacts)
    c = store.client(mlflow_server["uri"])
    logged = {a.path for a in c.list_artifacts(served_sweep["parent_run_id"], "report")}
    assert {"report/report.html", "report/pareto.png", "report/report.json"} <= logged
    summary = json.loads((report.parent / "report.json").read_text())
    assert {p["run_id"] for p in summary["pareto"]} == {p["run_id"] for p in served_sweep["pareto"]}
    # importance for accuracy and for the cost under every model; the hypervolume on the parent run
    assert set(summary["importance"]) >= {"accuracy", "bitops", "macs", "int_units", "energy", "memory"}
    parent = c.get_run(served_sweep["parent_run_id"]).data
    hv = summary["front_quality"]["hypervolume"]
    assert 0 < hv < 1 and parent.metrics["hypervolume_bitops"] == pytest.approx(hv) == served_sweep["hypervolume"]
    assert "reference point" in parent.tags["fractune.hypervolume_bitops.reference"]
    assert f"report: {report}" in served_sweep["stderr"] and served_sweep["ui"] == (
        f"open {mlflow_server['uri']}/#/experiments/{served_sweep['experiment_id']}/runs?workflowType=machine_learning"
        f"&viewStateShareKey=fractune-{served_sweep['sweep_id']}&compareRunsMode=TABLE")


def test_report_reads_events_and_bit_allocation_back(served_sweep, mlflow_server):
    data = load_sweep(mlflow_server["uri"], "served_sweep", served_sweep["sweep_id"])
    assert len(data.rows) == 4 and data.factors == ["schedule"]
    kinds = {r["schedule"]: r for r in data.rows}
    assert kinds["pfq"]["point"]["schedule"]["epsilon"] == 0.3  # typed, from the fractune.point tag
    alloc = bit_allocation(data.client, kinds["dfq"])
    assert alloc["epochs"] == [1, 2] and len(alloc["fw"]) >= 2 and alloc["options"][0] == "skip"
    assert all(0 <= v <= 8 for row in alloc["fw"] for v in row)


@pytest.mark.slow
def test_report_cli_rebuilds_from_mlflow(served_sweep, mlflow_server, run_cli, tmp_path):
    rows = load_sweep(mlflow_server["uri"], "served_sweep").rows
    pfq, dfq = (next(r for r in rows if r["schedule"] == k) for k in ("pfq", "dfq"))
    secret = "pw" + "7e1d" * 6  # credentials in the URI, which the server ignores: never on the page
    with_credentials = mlflow_server["uri"].replace("://", f"://alice:{secret}@")
    r = run_cli("report", "served_sweep", "--tracking-uri", with_credentials, "--out", str(tmp_path / "rep"),
                "--run", dfq["trial_id"], "--run", pfq["name"], "--no-log", "--json")
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    for page in (tmp_path / "rep").iterdir():
        assert page.suffix == ".png" or secret not in page.read_text(), page
    assert f"tracking {mlflow_server['uri'].replace('://', '://***@')}" in (tmp_path / "rep" / "report.html").read_text()
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["report"] == str((tmp_path / "rep" / "report.html").resolve()) and out["artifact"] is None
    assert out["sweep_id"] == served_sweep["sweep_id"] and out["trials"] == 4
    assert set(out["importance"]["accuracy"]) == {"schedule"}
    summary = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert summary["chosen_runs"] == [dfq["run_id"], pfq["run_id"]]  # as named, in that order
    assert summary["bit_allocation_runs"] == [dfq["run_id"]]
    html = Path(out["report"]).read_text()
    assert "target cp %" in html  # the gated run's target CP in the precision figure


def test_ending_a_run_on_a_server_prints_no_uri(mlflow_server, capfd):
    """MLflow prints a "View run ... at <URI>" line, credentials included, for every run that ends on a server:
    no fractune process does."""
    from results import store

    c = store.client(mlflow_server["uri"].replace("://", "://alice:pw-probe@"))
    run = c.create_run(store.ensure_experiment(c, "uri_probe"))
    c.set_terminated(run.info.run_id)
    out, err = capfd.readouterr()
    assert "pw-probe" not in out + err and "View run" not in out


def test_report_errors_are_one_line_and_exit_2(served_sweep, mlflow_server, tmp_path, capsys):
    code = run_main("report", "no_such_sweep", "--tracking-uri", mlflow_server["uri"])[0]
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"fractune report: error: sweep: got 'no_such_sweep'; no sweep of that name in {mlflow_server['uri']}"]
    code = run_main("report", "served_sweep", "--tracking-uri", mlflow_server["uri"], "--run", "bogus", "--no-log",
                    "--out", str(tmp_path))[0]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and line.startswith("fractune report: error: --run: got 'bogus'; allowed: a run id")


@pytest.mark.parametrize("args, field", [(("--port", "70000"), "--port"),
                                         (("--tracking-uri", "ftp://host/x"), "--tracking-uri")])
def test_ui_bad_input_exits_2(tmp_path, args, field, capsys):
    code = run_main("ui", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", *args)[0]
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"fractune ui: error: {field}: got")


def test_ui_for_a_server_prints_the_sweeps_view(served_sweep, mlflow_server):
    code, _, out = run_main("ui", "--tracking-uri", mlflow_server["uri"], "--sweep", "served_sweep", "--json")
    assert code == 0
    view = (f"{mlflow_server['uri']}/#/experiments/{served_sweep['experiment_id']}/runs?workflowType=machine_learning"
            f"&viewStateShareKey=fractune-{served_sweep['sweep_id']}&compareRunsMode=")
    assert out == {"url": view + "TABLE", "charts_url": view + "CHART", "sweep_id": served_sweep["sweep_id"],
                   "tracking_uri": mlflow_server["uri"], "started": False}
