"""`fractune ablate` end to end on a real local Ray into a real sqlite MLflow store: a small one-factor-at-a-
time study on digits (3 points x 2 seeds), its tables, its JSON line, its report and what MLflow holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from results import store

SPEC = {
    "name": "digits_ablation",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 1},
             "schedule": {"kind": "static", "fw": 8, "bw": 8}},
    "ablation": {"mode": "ofat", "factors": {"schedule.fw": [4, 8], "schedule.bw": [6, 8]},
                 "baseline": {"schedule.fw": 8, "schedule.bw": 8}},
    "seeds": [0, 1],
    "budget": {"max_concurrent_trials": 1},
    "resources": {"cpu": 1},
}


@pytest.mark.slow
def test_ablate_runs_aggregates_and_reports(ray_local, tmp_path, capsys, monkeypatch):
    # run from another folder than the store's: the artifacts go beside the database, not to ./mlruns here
    (tmp_path / "store").mkdir()
    (tmp_path / "elsewhere").mkdir()
    sqlite_uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = tmp_path / "abl.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    code = main(["ablate", str(spec), "--tracking-uri", sqlite_uri, "--storage", str(tmp_path / "runs"),
                 "--out", str(tmp_path / "report"), "--quiet", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    [line] = captured.out.strip().splitlines()  # with --json, stdout holds the JSON object alone
    result = json.loads(line)
    out = captured.err
    assert result["trials"] == 6 and result["errored"] == 0 and result["mode"] == "ofat"

    # per level: the baseline (8/8) is on both curves, every level run with both seeds
    levels = result["levels"]
    assert list(levels) == ["schedule.fw", "schedule.bw"]
    assert list(levels["schedule.fw"]) == ["4", "8"] and list(levels["schedule.bw"]) == ["6", "8"]
    assert levels["schedule.fw"]["8"] == levels["schedule.bw"]["8"]
    for f in levels:
        for stats in levels[f].values():
            assert stats["n"] == 2 and 0 < stats["accuracy_mean"] <= 1 and stats["accuracy_std"] is not None
    # static precision: BitOPs depend on the bits alone (same for both seeds), fewer bits cost less
    assert levels["schedule.fw"]["4"]["train_bitops_std"] == 0
    assert levels["schedule.fw"]["4"]["train_bitops_mean"] < levels["schedule.fw"]["8"]["train_bitops_mean"]
    assert levels["schedule.bw"]["6"]["train_bitops_mean"] < levels["schedule.bw"]["8"]["train_bitops_mean"]
    # ... so the BitOPs verdict is `sensitive` (zero seed spread, different means); importance for both objectives
    assert {v["train_bitops_verdict"] for v in result["verdicts"].values()} == {"sensitive"}
    assert set(result["importance"]) == {"schedule.fw", "schedule.bw"}
    assert sum(result["importance_train_bitops"].values()) == pytest.approx(1.0)
    assert result["importance_evaluator"] == "fanova"

    # the tables for people went to stderr
    assert "per level (mean and std over seeds):" in out and "sensitivity verdicts:" in out
    assert "parameter importance (Optuna, fanova evaluator" in out

    # the report: written, and logged with the design on the sweep's parent run
    report = Path(result["report"])
    assert report.is_file() and report.parent == (tmp_path / "report").resolve()
    html = report.read_text()
    assert "Sensitivity" in html and "Verdict rule" in html and html.count('class="plotly-graph-div"') == 4
    assert {Path(p).name for p in result["report_pngs"]} >= {"pareto.png", "sensitivity.png", "importance.png"}
    c = store.client(sqlite_uri)
    parent = store.sweep_parent(c, "digits_ablation")
    assert parent.info.run_id == result["parent_run_id"] and parent.data.tags["fractune.ablation"] == "ofat"
    names = {a.path for a in c.list_artifacts(parent.info.run_id)}
    assert {"ablation.json", "pareto.json", "report"} <= names
    assert {"report/report.html", "report/sensitivity.png"} <= {a.path for a in c.list_artifacts(parent.info.run_id,
                                                                                                  "report")}
    children = store.child_runs(c, parent)
    assert sorted(json.loads(r.data.tags[store.POINT_TAG])["schedule.fw"] for r in children) == [4, 4, 8, 8, 8, 8]
    # every artifact is in <db folder>/mlartifacts/<experiment>, none in the cwd's ./mlruns
    assert not (tmp_path / "elsewhere" / "mlruns").exists() and not (tmp_path / "mlruns").exists()
    assert c.get_experiment(parent.info.experiment_id).artifact_location == \
        (tmp_path / "store" / "mlartifacts" / "digits_ablation").as_uri()
    on_disk = {p.name for p in (tmp_path / "store" / "mlartifacts" / "digits_ablation").rglob("*") if p.is_file()}
    assert {"ablation.json", "pareto.json", "report.html", "config.yaml"} <= on_disk
