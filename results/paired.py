"""A spec's paired test (docs/sweeps.md, "Paired tests"), decided from a sweep's rows: each pair's runs matched by
seed, the per-seed differences, their mean with a 95 % t-interval, and the verdict the spec's rule gives.

The rule is the spec's (``search_spaces.schema.Paired``), stated before the numbers: the claim holds when every
difference of the deciding pairs is >= 0 and their mean > 0; it is refuted when every one is < 0 and their mean is
below -``refute_margin``; otherwise it is undecided. A difference is the arm's advantage on the task objective:
accuracy in points (arm minus twin), or how many percent lower the arm's test perplexity is than the twin's.
"""

from __future__ import annotations

import math
import statistics

from engine.metrics import TRAIN_BITOPS
from results.objectives import Direction, Objective
from results.runs import SweepRuns
from results.store import artifact_json
from search_spaces.schema import Paired, picks

# two-sided 95 % quantiles of Student's t by degrees of freedom (beyond 30: the normal's 1.96)
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(dof: int) -> float:
    return T95[dof - 1] if 1 <= dof <= len(T95) else 1.96


def advantage(arm: dict, twin: dict, task: Objective) -> float:
    """The arm's advantage over its twin: accuracy in points, or percent lower test perplexity (``relative``)."""
    key = task.key
    better = arm[key] - twin[key] if task.direction is Direction.MAX else twin[key] - arm[key]
    return 100.0 * better / twin[key] if task.relative else task.scale * better


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95 % t-interval (NaN bounds with fewer than two values)."""
    mean = statistics.fmean(values) if values else math.nan
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def pair_up(rows: list[dict], paired: Paired, objective: Objective) -> list[dict]:
    """Every pair with its runs matched by seed: ``seeds`` (per seed: the arm's and the twin's objective, BitOPs
    and the difference), the methods' names, ``mean``/``low``/``high`` of the differences and ``control``. Rows
    carry ``config`` (their resolved ExperimentConfig) and ``method``."""
    task = objective.key
    dumps = [(r, r["config"].to_dict()) for r in rows if r.get("config") is not None]
    out = []
    for pair in paired.pairs:
        arm = {r["seed"]: r for r, tree in dumps if picks(pair.arm, tree)}
        twin = {r["seed"]: r for r, tree in dumps if picks(pair.twin, tree)}
        seeds = []
        for seed in sorted(set(arm) & set(twin)):
            a, t = arm[seed], twin[seed]
            seeds.append({"seed": seed, "arm": a[task], "twin": t[task], "arm_bitops": a[TRAIN_BITOPS],
                          "twin_bitops": t[TRAIN_BITOPS], "arm_cp": a.get("cp_model", math.nan), "twin_cp": t["cp"],
                          "difference": advantage(a, t, objective)})
        mean, low, high = interval([s["difference"] for s in seeds])
        out.append({"arm_method": next(iter(arm.values()))["method"] if arm else "(no run)",
                    "twin_method": next(iter(twin.values()))["method"] if twin else "(no run)",
                    "arm": pair.arm, "twin": pair.twin, "control": pair.control, "seeds": seeds,
                    "mean": mean, "low": low, "high": high})
    return out


def decide(pairs: list[dict], paired: Paired) -> dict:
    """The spec's rule over the deciding pairs' differences: holds, refuted or undecided, with the figures."""
    diffs = [s["difference"] for p in pairs if not p["control"] for s in p["seeds"]]
    mean, low, high = interval(diffs)
    if not diffs:
        verdict, why = "undecided", "no pair has runs of both sides"
    elif all(d >= 0 for d in diffs) and mean > 0:
        verdict, why = "holds", f"every one of the {len(diffs)} differences is >= 0 and their mean is > 0"
    elif all(d < 0 for d in diffs) and mean < -paired.refute_margin:
        verdict, why = "refuted", (f"every one of the {len(diffs)} differences is < 0 and their mean is below "
                                   f"-{paired.refute_margin:g}")
    else:
        above = sum(d >= 0 for d in diffs)
        verdict, why = "undecided", (f"{above} of the {len(diffs)} differences {'is' if above == 1 else 'are'} >= 0" if 0 < above < len(diffs)
                                     else f"the mean {mean:+.2f} is within the margin")
    return {"claim": paired.claim, "verdict": verdict, "why": why, "n": len(diffs), "mean": mean, "low": low,
            "high": high, "refute_margin": paired.refute_margin}


def rule_text(paired: Paired, task: Objective) -> str:
    better = "lower" if task.direction is Direction.MIN else "higher"
    unit = f"percent {better} {task.label}" if task.relative else f"points of {task.label}"
    return (f"**Decision rule** (the spec's, fixed before the runs): per seed, each pair's arm against its twin in "
            f"{unit} (positive: the arm is better). The claim \"{paired.claim}\" holds when every difference of "
            f"the deciding pairs is >= 0 and their mean > 0; it is refuted when every difference is < 0 and their "
            f"mean is below -{paired.refute_margin:g}; otherwise it is undecided. Control pairs are shown and do "
            f"not count.")


def paired_spec(data: SweepRuns) -> Paired | None:
    """The sweep's paired test (its logged spec's ``paired`` section), or None."""
    spec = artifact_json(data.client, data.parent_run_id, "sweep_spec.yaml") or {}
    return Paired.model_validate(spec["paired"]) if spec.get("paired") else None
