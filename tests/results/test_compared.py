"""The trials a sweep compares (``results.runs.compared_rows``): a staged sweep's stages that others start from
are left out of its front, its statistics and its MLflow summary; stages side by side are compared whole."""

from __future__ import annotations

import pytest

from dashboards import mlflow_view
from results import runs
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.summary import compared_what, staged_comparison


def _row(name, stage, acc, bitops, init_stage=None, init_accuracy=None):
    metrics = {"accuracy": acc, "train_bitops": bitops, "cum_cp": 10.0, "epoch": 1, "wall_seconds": 1.0}
    r = runs.make_row(run_id=name, trial_id=name, name=name, status="FINISHED", schedule="static",
                      metrics=metrics, seed=0, point={}, planned_epochs=1)
    r.update(stage=stage, init_stage=init_stage, init_run="pre" if init_stage else None,
             init_accuracy=float("nan") if init_accuracy is None else init_accuracy)
    return r


# the pretrain run is the most accurate and the costliest: on a front over every trial it would sit at the top
PRETRAIN = _row("pretrain-fp32 s0", "pretrain", 0.90, 1000.0)
RETRAIN = [_row("retrain-fp32 s0", "retrain", 0.70, 1000.0, "pretrain", 0.60),
           _row("retrain-static s0", "retrain", 0.68, 60.0, "pretrain", 0.60)]
CONTROL = _row("control-static s0", "control", 0.50, 30.0)


def _sweep(rows, stages):
    return runs.SweepRuns("u", "s", "s-1", "1", "p", rows, [], task=ACC, stages=stages)


def test_a_chained_sweep_compares_the_stage_that_started_from_the_other():
    rows = [PRETRAIN, *RETRAIN]
    assert runs.start_stages(rows) == ["pretrain"] and runs.compared_rows(rows) == RETRAIN
    assert runs.compared_stages(rows, ("pretrain", "retrain")) == ["retrain"]
    data = _sweep(rows, ("pretrain", "retrain"))
    assert [r["name"] for r in data.front()] == ["retrain-static s0", "retrain-fp32 s0"]
    assert len(data.finished()) == 2 and len(data.rows) == 3
    compared, refs = staged_comparison(data)
    assert compared.rows == RETRAIN and compared_what(compared) == "the last stage (retrain)"
    assert compared_what(compared, "methods") == "the last stage's methods"
    assert [r["stage"] for r in refs] == ["pretrain", "retrain before any step (init_accuracy)"]
    assert refs[0]["accuracy_mean"] == pytest.approx(0.90) and refs[1]["accuracy_mean"] == pytest.approx(0.60)


def test_the_mlflow_summary_counts_every_trial_and_takes_its_front_over_the_compared_ones():
    rows = [PRETRAIN, *RETRAIN]
    metrics = mlflow_view.summary_metrics(rows, ACC)
    assert metrics["sweep/trials"] == 3 and metrics["sweep/finished"] == 3
    assert metrics["sweep/front_size"] == 2 and metrics["sweep/best_accuracy"] == pytest.approx(0.70)
    note = mlflow_view.note("1", "s-1", rows, ACC, metrics, None)
    assert "2 on the Pareto front of stage retrain" in note and "pretrain-fp32" not in note
    view = mlflow_view.view_state("s-1", rows, [], ACC)
    assert "tags.`fractune.stage`" in view["selectedColumns"]  # every trial shown, each with its stage
    plain = [dict(r, stage=None, init_stage=None, init_run=None) for r in rows]
    assert "of stage" not in mlflow_view.note("1", "s-1", plain, ACC, mlflow_view.summary_metrics(plain, ACC), None)
    assert "tags.`fractune.stage`" not in mlflow_view.view_state("s-1", plain, [], ACC)["selectedColumns"]


def test_stages_side_by_side_are_compared_whole():
    rows = [*[dict(r, init_stage=None, init_run=None) for r in RETRAIN], CONTROL]
    assert runs.start_stages(rows) == [] and runs.compared_rows(rows) == rows
    assert runs.compared_stages(rows, ("retrain", "control")) == []
    data = _sweep(rows, ("retrain", "control"))
    assert len(data.front()) == 3 and staged_comparison(data) == (data, [])


def test_a_stage_no_other_starts_from_is_compared_beside_the_retrain():
    rows = [CONTROL, PRETRAIN, *RETRAIN]
    order = ("pretrain", "retrain", "control")
    assert runs.compared_rows(rows) == [CONTROL, *RETRAIN]
    assert runs.compared_stages(rows, order) == ["retrain", "control"]  # in the sweep's order
    compared, refs = staged_comparison(_sweep(rows, order))
    assert compared_what(compared) == "the stages retrain, control"
    assert compared_what(compared, "methods") == "the methods of the stages retrain, control"
    assert refs[0]["stage"] == "pretrain" and len(refs) == 2
