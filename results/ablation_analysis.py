"""Ablation analysis over finished trials: per-level mean/std, Optuna parameter importance, verdicts.

Pure functions of a list of rows (one per finished trial: its point ``{path: value}``, ``seed``, the task
objective and ``train_bitops``) and the design (``meta``: mode, factors' level labels, baseline, evaluator,
verdict thresholds; ``search_spaces.ablation.LoadedAblation.meta``). Reports and ``fractune ablate`` call
``analyse``; tests call the pieces on hand-built tables.

The task objective is the sweep's (``results.objectives.Objective``, resolved once when the rows were read:
``results.runs.SweepRuns.task``), passed in: final test ``accuracy`` (maximize) for classifiers, test
``perplexity`` (minimize) for language models. Every statistic,
verdict and importance is keyed by its name (``accuracy_mean`` or ``perplexity_mean``, ``importance["accuracy"]``
or ``importance["perplexity"]``); the cost objective is ``train_bitops`` (minimize).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pandas as pd

from engine.metrics import TRAIN_BITOPS
from results.objectives import Objective
from search_spaces.ablation import level_label

COST = (TRAIN_BITOPS, "minimize")  # the cost objective (a cost model's cost is put in this column)


def objectives(task: Objective) -> tuple[tuple[str, str], tuple[str, str]]:
    """The two objectives of a study, Optuna's way: the task objective (accuracy maximize, or a language model's
    test perplexity minimize) and the cost (``train_bitops`` minimize)."""
    return (task.key, task.direction.optuna), COST


def frame(rows: list[dict], factors: list[str], task: str) -> pd.DataFrame:
    """One row per trial with a finite task objective (``task``: its metric key) and BitOPs; factor columns hold
    the level labels."""
    records = []
    for r in rows:
        quality, cost = r.get(task), r.get(TRAIN_BITOPS)
        if quality is None or cost is None or not (math.isfinite(quality) and math.isfinite(cost)):
            continue
        point = r.get("point") or {}
        if any(f not in point for f in factors):
            continue  # a trial of another design (e.g. a sweep of this name with other parameters)
        records.append({**{f: level_label(point[f]) for f in factors}, "seed": r.get("seed"),
                        task: float(quality), TRAIN_BITOPS: float(cost), "run_id": r.get("run_id")})
    return pd.DataFrame.from_records(records, columns=[*factors, "seed", task, TRAIN_BITOPS, "run_id"])


def level_stats(df: pd.DataFrame, meta: dict, task: str) -> dict[str, dict[str, dict]]:
    """Per factor and level: mean and std (over seeds; ddof 1) of the task objective (``accuracy_mean``, or a
    language model's ``perplexity_mean``...) and BitOPs, and n.

    ofat: a factor's curve uses the trials with every other factor at its baseline level (the baseline
    point belongs to every curve). grid: marginal means over all trials at that level.
    """
    out: dict[str, dict[str, dict]] = {}
    factors = list(meta["labels"])
    for f in factors:
        sub = df
        if meta["mode"] == "ofat":
            for other in factors:
                if other != f:
                    sub = sub[sub[other] == meta["baseline"][other]]
        groups = sub.groupby(f, sort=False)[[task, TRAIN_BITOPS]].agg(["mean", "std", "count"])
        levels = {}
        for label in meta["labels"][f]:  # the spec's order, not pandas' (levels are labels, not numbers)
            if label not in groups.index:
                continue
            g = groups.loc[label]
            levels[label] = {f"{task}_mean": g[(task, "mean")], f"{task}_std": g[(task, "std")],
                             "train_bitops_mean": g[(TRAIN_BITOPS, "mean")],
                             "train_bitops_std": g[(TRAIN_BITOPS, "std")], "n": int(g[(task, "count")])}
        out[f] = levels
    return out


def pooled_seed_std(df: pd.DataFrame, factors: list[str], column: str) -> float:
    """sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)) over the points (cells) run with two or more seeds; NaN if none."""
    if df.empty:
        return float("nan")
    g = df.groupby(factors, sort=False)[column].agg(["var", "count"])
    g = g[g["count"] >= 2]
    dof = (g["count"] - 1).sum()
    return math.sqrt(float(((g["count"] - 1) * g["var"]).sum() / dof)) if dof > 0 else float("nan")


def verdict(level_means: list[float], pooled_std: float, thresholds: dict) -> dict:
    """ratio = (max - min of the level means) / pooled seed std, compared with the two thresholds."""
    means = [m for m in level_means if m is not None and math.isfinite(m)]
    spread = max(means) - min(means) if len(means) >= 2 else float("nan")
    if not math.isfinite(spread) or not math.isfinite(pooled_std):
        return {"verdict": "undetermined", "range": spread, "ratio": float("nan"),
                "why": "needs two levels with results and a point run with two or more seeds"}
    ratio = spread / pooled_std if pooled_std > 0 else (math.inf if spread > 0 else 0.0)
    word = ("sensitive" if ratio >= thresholds["sensitive"] else "moderate" if ratio >= thresholds["moderate"]
            else "insensitive")
    return {"verdict": word, "range": spread, "ratio": ratio}


def verdict_rule(thresholds: dict) -> str:
    m, s = thresholds["moderate"], thresholds["sensitive"]
    return (f"ratio = (max - min of a factor's level means) / pooled within-point seed std; "
            f"insensitive: ratio < {m:g}, moderate: {m:g} <= ratio < {s:g}, sensitive: ratio >= {s:g}")


def _distribution(values: list[Any]):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric and all(isinstance(v, int) for v in values):
        return IntDistribution(min(values), max(values)), False
    if numeric:
        return FloatDistribution(float(min(values)), float(max(values))), False
    return CategoricalDistribution(sorted({level_label(v) for v in values})), True


def importances(rows: list[dict], factors: list[str], objective: Objective, evaluator: str = "fanova") -> dict:
    """Optuna's importance of each factor, for the task objective and for BitOPs separately, from an in-memory
    two-objective study (``objectives``: accuracy maximize, or a language model's test perplexity minimize;
    BitOPs minimize) holding one trial per finished run. Keyed by the objectives' names (``accuracy`` or
    ``perplexity``, ``train_bitops``), with ``objective`` and ``direction`` naming the task objective."""
    (task, direction), _ = study_objectives = objectives(objective)
    usable = [r for r in rows if all(f in (r.get("point") or {}) for f in factors)
              and math.isfinite(r.get(task, math.nan)) and math.isfinite(r.get(TRAIN_BITOPS, math.nan))]
    varied = [f for f in factors if len({level_label(r["point"][f]) for r in usable}) > 1]
    out = {"evaluator": evaluator, "objective": task, "direction": direction, task: {}, TRAIN_BITOPS: {},
           "trials": len(usable)}
    if len(usable) < 3 or not varied:
        out["note"] = "needs three or more finished trials and a factor with two or more levels"
        return out
    if len(varied) == 1 and evaluator == "fanova":
        return _one_factor(out, usable, varied[0], task)
    import optuna

    dists = {f: _distribution([r["point"][f] for r in usable]) for f in varied}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[d for _, d in study_objectives])
    for r in usable:
        params = {f: level_label(r["point"][f]) if cat else r["point"][f] for f, (_, cat) in dists.items()}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={f: d for f, (d, _) in dists.items()},
            values=[r[task], r[TRAIN_BITOPS]], user_attrs={"run_id": r.get("run_id")}))
    # Each evaluator gets one objective through `target`. PED-ANOVA ranks low targets as good (it warns when
    # given a target), so an objective to maximize (accuracy) goes in negated, one to minimize (perplexity,
    # BitOPs) as it is; fANOVA and MDI are variance-based and sign-blind.
    sign = -1.0 if direction == "maximize" else 1.0
    targets = {task: lambda t: sign * t.values[0], TRAIN_BITOPS: lambda t: t.values[1]}
    for name, target in targets.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imp = optuna.importance.get_param_importances(study, evaluator=_evaluator(evaluator), target=target)
        out[name] = {k: float(v) for k, v in imp.items()}
    return out


def _one_factor(out: dict, usable: list[dict], factor: str, task: str) -> dict:
    """fANOVA's answer for a single varied factor, without fitting its forests (or importing scikit-learn, which
    they need): the factor explains all the variance there is, so its normalized importance is 1.0; a target with
    no variance at all is refused with fANOVA's own error. Most sweeps vary one factor (the schedule)."""
    for name in (task, TRAIN_BITOPS):
        if len({r[name] for r in usable}) < 2:
            raise RuntimeError("Encountered zero total variance in all trees.")
        out[name] = {factor: 1.0}
    return out


def importances_by_objective(rows: list[dict], factors: list[str], costs: dict, objective: Objective,
                             evaluator: str = "fanova") -> dict:
    """Each factor's importance for the task objective (accuracy, or a language model's test perplexity:
    ``objectives``) and for the training cost under each cost model: ``costs`` maps a model name to a function
    of a row giving its cost (``results.runs.cost_of``). One two-objective study per model (the task
    objective, that cost), so each model's importance is computed from the trials that logged it."""
    (task, direction), _ = objectives(objective)
    out: dict = {"evaluator": evaluator, "objective": task, "direction": direction, "trials": 0, task: {}}
    for name, cost in costs.items():
        priced = [{**r, TRAIN_BITOPS: cost(r)} for r in rows]
        values = {p[TRAIN_BITOPS] for p in priced if math.isfinite(p[TRAIN_BITOPS])}
        if len(values) < 2:  # e.g. MACs across precisions: no variance to explain
            out[name] = {}
            out.setdefault("constant", []).append(name)
            continue
        try:
            imp = importances(priced, factors, objective, evaluator)
        except RuntimeError as exc:  # an evaluator that cannot fit these trials (fANOVA: no variance in a tree)
            out[name] = {}
            out["note"] = f"{name}: {exc}"
            continue
        out[task] = out[task] or imp[task]
        out["trials"] = max(out["trials"], imp["trials"])
        out[name] = imp[TRAIN_BITOPS]
        if "note" in imp:
            out["note"] = imp["note"]
    return out


def _evaluator(name: str):
    from optuna import importance as oi

    if name == "ped_anova":
        return oi.PedAnovaImportanceEvaluator()
    if name == "mdi":
        return oi.MeanDecreaseImpurityImportanceEvaluator(seed=0)
    return oi.FanovaImportanceEvaluator(seed=0)


def analyse(rows: list[dict], meta: dict, objective: Objective) -> dict:
    """Levels, pooled seed std, verdicts and importance of an ablation's finished trials, on the task objective
    (``objectives``: accuracy, or a language model's test perplexity; named in ``objective`` and ``direction``)
    and BitOPs. A verdict measures the spread of the level means, so it reads the same either way."""
    factors = list(meta["labels"])
    study = objectives(objective)
    (task, direction), _ = study
    df = frame(rows, factors, task)
    levels = level_stats(df, meta, task)
    pooled = {c: pooled_seed_std(df, factors, c) for c, _ in study}
    verdicts = {}
    for f, lv in levels.items():
        quality = verdict([s[f"{task}_mean"] for s in lv.values()], pooled[task], meta["verdict"])
        cost = verdict([s["train_bitops_mean"] for s in lv.values()], pooled[TRAIN_BITOPS], meta["verdict"])
        verdicts[f] = {**quality, "train_bitops_verdict": cost["verdict"], "train_bitops_ratio": cost["ratio"]}
    return {"mode": meta["mode"], "objective": task, "direction": direction, "trials": int(len(df)),
            "levels": levels, "pooled_seed_std": pooled,
            "verdicts": verdicts, "verdict_rule": verdict_rule(meta["verdict"]),
            "importance": importances(rows, factors, objective, meta.get("importance", "fanova"))}
