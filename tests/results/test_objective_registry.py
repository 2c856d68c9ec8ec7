"""One new objective registered in ``results.objectives`` (here, inside the test; no other file touched) is
enough for the front (``pareto``), the results page and the report to rank, label and print by it."""

from __future__ import annotations

import math

import pytest

from dashboards import figures, report
from dashboards.data import SweepData
from dashboards.results_page import markdown
from engine.config.experiment import parse_config
from results import objectives, runs
from results.objectives import Direction, Objective
from results.summary import front_of, summarise, trends

BLEU = Objective("bleu", Direction.MAX, "test BLEU", "BLEU", "BLEU", "bleu", scale=1.0, fmt=".2f", tolerance=0.5)


@pytest.fixture
def bleu():
    objectives.register(BLEU)
    yield BLEU
    objectives.unregister(BLEU.key)


def _row(kind: str, bits: int | None, bleu: float, bitops: float, seed: int = 0) -> dict:
    schedule = {"kind": kind} if bits is None else {"kind": kind, "fw": bits, "bw": 8}
    metrics = {"bleu": bleu, "accuracy": 0.5, "train_bitops": bitops, "cum_cp": 10.0, "epoch": 1, "wall_seconds": 1.0}
    name = f"{kind}{bits or ''} s{seed}"
    row = runs.make_row(run_id=name, trial_id=name, name=name, status="FINISHED", schedule=kind, metrics=metrics,
                        seed=seed, point={"schedule": schedule}, planned_epochs=1)
    row["config"] = parse_config({"model": {"name": "tiny"}, "data": {"dataset": "digits"}, "schedule": schedule,
                                  "seed": seed})
    return row


def _rows() -> list[dict]:
    return [_row("fp32", None, 30.0, 400.0), _row("static", 8, 29.8, 100.0), _row("static", 4, 25.0, 30.0),
            _row("static", 6, 24.0, 60.0)]  # FW6 is dominated by FW4: cheaper and better


def test_a_registered_objective_is_resolved_and_ranks_the_front(bleu):
    rows = _rows()
    assert objectives.of_rows(rows) is bleu and rows[0]["bleu"] == 30.0
    front = runs.front(rows, bleu)
    assert [r["name"] for r in front] == ["static4 s0", "static8 s0", "fp32 s0"]
    entry = runs.front_entry(front[0], bleu)
    assert entry["bleu"] == 25.0 and entry["method"] == "static" and entry["name"] == "static4 s0"
    quality = runs.front_quality(runs.finished(rows, bleu), front, bleu, "bitops")
    assert quality["task_objective"] == "bleu" and "(cost / reference cost, bleu)" in quality["rule"]
    assert math.isfinite(quality["hypervolume"])


def test_the_results_page_uses_a_registered_objective(bleu):
    rows = _rows()
    data = SweepData("sqlite://", "mt", "mt-1", "1", "p", rows, ["schedule"], task=objectives.of_rows(rows))
    groups = summarise(rows, data.task)
    assert {g["method"]: g["bleu_mean"] for g in groups}["FW4/BW8"] == 25.0
    assert groups[0]["bleu_delta_vs_fw8bw8_pp"] == pytest.approx(0.2)  # fp32 (the dearest, first) vs FW8/BW8
    front = front_of(groups, data.task)
    checks = trends(groups, data.task)
    page = markdown(data, groups, checks, front, "plot.png", "fractune results mt", None, {})
    assert "## BLEU and training BitOPs" in page and "| method | seeds | BLEU |" in page
    assert "bleu vs FW8/BW8 (pp)" in page and "final test BLEU" in page
    assert "its worst seed's BLEU is no more than 0.5 point below the reference's mean" in page
    assert "8-bit training (FW8/BW8, SBM) matches FP32 bleu" in page  # the claims name the objective


def test_the_report_uses_a_registered_objective(bleu, tmp_path):
    from dashboards import pngs

    rows = _rows()
    task = objectives.of_rows(rows)
    front = runs.front(rows, task)
    fig = figures.pareto_figure(rows, front, task)
    assert fig.layout.yaxis.title.text == "test BLEU" and "bleu max" in fig.layout.title.text
    assert "bleu 25.00" in fig.data[-1].text[0]  # the hover prints it in its format
    assert pngs.pareto_png(rows, front, tmp_path / "p.png", task).is_file()
    table = report._front_rows(front, task)
    assert [r["bleu"] for r in table] == [25.0, 29.8, 30.0]
    data = SweepData("sqlite://", "mt", "mt-1", "1", "p", rows, ["schedule"], task=task)
    assert "<th>bleu</th>" in report._trials_table(data)
    assert figures.importance_title("bleu") == "for BLEU"
