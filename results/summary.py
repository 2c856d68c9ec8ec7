"""A sweep's methods and the papers' claims, computed from its finished trial rows (``results.runs``).

``summarise`` groups the rows by method (the swept point without the seed): the task objective's mean and std
over seeds (the sweep's ``Objective``, resolved once when its rows are read and passed to every function here),
training BitOPs and every logged cost model's mean, savings against the sweep's own FP32 and FW8/BW8 groups, cp.
On those groups: the front of the means under any cost model (``front_of``), the static rows' front and the
method's place against it (``static_front``, ``beats_static``), the cost rankings per model, and the papers'
trends checked one by one (``trends``) under the rule ``comparable_rule`` states (the worst seed within the
objective's ``tolerance``: accuracy 1 point, perplexity 2 percent). ``with_configs`` gives each row the resolved
config its trial ran; ``staged_comparison`` the methods of a staged sweep. ``fractune results`` and ``fractune report``
render these figures (dashboards/); nothing here draws or writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

from engine.config.experiment import ExperimentConfig, parse_config
from engine.config.gated_schedule import GatedSettings
from engine.errors import ConfigError
from engine.metrics import ACCURACY, TRAIN_BITOPS
from results import runs
from results.objectives import Direction, Objective
from results.pareto import pareto_rows
from results.store import artifact_json


def method_label(point: dict, cfg: ExperimentConfig | None, tagged: str | None = None) -> str:
    """The schedule's name when the point sets the schedule, plus the other swept values; else the values.
    Without the config, the schedule's name the trial was tagged with (``tagged``, ``fractune.method``)."""
    others = ", ".join(f"{k}={v}" for k, v in sorted(point.items()) if not k.startswith("schedule"))
    name = cfg.schedule.label() if cfg is not None else tagged
    if name is None or not any(k.startswith("schedule") for k in point):
        return others or "base"
    return name + (f", {others}" if others else "")


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(rows: list[dict], objective: Objective) -> list[dict]:
    """Finished trials grouped by method (the swept point); savings against the sweep's own FP32 and FW8/BW8
    groups. Each row carries ``config``: its resolved ``ExperimentConfig`` (None when it could not be read).

    The quality columns follow the task ``objective``: ``accuracy_mean``,
    ``accuracy_std`` and ``accuracy_delta_vs_<ref>_pp`` (percentage points), or for language models
    ``perplexity_mean``, ``perplexity_std`` and ``perplexity_delta_vs_<ref>_pct`` (the relative change of the mean
    test perplexity, 100 (ppl / ppl_ref - 1): negative is better)."""
    task = objective.key
    groups: dict[str, dict] = {}
    for r in rows:
        key = json.dumps(r["point"], sort_keys=True, default=str)
        g = groups.setdefault(key, {"method": method_label(r["point"], r["config"], r.get("method")), "point": r["point"],
                                    "config": r["config"], "runs": []})
        g["runs"].append(r)
    out = []
    for g in groups.values():
        acc = [r[task] for r in g["runs"]]
        ops = [r[TRAIN_BITOPS] for r in g["runs"]]
        cps = [r["cp"] for r in g["runs"] if math.isfinite(r.get("cp", math.nan))]
        gated = [r["cp_gated"] for r in g["runs"] if math.isfinite(r.get("cp_gated", math.nan))]
        model = [r["cp_model"] for r in g["runs"] if math.isfinite(r.get("cp_model", math.nan))]
        walls = [r["wall_seconds"] for r in g["runs"] if math.isfinite(r.get("wall_seconds", math.nan))]
        cfg = g["config"]
        out.append({"method": g["method"], "kind": cfg.schedule.kind if cfg is not None else None,
                    "point": g["point"], "config": cfg, "n": len(acc), "seeds": sorted(r["seed"] for r in g["runs"]),
                    f"{task}_mean": statistics.fmean(acc), f"{task}_std": _std(acc),
                    "train_bitops_mean": statistics.fmean(ops), "train_bitops_std": _std(ops),
                    "cp_mean": statistics.fmean(cps) if cps else math.nan,
                    "cp_gated_mean": statistics.fmean(gated) if gated else math.nan,
                    "cp_model_mean": statistics.fmean(model) if model else math.nan, "runs": g["runs"],
                    "wall_seconds_mean": statistics.fmean(walls) if walls else math.nan,
                    "per_seed": {r["seed"]: {task: r[task], TRAIN_BITOPS: r[TRAIN_BITOPS]}
                                 for r in sorted(g["runs"], key=lambda r: r["seed"])}})
    models = list(dict.fromkeys(m for r in rows for m in r.get("costs", {})))
    for o, g in zip(out, groups.values()):
        o["costs_mean"] = {m: mean_over_seeds([r.get("costs", {}).get(m, math.nan) for r in g["runs"]]) for m in models}
    fp32 = next((g for g in out if g["kind"] == "fp32"), None)
    sbm = static_groups(out).get((8, 8))
    for g in out:
        for ref, name in ((fp32, "fp32"), (sbm, "fw8bw8")):
            g[f"savings_vs_{name}"] = (1 - g["train_bitops_mean"] / ref["train_bitops_mean"]) if ref else math.nan
            g.update(quality_delta(g, ref, name, objective))
        g["savings_by_model"] = {m: {name: (1 - g["costs_mean"][m] / ref["costs_mean"][m]) if ref and
                                        ref["costs_mean"][m] else math.nan for ref, name in ((fp32, "fp32"), (sbm, "fw8bw8"))}
                                 for m in models}
    out.sort(key=lambda g: -g["train_bitops_mean"])
    return out


def mean_over_seeds(values: list[float]) -> float:
    """The mean of a model's cost over seeds; NaN when any seed did not log it."""
    return statistics.fmean(values) if values and all(math.isfinite(v) for v in values) else math.nan


def delta_key(objective: Objective, name: str) -> str:
    """The key of a group's task objective against the reference ``name``: ``accuracy_delta_vs_fp32_pp``
    (points), or ``perplexity_delta_vs_fp32_pct`` for an objective compared relatively."""
    return f"{objective.key}_delta_vs_{name}_{'pct' if objective.relative else 'pp'}"


def delta_column(objective: Objective, name: str) -> str:
    """That difference's column header: ``acc. vs FW8/BW8 (pp)``, ``ppl. vs FW8/BW8 (%)``."""
    return f"{objective.short} vs {name} ({'%' if objective.relative else 'pp'})"


def quality_delta(g: dict, ref: dict | None, name: str, objective: Objective) -> dict:
    """The task objective of ``g`` against the reference group: in points of its scale (accuracy), or its
    relative change in percent (perplexity: ``relative``)."""
    mean = f"{objective.key}_mean"
    if objective.relative:
        pct = 100 * (g[mean] / ref[mean] - 1) if ref and ref[mean] else math.nan
        return {delta_key(objective, name): pct}
    return {delta_key(objective, name): (objective.scale * (g[mean] - ref[mean])) if ref else math.nan}


def cost_mean(g: dict, objective: str) -> float:
    return g["train_bitops_mean"] if objective == "bitops" else g.get("costs_mean", {}).get(objective, math.nan)


def rankings(groups: list[dict]) -> dict[str, list[str]]:
    """Per cost model: the methods cheapest first (those with that model's cost)."""
    models = list(dict.fromkeys(m for g in groups for m in g.get("costs_mean", {})))
    return {m: [g["method"] for g in sorted((g for g in groups if math.isfinite(cost_mean(g, m))),
                                            key=lambda g: cost_mean(g, m))] for m in models}


def static_groups(groups: list[dict]) -> dict[tuple[int, int], dict]:
    """The static groups with weights at the forward bits, by (FW, BW): (8, 8) is FracTrain's SBM baseline."""
    return {(g["config"].schedule.fw, g["config"].schedule.bw): g for g in groups
            if g["kind"] == "static" and g["config"].schedule.weight_bits is None}


def front_of(groups: list[dict], task: Objective, objective: str = "bitops") -> list[dict]:
    key, mode = task.key, task.mode  # accuracy max, or a language model's test perplexity min
    rows = [{key: g[f"{key}_mean"], TRAIN_BITOPS: g["train_bitops_mean"], "cost": cost_mean(g, objective),
             "method": g["method"]} for g in groups]
    return pareto_rows(rows, acc_key=key, cost_key="cost", maximize=mode == "max")


def seed_values(g: dict, key: str) -> list[float]:
    """The task objective of each seed of a group (its mean where the group carries no seeds)."""
    per_seed = g.get("per_seed") or {}
    return [v[key] for v in per_seed.values()] or [g[f"{key}_mean"]]


def worst_seed(g: dict, task: Objective) -> float:
    """The group's worst seed: the lowest accuracy, or a language model's highest test perplexity."""
    values = seed_values(g, task.key)
    return max(values) if task.direction is Direction.MIN else min(values)


def comparable(g: dict, ref: dict, task: Objective) -> bool:
    """Every seed within the objective's tolerance of the reference's mean: the worst seed's accuracy no more
    than 1 point below it, or its test perplexity no more than 2 percent above it (``relative``). Judged on
    the worst seed, a method whose seeds disagree is not called comparable because their spread is wide."""
    mean, worst, lower = ref[f"{task.key}_mean"], worst_seed(g, task), task.direction is Direction.MIN
    if task.relative:
        return worst <= mean * (1 + task.tolerance / 100) if lower else worst >= mean * (1 - task.tolerance / 100)
    return worst <= mean + task.tolerance / task.scale if lower else worst >= mean - task.tolerance / task.scale


def comparable_rule(task: Objective) -> str:
    """``comparable`` in words, as the page states it."""
    lower = task.direction is Direction.MIN
    return (f"its worst seed's {task.word} is no more than {task.tolerance:g}{'%' if task.relative else ' point'} "
            f"{'above' if lower else 'below'} the reference's mean" + (" (lower is better)" if lower else ""))


def split_seeds(g: dict, task: Objective) -> list[list[float]] | None:
    """The seeds in clusters where they fall apart (bimodal): sorted, split wherever two neighbours lie more than
    twice the tolerance apart (2 points of accuracy, or twice 2 percent of the median perplexity); None when
    they form one cluster."""
    values = sorted(seed_values(g, task.key))
    gap = (2 * task.tolerance / 100 * statistics.median(values)) if task.relative else 2 * task.tolerance / task.scale
    clusters = [[values[0]]]
    for a, b in zip(values, values[1:]):
        if b - a > gap:
            clusters.append([])
        clusters[-1].append(b)
    return clusters if len(clusters) > 1 else None


def static_front(groups: list[dict], task: Objective) -> list[dict]:
    """The static rows' Pareto front of the means (the task objective, e.g. accuracy max; BitOPs min), cheapest
    first; each member's objective mean under ``accuracy`` (the key ``front_at`` and ``cost_at`` read)."""
    rows = [{ACCURACY: g[f"{task.key}_mean"], "cost": g["train_bitops_mean"], "method": g["method"]}
            for g in groups if g["kind"] == "static"]
    return sorted(pareto_rows(rows, acc_key=ACCURACY, cost_key="cost", maximize=task.direction is Direction.MAX),
                  key=lambda r: r["cost"])


def front_at(front: list[dict], cost: float) -> tuple[float, str] | None:
    """The static front's accuracy at ``cost``, linear between its neighbours and flat beyond its dearest row
    (that row can always be run for less); None below its cheapest row. With the rows it lies between."""
    if not front or cost < front[0]["cost"]:
        return None
    for a, b in zip(front, front[1:]):
        if a["cost"] <= cost <= b["cost"]:
            t = (cost - a["cost"]) / (b["cost"] - a["cost"]) if b["cost"] > a["cost"] else 1.0
            return a[ACCURACY] + t * (b[ACCURACY] - a[ACCURACY]), f"{a['method']} .. {b['method']}"
    return front[-1][ACCURACY], front[-1]["method"]


def cost_at(front: list[dict], accuracy: float) -> float:
    """The static front's BitOPs at ``accuracy`` (the inverse of ``front_at``); NaN outside its accuracies."""
    for a, b in zip(front, front[1:]):
        if a[ACCURACY] <= accuracy <= b[ACCURACY]:
            t = (accuracy - a[ACCURACY]) / (b[ACCURACY] - a[ACCURACY]) if b[ACCURACY] > a[ACCURACY] else 0.0
            return a["cost"] + t * (b["cost"] - a["cost"])
    return math.nan


def beats_static(g: dict, front: list[dict], task: Objective) -> dict:
    """FracTrain's claim "dynamic precision beats static precision of equal cost", checked against the static
    rows' front interpolated at the method's mean BitOPs: it holds when the worst seed is on or above it. The
    saving is against the front's cost at the method's mean accuracy (NaN outside the front's accuracies)."""
    at = front_at(front, g["train_bitops_mean"])
    claim = {"claim": "Dynamic precision beats static precision of equal cost", "source":
             "FracTrain (NeurIPS 2020) Fig. 4, reference repository's DFQ vs SBM figures", "method": g["method"]}
    if at is None:
        return {**claim, "reference": "static front", f"{task.key}_delta_pp": math.nan, "savings": math.nan,
                "holds": False, "why_not": "cheaper than every static row: no static neighbour to compare"}
    acc, between = at
    mean, worst = g[f"{task.key}_mean"], worst_seed(g, task)
    ok = worst >= acc
    return {**claim, "reference": f"static front ({between})", f"{task.key}_delta_pp": task.scale * (mean - acc),
            "savings": 1 - g["train_bitops_mean"] / cost_at(front, mean), "holds": ok,
            "why_not": None if ok else f"worst seed {task.scale * (worst - acc):+.2f} pp against the front"}


def gate_key(cfg: ExperimentConfig) -> dict:
    """Everything of a DFQ/FracTrain run but its cp target: the gate's settings as the engine resolves them
    (option names, block costs), the model, and the rest of the experiment (data, optim, quant)."""
    s = cfg.schedule
    key = {f: getattr(s, f) for f in GatedSettings.model_fields}
    key.update(options=s.option_names(cfg.model.name), block_cost=s.omega_kind(cfg.model.name))
    rest = cfg.model_dump(mode="json", exclude={"schedule", "seed", "name"})
    return {**key, "experiment": rest}


def trends(groups: list[dict], task: Objective, paired: bool = False) -> list[dict]:
    """The papers' claims, each checked against this sweep's numbers (only those whose methods it ran). Where the
    spec decides "dynamic beats static" by pairs (``paired``), the check against the interpolated static front is
    left to the paired test."""
    by_kind: dict[str, list[dict]] = {}
    for g in groups:
        by_kind.setdefault(g["kind"] or "?", []).append(g)
    fp32 = next(iter(by_kind.get("fp32", [])), None)
    statics = static_groups(groups)
    sbm = statics.get((8, 8))
    out = []
    word = task.key  # the claims are about accuracy, or a language model's test perplexity

    def check(claim: str, source: str, g: dict, ref: dict, min_savings: float = 0.0) -> None:
        saved = 1 - g["train_bitops_mean"] / ref["train_bitops_mean"]
        delta = {check_delta(task): quality_delta(g, ref, "ref", task)[delta_key(task, "ref")]}
        ok_acc, ok_cost = comparable(g, ref, task), saved > min_savings
        worse = f"{word} {'above' if task.direction is Direction.MIN else 'below'} the reference"
        out.append({"claim": claim, "source": source, "method": g["method"], "reference": ref["method"],
                    **delta, "savings": saved, "holds": ok_acc and ok_cost,
                    "why_not": None if ok_acc and ok_cost else
                    (worse if not ok_acc else "") +
                    (" and " if not ok_acc and not ok_cost else "") +
                    (("no BitOPs saving" if saved <= 0 else f"BitOPs saving {100 * saved:.1f}% not above the "
                      f"{100 * min_savings:g}% this claim asks") if not ok_cost else "")})

    if fp32 and sbm:
        check(f"8-bit training (FW8/BW8, SBM) matches FP32 {word}", "SBM (Banner et al. 2018), FracTrain's baseline",
              sbm, fp32, 0.5)
    if sbm:
        for g in by_kind.get("pfq", []):  # against the static run at PFQ's final precision (FW8/BW16: SBM-16)
            s = g["config"].schedule
            ref = statics.get((s.fw[-1], s.bw[-1]), sbm)
            check(f"PFQ saves BitOPs over static {ref['method']} at comparable {word}",
                  "FracTrain supplement sec. 1", g, ref)
        for g in by_kind.get("cpt", []):
            check(f"CPT saves BitOPs over static 8-bit at comparable or better {word}", "CPT (ICLR 2021) abstract",
                  g, sbm)
        for g in by_kind.get("dfq", []):
            check(f"DFQ saves most of FW8/BW8's BitOPs at comparable {word}", "FracTrain supplement sec. 6", g, sbm)
        for g in by_kind.get("fractrain", []):
            check(f"FracTrain saves BitOPs over FW8/BW8 at comparable {word}", "FracTrain abstract", g, sbm)
    statics_front = static_front(groups, task) if not task.relative else []
    if len(statics_front) >= 2 and not paired:
        for g in by_kind.get("dfq", []) + by_kind.get("fractrain", []):
            out.append(beats_static(g, statics_front, task))
    for f in by_kind.get("fractrain", []):  # FracTrain vs DFQ at FracTrain's final cp target, the same gate
        final, key = f["config"].schedule.targets()[-1], gate_key(f["config"])
        for d in by_kind.get("dfq", []):
            if math.isclose(d["config"].schedule.target_cp, final, abs_tol=1e-9) and gate_key(d["config"]) == key:
                check(f"FracTrain costs less than DFQ at its final cp, at comparable {word}",
                      "FracTrain: PFQ schedules DFQ's cp", f, d)
    methods = {g["method"]: g for g in groups}
    for c in out:  # a method whose seeds fall apart: its mean describes none of them
        c["split_seeds"] = split_seeds(methods[c["method"]], task) if c["method"] in methods else None
    return out


def check_delta(task: Objective) -> str:
    """The key of a claim's difference from its reference: ``accuracy_delta_pp``, ``perplexity_delta_pct``."""
    return f"{task.key}_delta_{'pct' if task.relative else 'pp'}"


def cheaper_than(groups: list[dict], model: str) -> dict[str, frozenset[str]]:
    """Per method with a cost under ``model``: the methods strictly cheaper under it."""
    costs = {g["method"]: cost_mean(g, model) for g in groups if math.isfinite(cost_mean(g, model))}
    return {x: frozenset(y for y, c in costs.items() if c < cx) for x, cx in costs.items()}


# a gated setting added after runs were logged: the value that reproduces the engine before it existed. A logged
# config is the resolved one, so a missing field means an older engine, not the current default
PRE_FIELD_VALUES = {"option_state": "shared", "routed_sample_fraction": 1.0, "routed_statistics": "computed"}


def as_logged(config: dict) -> dict:
    """A logged ``config.yaml`` with the gated settings it predates filled in as its engine ran them."""
    sched = config.get("schedule")
    if not isinstance(sched, dict) or sched.get("kind") not in ("dfq", "fractrain"):
        return config
    return {**config, "schedule": {**PRE_FIELD_VALUES, **sched}}  # masked: its own defaults anyway


def with_configs(data: runs.SweepRuns) -> list[dict]:
    """The finished rows, each with ``config``: the trial's resolved ``ExperimentConfig``, parsed by the engine
    from the ``config.yaml`` the tracker logged (one read per swept point: the seeds share everything else;
    settings the log predates as its engine ran them, ``as_logged``). None where it cannot be read: its artifact
    unreachable (a store moved without its artifacts), or logged by an engine whose config this one no longer
    reads."""
    cache: dict[str, ExperimentConfig | None] = {}
    rows = []
    for r in data.finished():
        key = json.dumps(r["point"], sort_keys=True, default=str)
        if key not in cache:
            logged = artifact_json(data.client, r["run_id"], "config.yaml")
            try:
                cache[key] = None if logged is None else parse_config(as_logged(logged))
            except ConfigError:
                cache[key] = None
        rows.append({**r, "config": cache[key]})
    return rows


def staged_comparison(data: runs.SweepRuns) -> tuple[runs.SweepRuns, list[dict]]:
    """A staged sweep whose stages chain (a stage starts from an earlier one's runs): the trials it compares
    (``runs.compared_rows``: the stages no other starts from) and a reference row per stage they started from (the
    task objective's mean/std over its finished runs: ``accuracy_mean``, or a language model's
    ``perplexity_mean``) and for their accuracy before any step (``init_accuracy``); any other sweep as it is."""
    starts = runs.start_stages(data.rows)
    if not starts:
        return data, []  # not staged, or stages that start from none of each other: one comparison
    order = runs.in_order(starts, data.stages)
    task = data.task.key
    refs = []
    for stage in order:
        acc = [r[task] for r in runs.finished([r for r in data.rows if r.get("stage") == stage], data.task)]
        refs.append({"stage": stage, "n": len(acc), f"{task}_mean": sum(acc) / len(acc) if acc else math.nan,
                     f"{task}_std": _std(acc)})
    compared = data.compared
    init = [r["init_accuracy"] for r in runs.finished(compared, data.task)
            if math.isfinite(r.get("init_accuracy", math.nan))]
    if init and task == ACCURACY:  # the engine measures a loaded model's accuracy only (no perplexity)
        started = ", ".join(dict.fromkeys(r["stage"] for r in compared if r.get("init_stage")))
        refs.append({"stage": f"{started} before any step (init_accuracy)", "n": len(init),
                     "accuracy_mean": sum(init) / len(init), "accuracy_std": _std(init)})
    return dataclasses.replace(data, rows=compared), refs


def compared_what(compared: runs.SweepRuns, of: str | None = None) -> str:
    """The stages ``staged_comparison`` kept, in words: "the last stage (retrain)", or "the stages retrain, control"
    where a stage no other starts from runs beside the last; with ``of`` ("methods"): "the last stage's methods",
    or "the methods of the stages retrain, control"."""
    names = runs.compared_stages(compared.rows, compared.stages)
    if len(names) <= 1 and (not compared.stages or not names or compared.stages[-1] == names[0]):
        return f"the last stage's {of}" if of else f"the last stage ({', '.join(names) or 'last'})"
    return (f"the {of} of " if of else "") + f"the stages {', '.join(names)}"
