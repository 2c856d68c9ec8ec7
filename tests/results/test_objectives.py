"""A sweep's task objective follows its task: accuracy (max) for classifiers, test perplexity (min) for language
models; the cost objective is any cost model (the spec's ``objective``). The rows, the front, its JSON entries
and its hypervolume follow both (pure functions, no Ray or MLflow)."""

from __future__ import annotations

import math

import pytest

from orchestrator.sweep import space
from results import objectives, runs
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.objectives import PERPLEXITY_OBJECTIVE as PPL
from results.pareto import pareto_rows
from search_spaces.spec import load_spec


def _row(name, bitops, acc, ppl=None, energy=None):
    metrics = {"accuracy": acc, "train_bitops": bitops, "cum_cp": 10.0, "epoch": 1, "wall_seconds": 1.0}
    if energy is not None:
        metrics["train_cost_energy"] = energy
    if ppl is not None:
        metrics["perplexity"] = ppl
    return runs.make_row(run_id=name, trial_id=name, name=name, status="FINISHED", schedule="static",
                         metrics=metrics, seed=0, point={}, planned_epochs=1)


def test_language_model_rows_rank_on_perplexity_min():
    rows = [_row("a", 100.0, 0.30, 50.0), _row("b", 50.0, 0.31, 80.0), _row("c", 60.0, 0.40, 90.0),
            _row("d", 200.0, 0.20, 49.0)]
    assert objectives.of_rows(rows) is PPL and (PPL.key, PPL.mode) == ("perplexity", "min")
    front = runs.front(rows, PPL)
    # by perplexity: b (cheapest), a (lower ppl), d (lowest ppl); c is dominated by b although more accurate
    assert [r["name"] for r in front] == ["b", "a", "d"]
    entry = runs.front_entry(front[0], PPL)
    assert entry["perplexity"] == 80.0 and entry["accuracy"] == 0.31


def test_classifier_rows_keep_accuracy_max():
    rows = [_row("a", 100.0, 0.9), _row("b", 50.0, 0.8), _row("c", 60.0, 0.7)]
    assert objectives.of_rows(rows) is ACC and str(ACC) == "accuracy max"
    assert [r["name"] for r in runs.front(rows, ACC)] == ["b", "a"]
    assert "perplexity" not in runs.front_entry(rows[0], ACC) and math.isnan(rows[0]["perplexity"])


def test_pareto_rows_minimising_the_objective():
    rows = [{"v": 3.0, "c": 1.0}, {"v": 2.0, "c": 2.0}, {"v": 4.0, "c": 3.0}, {"v": float("nan"), "c": 0.5}]
    assert [r["v"] for r in pareto_rows(rows, "v", "c", maximize=False)] == [3.0, 2.0]
    assert [r["v"] for r in pareto_rows(rows, "v", "c")] == [3.0, 4.0]


def test_sweep_objectives_default_from_the_task():
    assert space.tune_metrics(load_spec("search_spaces/lm_demo.yaml")) == (("perplexity", "min"), ("train_bitops", "min"))
    assert space.tune_metrics(load_spec("search_spaces/demo.yaml")) == (("accuracy", "max"), ("train_bitops", "min"))


def test_task_and_cost_objectives_combine():
    lm = load_spec("search_spaces/lm_demo.yaml").with_objective("energy")
    assert space.tune_metrics(lm) == (("perplexity", "min"), ("train_cost_energy", "min"))
    assert objectives.of_spec(lm) is PPL
    classifier = load_spec("search_spaces/demo.yaml").with_objective("int_units")
    assert space.tune_metrics(classifier) == (("accuracy", "max"), ("train_cost_int_units", "min"))


def test_language_model_front_under_another_cost_model():
    # b is cheapest in BitOPs, a in energy; d has the lowest perplexity
    rows = [_row("a", 100.0, 0.30, 50.0, energy=10.0), _row("b", 50.0, 0.31, 80.0, energy=40.0),
            _row("d", 200.0, 0.20, 49.0, energy=30.0)]
    assert [r["name"] for r in runs.front(rows, PPL, "energy")] == ["a", "d"]
    entry = runs.front_entry(runs.front(rows, PPL, "energy")[0], PPL, "energy")
    assert entry["perplexity"] == 50.0 and entry["objective"] == "energy" and entry["cost"] == 10.0
    done = runs.finished(rows, PPL, "energy")
    q = runs.front_quality(done, runs.front(rows, PPL, "energy"), PPL, "energy")
    # quality 1/perplexity from the reference (perplexity infinity, the dearest energy 40): a to d, then d to 40
    assert q["task_objective"] == "perplexity" and "1 / test perplexity" in q["rule"]
    assert q["hypervolume"] == pytest.approx((30 - 10) / 40 / 50 + (40 - 30) / 40 / 49)
    classic = [_row("x", 1.0, 0.5), _row("y", 2.0, 0.9)]
    assert runs.front_quality(classic, runs.front(classic, ACC), ACC, "bitops")["task_objective"] == "accuracy"


def test_report_figure_plots_perplexity_for_language_models():
    from dashboards.figures import pareto_figure

    rows = [_row("a", 100.0, 0.30, 50.0), _row("b", 50.0, 0.31, 80.0)]
    fig = pareto_figure(rows, runs.front(rows, PPL), PPL)
    assert fig.layout.yaxis.title.text == "test perplexity" and "perplexity min" in fig.layout.title.text
    assert sorted(fig.data[0].y) == [50.0, 80.0]
    classic = pareto_figure([_row("c", 1.0, 0.9)], [], ACC)
    assert classic.layout.yaxis.title.text == "test accuracy"


def test_mlflow_view_of_a_language_model_sorts_and_charts_perplexity():
    from dashboards import mlflow_view

    rows = [_row("a", 100.0, 0.30, 50.0), _row("b", 50.0, 0.31, 80.0), _row("d", 200.0, 0.20, 49.0)]
    view = mlflow_view.view_state("lm-1", rows, [], PPL)
    assert view["orderByKey"] == "metrics.`perplexity`" and view["orderByAsc"] is True  # lowest first
    assert "metrics.`perplexity`" in view["selectedColumns"] and "metrics.`accuracy`" not in view["selectedColumns"]
    charts = {c["uuid"]: c for c in view["compareRunCharts"]}
    assert charts["fractune-chart-1"]["yaxis"]["key"] == "perplexity"
    assert charts["fractune-chart-1"]["displayName"] == "test perplexity vs training BitOPs (every trial)"
    assert charts["fractune-chart-3"]["selectedMetrics"] == ["perplexity", "train_bitops", "cum_cp"]
    assert charts["fractune-chart-4"]["metricKey"] == "perplexity"
    metrics = mlflow_view.summary_metrics(rows, PPL)
    assert metrics["sweep/best_perplexity"] == 49.0 and "sweep/best_accuracy" not in metrics
    text = mlflow_view.note("1", "lm-1", rows, PPL, metrics, None)
    assert "sorted by test perplexity" in text and "(perplexity min, training BitOPs min)" in text
    classic = mlflow_view.view_state("c-1", [_row("x", 1.0, 0.5)], [], ACC)
    assert classic["orderByKey"] == "metrics.`accuracy`" and classic["orderByAsc"] is False


def test_sensitivity_figure_of_a_language_model_plots_perplexity():
    from dashboards.figures import importance_objectives, sensitivity_figure

    levels = {"f": {"1": {"perplexity_mean": 50.0, "perplexity_std": 1.0, "train_bitops_mean": 1e9,
                          "train_bitops_std": 0.0, "n": 2},
                    "2": {"perplexity_mean": 60.0, "perplexity_std": 1.0, "train_bitops_mean": 2e9,
                          "train_bitops_std": 0.0, "n": 2}}}
    fig = sensitivity_figure(levels, {"f": {"verdict": "sensitive", "train_bitops_verdict": "sensitive"}}, PPL)
    assert list(fig.data[0].y) == [50.0, 60.0] and fig.layout.yaxis.title.text == "test perplexity"
    assert "f: perplexity (sensitive)" in [a.text for a in fig.layout.annotations]
    imp = {"evaluator": "fanova", "objective": "perplexity", "direction": "minimize", "trials": 4,
           "perplexity": {"f": 1.0}, "train_bitops": {"f": 1.0}}
    assert importance_objectives(imp) == ["perplexity", "train_bitops"]
