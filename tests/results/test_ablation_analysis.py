"""Ablation specs and the analysis on hand-built tables: points, errors, per-level stats, pooled std,
verdicts and the direction of each objective in Optuna's importance."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from engine.errors import ConfigError
from orchestrator.cli.main import main
from results.ablation_analysis import analyse, frame, importances, level_stats, pooled_seed_std, verdict
from results.objectives import ACCURACY_OBJECTIVE as ACC
from results.objectives import PERPLEXITY_OBJECTIVE as PPL
from search_spaces.ablation import parse_ablation
from tests.conftest import ROOT

BASE = {"model": {"name": "tiny"}, "data": {"dataset": "digits"},
        "schedule": {"kind": "pfq", "mode": "auto", "fw": [3, 4, 6, 8], "bw": [6, 6, 8, 8], "eval_every": 2}}
OFAT = {"name": "abl", "base": BASE, "seeds": [0, 1],
        "ablation": {"mode": "ofat", "factors": {"schedule.epsilon": [0.02, 0.05, 0.15], "schedule.alpha": [0.3, 0.5]},
                     "baseline": {"schedule.epsilon": 0.05, "schedule.alpha": 0.5}}}
THRESHOLDS = {"moderate": 2.0, "sensitive": 4.0}


def test_ofat_points_vary_one_factor_around_the_baseline():
    la = parse_ablation(OFAT)
    assert la.points == [{"schedule.epsilon": 0.05, "schedule.alpha": 0.5},
                         {"schedule.epsilon": 0.02, "schedule.alpha": 0.5},
                         {"schedule.epsilon": 0.15, "schedule.alpha": 0.5},
                         {"schedule.epsilon": 0.05, "schedule.alpha": 0.3}]
    assert la.num_trials() == 8
    assert la.meta()["labels"] == {"schedule.epsilon": ["0.02", "0.05", "0.15"], "schedule.alpha": ["0.3", "0.5"]}


def test_grid_points_are_the_product_and_sections_are_levels():
    tree = {**OFAT, "ablation": {"mode": "grid", "factors": {
        "schedule.fw": [[3, 4, 6, 8], [4, 6, 8, 8]], "optim.lr": [0.05, 0.1, 0.2]}}}
    la = parse_ablation(tree)
    assert len(la.points) == 6 and la.num_trials() == 12
    assert la.meta()["labels"]["schedule.fw"] == ["[3, 4, 6, 8]", "[4, 6, 8, 8]"]


def test_every_error_at_once_one_line_per_problem():
    tree = {"name": "abl", "base": BASE, "parameters": {"optim.lr": {"grid": [0.1]}},
            "search": {"algorithm": "random"}, "resources": {"cpu": 0},
            "ablation": {"mode": "ofat", "importance": "shap",
                         "factors": {"schedule.epsilon": [0.02, 0.05], "schedule.alpha": [0.3], "a/b": [1, 2]},
                         "baseline": {"schedule.epsilon": 0.07, "optim.lr": 0.1}}}
    with pytest.raises(ConfigError) as info:
        parse_ablation(tree)
    fields = [f for f, _, _ in info.value.problems]
    for expected in ("ablation.importance", "ablation.factors.schedule.alpha", "ablation.factors.a/b",
                     "ablation.baseline.schedule.epsilon", "ablation.baseline.schedule.alpha",
                     "ablation.baseline.optim.lr", "parameters", "search.algorithm", "resources.cpu"):
        assert expected in fields, (expected, fields)


def test_a_bad_level_is_one_line_naming_the_factor_and_index():
    tree = {**OFAT, "ablation": {**OFAT["ablation"], "factors": {"schedule.epsilon": [0.02, 0.05, -1.0],
                                                                 "schedule.alpha": [0.3, 0.5]}}}
    with pytest.raises(ConfigError) as info:
        parse_ablation(tree)
    (line,) = info.value.lines()
    assert line.startswith("ablation.factors.schedule.epsilon[2]: schedule.epsilon: got -1.0")


def test_validate_accepts_both_presets_and_refuses_a_plain_sweep_for_ablate(capsys):
    for name in ("pfq_sensitivity.yaml", "cifar10_resnet38_pfq_sensitivity.yaml"):
        assert main(["validate", str(ROOT / "search_spaces" / name)]) == 0
    assert "valid ablation 'pfq_sensitivity', 12 trials" in capsys.readouterr().out
    assert main(["ablate", str(ROOT / "search_spaces" / "demo.yaml")]) == 2
    err = capsys.readouterr().err
    assert "ablation: got None; an ablation spec needs an ablation section" in err


def _rows(points, seeds, acc, cost):
    return [{"point": p, "seed": s, "accuracy": acc(p, s), "train_bitops": cost(p, s), "run_id": f"{i}-{s}"}
            for i, p in enumerate(points) for s in seeds]


def test_ofat_levels_use_only_baseline_rows_of_the_other_factors():
    meta = parse_ablation(OFAT).meta()
    points = parse_ablation(OFAT).points + [{"schedule.epsilon": 0.15, "schedule.alpha": 0.3}]  # off-design
    rows = _rows(points, [0, 1], lambda p, s: p["schedule.epsilon"] + p["schedule.alpha"] + 0.01 * s,
                 lambda p, s: 1e9 * (1 + s))
    lv = level_stats(frame(rows, list(meta["labels"]), "accuracy"), meta, "accuracy")
    assert list(lv["schedule.epsilon"]) == ["0.02", "0.05", "0.15"]
    assert lv["schedule.epsilon"]["0.15"]["n"] == 2  # the off-baseline (0.15, 0.3) point is left out
    assert lv["schedule.epsilon"]["0.15"]["accuracy_mean"] == pytest.approx(0.15 + 0.5 + 0.005)
    assert lv["schedule.alpha"]["0.5"] == lv["schedule.epsilon"]["0.05"]  # the baseline is on both curves
    assert lv["schedule.alpha"]["0.3"]["accuracy_std"] == pytest.approx(np.std([0.35, 0.36], ddof=1))
    assert lv["schedule.alpha"]["0.3"]["train_bitops_mean"] == pytest.approx(1.5e9)


def test_grid_levels_are_marginal_means():
    meta = {"mode": "grid", "labels": {"a": ["1", "2"], "b": ["x", "y"]}, "baseline": {}, "verdict": THRESHOLDS}
    rows = _rows([{"a": a, "b": b} for a in (1, 2) for b in ("x", "y")], [0],
                 lambda p, s: p["a"] * 10 + (1 if p["b"] == "y" else 0), lambda p, s: 1.0)
    lv = level_stats(frame(rows, ["a", "b"], "accuracy"), meta, "accuracy")
    assert lv["a"]["1"]["accuracy_mean"] == pytest.approx(10.5) and lv["a"]["2"]["n"] == 2
    assert lv["b"]["y"]["accuracy_mean"] == pytest.approx(16.0)


def test_pooled_seed_std_weights_cells_by_degrees_of_freedom():
    df = pd.DataFrame({"f": ["a", "a", "b", "b", "b", "c"], "accuracy": [1.0, 3.0, 0.0, 1.0, 5.0, 9.0]})
    expected = math.sqrt((1 * np.var([1, 3], ddof=1) + 2 * np.var([0, 1, 5], ddof=1)) / 3)  # c: one seed, no dof
    assert pooled_seed_std(df, ["f"], "accuracy") == pytest.approx(expected)
    assert math.isnan(pooled_seed_std(df[df.f == "c"], ["f"], "accuracy"))


def test_verdict_thresholds():
    assert verdict([0.90, 0.91], 0.01, THRESHOLDS)["verdict"] == "insensitive"  # ratio 1
    assert verdict([0.90, 0.93], 0.01, THRESHOLDS)["verdict"] == "moderate"  # ratio 3
    assert verdict([0.90, 0.95, 0.91], 0.01, THRESHOLDS) == {"verdict": "sensitive", "range": pytest.approx(0.05),
                                                              "ratio": pytest.approx(5.0)}
    assert verdict([1e9, 2e9], 0.0, THRESHOLDS)["verdict"] == "sensitive"  # deterministic costs that differ
    assert verdict([0.9, 0.9], 0.0, THRESHOLDS)["verdict"] == "insensitive"
    assert verdict([0.9, 0.95], float("nan"), THRESHOLDS)["verdict"] == "undetermined"  # one seed


@pytest.mark.slow
def test_importance_separates_objectives_and_minds_direction():
    """accuracy's best trials are decided by `a` (a > 0.9), its worst by `b`; BitOPs only by `c`.
    With the target's sign wrong, PED-ANOVA (which studies the lowest targets) would name `b`."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(120):
        p = {"a": float(rng.uniform()), "b": float(rng.uniform()), "c": float(rng.uniform())}
        acc = 1.0 if p["a"] > 0.9 else 0.5 - 0.4 * p["b"]
        rows.append({"point": p, "accuracy": acc, "train_bitops": 1e9 * (1 + 5 * p["c"]), "run_id": str(i)})
    for evaluator in ("ped_anova", "fanova"):
        imp = importances(rows, ["a", "b", "c"], ACC, evaluator)
        assert max(imp["train_bitops"], key=imp["train_bitops"].get) == "c", (evaluator, imp)
    ped = importances(rows, ["a", "b", "c"], ACC, "ped_anova")
    assert max(ped["accuracy"], key=ped["accuracy"].get) == "a", ped
    assert ped["evaluator"] == "ped_anova" and ped["trials"] == 120


def test_importance_with_categorical_levels_and_too_few_trials():
    rows = _rows([{"schedule": {"kind": k}} for k in ("fp32", "static", "pfq")], [0, 1],
                 lambda p, s: {"fp32": 0.9, "static": 0.8, "pfq": 0.85}[p["schedule"]["kind"]] + 0.001 * s,
                 lambda p, s: {"fp32": 10.0, "static": 2.0, "pfq": 1.0}[p["schedule"]["kind"]])
    imp = importances(rows, ["schedule"], ACC)
    assert imp["accuracy"] == {"schedule": pytest.approx(1.0)} and imp["train_bitops"] == {"schedule": pytest.approx(1.0)}
    few = importances(rows[:2], ["schedule"], ACC)
    assert few["accuracy"] == {} and "three or more" in few["note"]


def _forest(rows: list[dict], factor: str) -> dict:
    """Optuna's fANOVA fitted on one factor's trials (a two-objective study, as ``importances`` builds): per target,
    the normalized importances, or the error it raises."""
    import optuna

    from results.ablation_analysis import _distribution
    from search_spaces.ablation import level_label

    dist, cat = _distribution([r["point"][factor] for r in rows])
    study = optuna.create_study(directions=["maximize", "minimize"])
    for r in rows:
        value = level_label(r["point"][factor]) if cat else r["point"][factor]
        study.add_trial(optuna.trial.create_trial(params={factor: value}, distributions={factor: dist},
                                                  values=[r["accuracy"], r["train_bitops"]]))
    out = {}
    for i, name in enumerate(("accuracy", "train_bitops")):
        try:
            out[name] = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                target=lambda t, i=i: t.values[i])
        except RuntimeError as err:
            return {"error": str(err)}
    return out


@pytest.mark.parametrize("levels", [[{"kind": "fp32"}, {"kind": "static"}, {"kind": "pfq"}], [2, 4, 8],
                                    [0.05, 0.1, 0.2]], ids=["categorical", "int", "float"])
@pytest.mark.parametrize("accuracy, cost", [
    (lambda i, s: 0.8 + 0.01 * i + 0.001 * s, lambda i, s: 10.0 - i),
    (lambda i, s: 0.8 + 0.001 * s, lambda i, s: 10.0 - i),  # levels alike, seeds apart
    (lambda i, s: 0.8, lambda i, s: 10.0 - i),  # no variance in accuracy
    (lambda i, s: 0.8 + 0.01 * i, lambda i, s: 3.0),  # none in the cost
], ids=["levels apart", "seeds apart", "constant accuracy", "constant cost"])
def test_one_varied_factor_gets_what_fanovas_forest_gives(levels, accuracy, cost):
    """A sweep that varies one factor is answered without fitting fANOVA's forests: the same importances, and the
    same refusal when a target does not vary, as the forests give."""
    rows = [{"point": {"f": level}, "accuracy": accuracy(i, s), "train_bitops": cost(i, s), "run_id": f"{i}-{s}"}
            for i, level in enumerate(levels) for s in (0, 1)]
    forest = _forest(rows, "f")
    if "error" in forest:
        with pytest.raises(RuntimeError, match=forest["error"]):
            importances(rows, ["f"], ACC)
    else:
        imp = importances(rows, ["f"], ACC)
        assert {k: imp[k] for k in forest} == forest


def test_analyse_reports_levels_verdicts_and_importance():
    la = parse_ablation(OFAT)
    rng = np.random.default_rng(1)
    rows = _rows(la.points, [0, 1], lambda p, s: 0.8 + p["schedule.epsilon"] + rng.normal(0, 0.002),
                 lambda p, s: 1e10 * (1 + p["schedule.epsilon"]))
    a = analyse(rows, la.meta(), ACC)
    assert a["verdicts"]["schedule.epsilon"]["verdict"] == "sensitive"
    assert a["verdicts"]["schedule.alpha"]["train_bitops_verdict"] == "insensitive"
    assert set(a["importance"]["accuracy"]) == {"schedule.epsilon", "schedule.alpha"}
    assert "insensitive: ratio < 2" in a["verdict_rule"]


@pytest.mark.slow
def test_importance_per_cost_model():
    """Each cost model is its own objective: `c` decides BitOPs, `d` decides energy; MACs are constant."""
    from results.ablation_analysis import importances_by_objective

    rng = np.random.default_rng(1)
    rows = []
    for i in range(60):
        p = {"c": float(rng.uniform()), "d": float(rng.uniform())}
        rows.append({"point": p, "accuracy": 0.5 + 0.1 * p["c"], "run_id": str(i),
                     "costs": {"bitops": 1e9 * (1 + p["c"]), "energy": 5.0 + p["d"], "macs": 3.0}})
    imp = importances_by_objective(rows, ["c", "d"], {m: (lambda r, m=m: r["costs"][m])
                                                      for m in ("bitops", "energy", "macs")}, ACC, "fanova")
    assert max(imp["bitops"], key=imp["bitops"].get) == "c" and max(imp["energy"], key=imp["energy"].get) == "d"
    assert imp["macs"] == {} and imp["constant"] == ["macs"] and imp["trials"] == 60
    assert max(imp["accuracy"], key=imp["accuracy"].get) == "c"


@pytest.mark.slow
def test_language_model_importance_follows_perplexity_minimized():
    """LM rows (they report test perplexity): the task objective is perplexity, minimized. The lowest perplexity
    is decided by `a` (a > 0.85), the highest by `b`; next-token accuracy only by `d`, BitOPs only by `c`. Studied as
    accuracy, importance would name `d`; with perplexity's sign wrong, PED-ANOVA (which studies the lowest
    targets) would name `b`."""
    from results.ablation_analysis import importances_by_objective

    rng = np.random.default_rng(0)
    rows = []
    for i in range(120):
        p = {k: float(rng.uniform()) for k in "abcd"}
        ppl = 20.0 if p["a"] > 0.85 else 60.0 + 40.0 * p["b"]
        rows.append({"point": p, "perplexity": ppl, "accuracy": 0.2 + 0.2 * p["d"], "run_id": str(i),
                     "train_bitops": 1e9 * (1 + 5 * p["c"]), "costs": {"bitops": 1e9 * (1 + 5 * p["c"])}})
    ped = importances(rows, list("abcd"), PPL, "ped_anova")
    assert ped["objective"] == "perplexity" and ped["direction"] == "minimize" and "accuracy" not in ped
    assert max(ped["perplexity"], key=ped["perplexity"].get) == "a", ped
    assert max(ped["train_bitops"], key=ped["train_bitops"].get) == "c", ped
    fanova = importances(rows, list("abcd"), PPL, "fanova")
    assert max(fanova["perplexity"], key=fanova["perplexity"].get) in {"a", "b"}
    assert fanova["perplexity"]["d"] < 0.05  # next-token accuracy's factor explains none of the perplexity
    # the report's importance (one study per cost model) names the objective the same way: no workaround there
    by_model = importances_by_objective(rows, list("abcd"), {"bitops": lambda r: r["costs"]["bitops"]}, PPL, "ped_anova")
    assert by_model["objective"] == "perplexity" and by_model["direction"] == "minimize" and "accuracy" not in by_model
    assert max(by_model["perplexity"], key=by_model["perplexity"].get) == "a"
    # a classifier's rows keep accuracy, maximized
    classic = importances(_rows([{"a": 1}, {"a": 2}, {"a": 3}], [0], lambda p, s: 0.1 * p["a"], lambda p, s: p["a"]), ["a"], ACC)
    assert classic["objective"] == "accuracy" and classic["direction"] == "maximize" and classic["accuracy"]


def test_language_model_ablation_levels_verdicts_and_printout(capsys):
    """An ablation of a language model: levels, pooled std and verdicts on test perplexity (lower is better)."""
    from orchestrator.cli.commands_ablate import print_analysis

    la = parse_ablation(OFAT)
    rng = np.random.default_rng(1)
    rows = [{**r, "perplexity": 100.0 + 200 * r["point"]["schedule.epsilon"] + rng.normal(0, 0.05)}
            for r in _rows(la.points, [0, 1], lambda p, s: 0.3 + 0.01 * s, lambda p, s: 1e10 * (1 + p["schedule.alpha"]))]
    a = analyse(rows, la.meta(), PPL)
    assert a["objective"] == "perplexity" and a["direction"] == "minimize"
    level = a["levels"]["schedule.epsilon"]["0.15"]
    assert level["perplexity_mean"] == pytest.approx(130.0, abs=0.2) and "accuracy_mean" not in level
    assert set(a["pooled_seed_std"]) == {"perplexity", "train_bitops"}
    assert a["verdicts"]["schedule.epsilon"]["verdict"] == "sensitive"
    assert a["verdicts"]["schedule.epsilon"]["range"] == pytest.approx(26.0, abs=0.3)
    assert a["verdicts"]["schedule.alpha"]["verdict"] == "insensitive"  # the accuracies differ by seed only
    assert set(a["importance"]["perplexity"]) == {"schedule.epsilon", "schedule.alpha"}
    print_analysis(a)
    out = capsys.readouterr().out
    assert "perplexity_mean" in out and "for_perplexity" in out and "test perplexity (minimize)" in out
    assert "accuracy" not in out
