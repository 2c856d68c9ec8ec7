"""``fractune results``: a sweep's results as a markdown page, generated from its MLflow runs.

One row per method (the trial's swept point without the seed): the task objective's mean and std over seeds
(final test accuracy; for a language model test perplexity, lower is better: the sweep's ``Objective``, resolved
once when its rows are read and passed to every function here),
training BitOPs, savings against the FP32 and FW8/BW8 rows of the same sweep, and the computation percentage; the
papers' trends checked one by one with the rule stated (within the objective's ``tolerance``: accuracy 1 point,
perplexity 2 percent); a plot of every method's mean (error bars: std over seeds) with the
Pareto front of the means. Every cost model the runs logged (engine/cost/cost_models.py) gets the
same savings side by side, with the methods' cost ranking under each (where it differs from BitOPs' is where
the BitOPs story does not hold on that hardware); ``--objective`` picks the model of the plot and the front.
The page and its plot are logged under ``results/`` on the sweep's parent run. A notes file (the analysis a person writes: why a trend holds or not) is appended verbatim, so
the numbers are never typed by hand.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

from dashboards.data import SweepData, load_sweep
from dashboards.paired import decide, pair_up, pairs_png, rule_text, section
from engine.config.experiment import ExperimentConfig
from engine.config.schedule import (
    GatedSettings,
)
from engine.metrics import ACCURACY, TRAIN_BITOPS
from engine.safe_yaml import read_text
from results import runs
from results.objectives import Direction, Objective


def method_label(point: dict, cfg: ExperimentConfig | None) -> str:
    """The schedule's name when the point sets the schedule, plus the other swept values; else the values."""
    others = ", ".join(f"{k}={v}" for k, v in sorted(point.items()) if not k.startswith("schedule"))
    if cfg is None or not any(k.startswith("schedule") for k in point):
        return others or "base"
    return cfg.schedule.label() + (f", {others}" if others else "")


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
        g = groups.setdefault(key, {"method": method_label(r["point"], r["config"]), "point": r["point"],
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
        o["costs_mean"] = {m: _mean([r.get("costs", {}).get(m, math.nan) for r in g["runs"]]) for m in models}
    fp32 = next((g for g in out if g["kind"] == "fp32"), None)
    sbm = _static(out).get((8, 8))
    for g in out:
        for ref, name in ((fp32, "fp32"), (sbm, "fw8bw8")):
            g[f"savings_vs_{name}"] = (1 - g["train_bitops_mean"] / ref["train_bitops_mean"]) if ref else math.nan
            g.update(quality_delta(g, ref, name, objective))
        g["savings_by_model"] = {m: {name: (1 - g["costs_mean"][m] / ref["costs_mean"][m]) if ref and
                                        ref["costs_mean"][m] else math.nan for ref, name in ((fp32, "fp32"), (sbm, "fw8bw8"))}
                                 for m in models}
    out.sort(key=lambda g: -g["train_bitops_mean"])
    return out


def _mean(values: list[float]) -> float:
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


def _static(groups: list[dict]) -> dict[tuple[int, int], dict]:
    """The static groups with weights at the forward bits, by (FW, BW): (8, 8) is FracTrain's SBM baseline."""
    return {(g["config"].schedule.fw, g["config"].schedule.bw): g for g in groups
            if g["kind"] == "static" and g["config"].schedule.weight_bits is None}


def front_of(groups: list[dict], task: Objective, objective: str = "bitops") -> list[dict]:
    from results.pareto import pareto_rows

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
    from results.pareto import pareto_rows

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
    statics = _static(groups)
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


def _fmt(v, spec: str = ".4f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _pct(v) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{100 * v:+.1f}%"


def results_png(groups: list[dict], front: list[dict], path: Path, task: Objective, objective: str = "bitops") -> Path:
    from dashboards.pngs import _save, log_x_if_wide, plt
    from engine.cost.cost_models import UNITS

    bitops = objective == "bitops"
    scale, unit = (1e12, "TBitOPs") if bitops else (1.0, UNITS.get(objective, "cost"))
    key, y = task.key, task.scale  # accuracy in %, or a language model's test perplexity as it is
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = {"fp32": "o", "static": "s", "pfq": "^", "cpt": "D", "dfq": "v", "fractrain": "P"}
    for i, g in enumerate(groups):  # one colour per method, one marker per kind
        ax.errorbar(cost_mean(g, objective) / scale, y * g[f"{key}_mean"], yerr=y * g[f"{key}_std"],
                    xerr=g["train_bitops_std"] / scale if bitops else None, fmt=markers.get(g["kind"], "o"), capsize=3,
                    color=plt.cm.tab20(i % 20), label=g["method"])
    if front:
        ax.step([r["cost"] / scale for r in front], [y * r[key] for r in front], where="post",
                color="k", lw=1, label="Pareto front (means)")
    log_x_if_wide(ax, [cost_mean(g, objective) for g in groups])
    ax.set_xlabel(f"training cost under {objective}, {unit} (mean over seeds)")
    lower = task.direction is Direction.MIN
    ax.set_ylabel(f"{task.label}{', ' + task.unit if task.unit else ''} (mean +/- std over seeds"
                  f"{'; lower is better' if lower else ''})")
    ax.set_title(f"{_upper_first(task.word)} vs training cost ({objective}) per method")
    ax.legend(fontsize=7, loc="upper right" if lower else "lower right")
    return _save(fig, path)


def seeds_png(groups: list[dict], path: Path, task: Objective) -> Path | None:
    """One panel per seed: the static rows of that seed joined cheapest first (the static front where they
    form one), every other method's run of that seed as a point; accuracy against training BitOPs. None for a
    language model's sweep or one without static rows."""
    from dashboards.pngs import _save, log_x_if_wide, plt

    if task.relative or not any(g["kind"] == "static" for g in groups):
        return None
    key, y = task.key, task.scale
    seeds = sorted({seed for g in groups for seed in (g.get("per_seed") or {})})
    fig, axes = plt.subplots(1, len(seeds), figsize=(5 * len(seeds), 4.8), sharey=True, squeeze=False)
    markers = {"fp32": "o", "static": "s", "pfq": "^", "cpt": "D", "dfq": "v", "fractrain": "P"}
    for ax, seed in zip(axes[0], seeds):
        static = sorted((g["per_seed"][seed][TRAIN_BITOPS], g["per_seed"][seed][key], g["method"])
                         for g in groups if g["kind"] == "static" and seed in g["per_seed"])
        ax.plot([c / 1e12 for c, _, _ in static], [y * a for _, a, _ in static], "s-", color="0.4",
                label="static rows")
        for c, a, name in static:
            ax.annotate(name, (c / 1e12, y * a), fontsize=6, xytext=(3, -8), textcoords="offset points")
        for i, g in enumerate(groups):
            if g["kind"] == "static" or seed not in g["per_seed"]:
                continue
            v = g["per_seed"][seed]
            ax.plot(v[TRAIN_BITOPS] / 1e12, y * v[key], markers.get(g["kind"], "o"),
                    color=plt.cm.tab10(i % 10), label=g["method"])
        log_x_if_wide(ax, [g["per_seed"][seed][TRAIN_BITOPS] for g in groups if seed in g["per_seed"]])
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("training TBitOPs")
    axes[0][0].set_ylabel(f"{task.label}{', ' + task.unit if task.unit else ''}")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    return _save(fig, path)


def markdown(data: SweepData, groups: list[dict], checks: list[dict], front: list[dict], plot: str,
             command: str, notes: str | None, setup: dict, seeds_plot: str | None = None,
             paired_lines: list[str] | None = None) -> str:
    task = data.task
    on_front = {r["method"] for r in front}
    lines = [f"# Results: {data.name}", "",
             f"Generated by `{command}` on {time.strftime('%Y-%m-%d')} from the MLflow runs of sweep "
             f"`{data.sweep_id}` (experiment {data.experiment_id}, parent run `{data.parent_run_id}`): "
             f"{len(data.rows)} trials, {len(data.finished())} finished{wall_time(data)}. Do not edit by hand: rerun "
             "the command.", ""]
    if progress := data.progress():
        lines += [f"**Partial:** {progress}.", ""]
    if stopped := [r for r in data.rows if r.get("stopped")]:
        lines += [f"**Stopped early:** {len(stopped)} trial(s), by the scheduler or the sweep's time limit, before "
                  "their planned epochs; their cost is a shorter run's, so they are left off the front and the "
                  "tables: " + ", ".join(f"{r['name']} ({r['stopped']})" for r in stopped) + ".", ""]
    diverged = [r for r in data.rows if r.get("diverged")]
    if diverged:
        lines += ["**Diverged:** " + ", ".join(f"{r['name']} (from {r['diverged']})" for r in diverged)
                  + ": their training loss passed three times chance's (docs/methods.md §8).", ""]
    if setup:
        lines += ["## Setting", ""] + [f"- {k}: {v}" for k, v in setup.items()] + [""]
    lines += paired_lines or []
    lines += (relative_table if task.relative else points_table)(groups, on_front, task)
    lines += allocation_table(groups)
    lines += cost_model_section(groups)
    lines += trends_section(groups, checks, plot, task, seeds_plot)
    errored = [r for r in data.rows if not r["complete"]]
    if errored:
        lines += ["", f"{len(errored)} trial(s) did not finish and are left out: "
                  + ", ".join(f"{r['name']} ({'stopped early, ' + r['stopped'] if r.get('stopped') else r['status']})"
                              for r in errored)]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]  # "accuracy" -> "Accuracy"; "BLEU" stays BLEU


def section_title(task: Objective) -> str:
    return f"## {_upper_first(task.word)} and training BitOPs"


def wall_time(data: SweepData) -> str:
    """The header's wall time (", in 1 h 31 min of wall time"): the parent run's start to its end, which every
    stage's trials run under; empty while it runs."""
    if data.client is None:  # rows built without a store (tests of the page's layout)
        return ""
    info = data.client.get_run(data.parent_run_id).info
    if not info.end_time or not info.start_time:
        return ""
    minutes = round((info.end_time - info.start_time) / 60_000)
    return f", in {minutes // 60} h {minutes % 60} min of wall time" if minutes >= 60 else \
        f", in {minutes} min of wall time"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table without the columns that are empty (``n/a`` or ``-``) in every row: a sweep without an
    FP32 row has no "vs FP32" column, one without gated methods no gated cp."""
    empty = {"n/a", "-", "n/a / n/a", ""}
    keep = [i for i in range(len(header)) if i == 0 or any(r[i] not in empty for r in rows)]
    pick = lambda cells: [cells[i] for i in keep]  # noqa: E731
    return ["| " + " | ".join(pick(header)) + " |", "|" + " --- |" * len(keep)] + \
        ["| " + " | ".join(pick(r)) + " |" for r in rows]


def points_table(groups: list[dict], on_front: set[str], task: Objective) -> list[str]:
    """The table of an objective compared in points (accuracy): its mean and its difference from FW8/BW8."""
    lines = [section_title(task), "",
             f"Mean +/- std over seeds of the final {task.label}; training BitOPs of the whole run (forward, "
             "error and weight-gradient passes, exact counts); savings against this sweep's FP32 and FW8/BW8 "
             "rows (positive: cheaper); cp: the run's cost as a percentage of FP32, every layer counted (a gated "
             "run's gate apart); gated cp and model cp: DFQ's and FracTrain's cp over the gated blocks (the papers' "
             "cp) and over the whole model with the gate (docs/methods.md §6.4), the means of the per-epoch "
             "`cp_gated` and `cp_model`; minutes: wall time per trial (one CPU thread). * marks the Pareto front "
             "of the method means; a column empty in every row is left out.", ""]
    header = ["method", "seeds", task.column, "TBitOPs", "vs FP32", "vs FW8/BW8", delta_column(task, "FW8/BW8"),
              "cp %", "gated cp %", "model cp %", "minutes"]
    key, y = task.key, task.scale
    rows = []
    for g in groups:
        star = " *" if g["method"] in on_front else ""
        rows.append([f"{g['method']}{star}", str(g["n"]), f"{y * g[f'{key}_mean']:.2f} +/- "
                     f"{y * g[f'{key}_std']:.2f}", f"{g['train_bitops_mean'] / 1e12:.3f}",
                     _pct(g["savings_vs_fp32"]), _pct(g["savings_vs_fw8bw8"]),
                     _fmt(g[delta_key(task, "fw8bw8")], "+.2f"), _fmt(g["cp_mean"], ".2f"),
                     _fmt(g["cp_gated_mean"], ".2f").replace("n/a", "-"),
                     _fmt(g["cp_model_mean"], ".3f").replace("n/a", "-"),
                     _fmt(g["wall_seconds_mean"] / 60, ".1f")])
    return lines + table(header, rows) + [""] + seeds_table(groups, task)


def seeds_table(groups: list[dict], task: Objective) -> list[str]:
    """Every seed's figure and training BitOPs side by side, a column per seed (split seeds marked)."""
    seeds = sorted({seed for g in groups for seed in (g.get("per_seed") or {})})
    key, scale = task.key, task.scale
    header = ["method"] + [f"seed {s}: {task.column} / TBitOPs" for s in seeds]
    rows = []
    for g in groups:
        per = g.get("per_seed") or {}
        rows.append([g["method"] + (" (split)" if split_seeds(g, task) else "")] +
                    [f"{scale * per[s][key]:.2f} / {per[s][TRAIN_BITOPS] / 1e12:.3f}" if s in per else "-"
                     for s in seeds])
    return ["Each seed's final figure and its run's training TBitOPs:", ""] + table(header, rows)


def allocation_table(groups: list[dict]) -> list[str]:
    """Per gated method, each block's mean forward and backward bits and the share of its inputs that skipped
    it, in the last epoch (the mean over seeds of the runs' ``alloc_*``)."""
    gated = [g for g in groups if any(r.get("gate") for r in g["runs"]) and g["kind"] in ("dfq", "fractrain")]
    if not gated:
        return []
    blocks = sorted({int(k[-2:]) for g in gated for r in g["runs"] for k in r.get("gate", {})
                     if k.startswith("alloc_fw_b")})
    lines = ["", "## What the gate allocated", "",
             "Each gated method's last epoch, the mean over its seeds: per block, the mean forward / backward bits "
             "of the inputs that computed it and, where any input skipped it, the share that did (skipped inputs "
             "count 0 bits in the means).", ""]
    rows = []
    for g in gated:
        cells = []
        for b in blocks:
            fw, bw, skip = (_mean([r["gate"].get(f"alloc_{x}_b{b:02d}", math.nan) for r in g["runs"]])
                            for x in ("fw", "bw", "skip"))
            cells.append(f"{fw:.2f} / {bw:.2f}" + (f", skip {skip:.2f}" if skip > 0 else ""))
        rows.append([g["method"]] + cells)
    return lines + table(["method"] + [f"block {b}" for b in blocks], rows)


def relative_table(groups: list[dict], on_front: set[str], task: Objective) -> list[str]:
    """The table of an objective compared relatively (a language model's test perplexity, lower is better): its
    mean and its relative change against FP32 and FW8/BW8, where accuracy's has its difference in points."""
    lines = [section_title(task), "",
             "Mean +/- std over seeds of the final test perplexity (exp of the mean next-token cross-entropy on the "
             "test split; lower is better); training BitOPs of the whole run (forward, error and weight-gradient "
             "passes over every token, exact counts); savings against this sweep's FP32 and FW8/BW8 rows "
             "(positive: cheaper); ppl. vs FP32 and ppl. vs FW8/BW8: the relative change of the mean test "
             "perplexity against that row, 100 x (ppl / ppl_ref - 1) % (negative: better); cp: the run's cost as a "
             "percentage of FP32, every layer counted; gated cp: DFQ's and FracTrain's cp as the papers define it "
             "(the mean of the per-epoch `cp_gated`); minutes: wall time per trial (one CPU thread). * marks the "
             "Pareto front of the method means (test perplexity min, training cost min); a column empty in every "
             "row is left out.", ""]
    header = ["method", "seeds", task.column, "TBitOPs", "vs FP32", "vs FW8/BW8", delta_column(task, "FP32"),
              delta_column(task, "FW8/BW8"), "cp %", "gated cp %", "minutes"]
    key, y = task.key, task.scale
    rows = [[g["method"] + (" *" if g["method"] in on_front else ""), str(g["n"]),
             f"{y * g[f'{key}_mean']:.2f} +/- {y * g[f'{key}_std']:.2f}", f"{g['train_bitops_mean'] / 1e12:.3f}",
             _pct(g["savings_vs_fp32"]), _pct(g["savings_vs_fw8bw8"]), _fmt(g[delta_key(task, "fp32")], "+.1f"),
             _fmt(g[delta_key(task, "fw8bw8")], "+.1f"), _fmt(g["cp_mean"], ".2f"),
             _fmt(g["cp_gated_mean"], ".2f").replace("n/a", "-"), _fmt(g["wall_seconds_mean"] / 60, ".1f")]
            for g in groups]
    return lines + table(header, rows) + [""] + seeds_table(groups, task)


def trends_section(groups: list[dict], checks: list[dict], plot: str, task: Objective,
                   seeds_plot: str | None = None) -> list[str]:
    word = task.key
    delta = check_delta(task)
    column = f"{task.short} change (%)" if task.relative else f"{task.short} delta (pp)"
    lines = ["", f"![{word} vs training cost]({plot})", ""]
    if seeds_plot:
        lines += [f"![{word} vs training cost, each seed]({seeds_plot})", ""]
    split = (f"A method's seeds are *split* (bimodal) where two of them, sorted, lie more than "
             f"{'twice ' + format(task.tolerance, 'g') + '% of the median' if task.relative else format(2 * task.tolerance, 'g') + ' points'} "
             "apart: its mean describes none of them, and its verdict names the clusters.")
    lines += ["## The papers' trends, checked", ""]
    if not checks:
        return lines + ["No claim applies to this sweep: the papers' claims are checked against its FP32 and FW8/BW8 "
                        "rows, which it does not have; where its spec states a paired test, that test (above) decides "
                        "dynamic against static precision.", "", split]
    lines += [f"Rule: a method holds a claim when it saves BitOPs against the reference and {comparable_rule(task)}.",
              ""]
    if any(c["claim"].startswith("Dynamic precision") for c in checks):
        lines += ["\"Dynamic precision beats static precision of equal cost\" compares a gated method with the "
                  "static rows' Pareto front of the means, linear between the two static rows whose BitOPs bracket "
                  "the method's mean BitOPs (flat beyond the dearest): it holds when the method's worst seed is on "
                  "or above that accuracy; its delta is the mean's, its BitOPs saving is against the front's cost "
                  "at the method's mean accuracy (n/a outside the front's accuracies).", ""]
    lines += [split, "",
              f"| claim | source | method | reference | {column} | BitOPs saving | holds |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    scale = task.scale
    for c in checks:
        verdict = "yes" if c["holds"] else f"no ({c['why_not']})"
        if c.get("split_seeds"):
            verdict += "; seeds split: " + " | ".join(", ".join(f"{scale * v:.2f}" for v in part)
                                                      for part in c["split_seeds"])
        lines.append(f"| {c['claim']} | {c['source']} | {c['method']} | {c['reference']} | "
                     f"{_fmt(c[delta], '+.1f' if task.relative else '+.2f')} | "
                     f"{_fmt(100 * c['savings'], '.1f')}{'%' if math.isfinite(c['savings']) else ''} | {verdict} |")
    return lines


def cost_model_section(groups: list[dict]) -> list[str]:
    """Savings of each method against FP32 and FW8/BW8 under every cost model, and the ranking per model."""
    models = list(dict.fromkeys(m for g in groups for m in g.get("savings_by_model", {})))
    if len(models) < 2:
        return []
    rows = [[g["method"]] + [f"{_pct(g['savings_by_model'][m]['fp32'])} / {_pct(g['savings_by_model'][m]['fw8bw8'])}"
                             for m in models] for g in groups]
    lines = ["", "## Savings under each cost model", ""]
    if any(cell != "n/a / n/a" for r in rows for cell in r[1:]):
        lines += ["Each cell: saving against this sweep's FP32 row / against its FW8/BW8 row, under that model "
                  "(docs/methods.md, Cost models: bitops = a*w+g*w+a*g per MAC; macs ignores bits; int_units rounds "
                  "widths up to 4/8/16/32-bit units; energy in pJ from Horowitz, ISSCC 2014, 45 nm; memory = bytes "
                  "moved).", ""] + table(["method"] + models, rows)
    else:
        lines += ["This sweep has no FP32 and no FW8/BW8 row, so there is no saving to show; the ranking below is by "
                  "each model's mean cost."]
    by_method = {g["method"]: g for g in groups}
    cheaper = {m: _cheaper(groups, m) for m in models}
    lines += ["", "Cheapest first under each model (= joins equal costs; in bold a method whose cheaper methods are "
              "not the ones under BitOPs):", ""]
    order = rankings(groups)
    for m in models:
        tiers: list[list[str]] = []
        first = order.get("bitops", order[m])  # equal costs listed in the BitOPs order
        for x in sorted(order[m], key=lambda x: (cost_mean(by_method[x], m), first.index(x) if x in first else 0)):
            if tiers and cost_mean(by_method[x], m) == cost_mean(by_method[tiers[-1][0]], m):
                tiers[-1].append(x)
            else:
                tiers.append([x])
        base = cheaper.get("bitops", cheaper[m])
        lines.append(f"- {m}: " + ", ".join(" = ".join(f"**{x}**" if cheaper[m][x] != base.get(x) else x
                                                      for x in tier) for tier in tiers))
    return lines


def _cheaper(groups: list[dict], model: str) -> dict[str, frozenset[str]]:
    """Per method with a cost under ``model``: the methods strictly cheaper under it."""
    costs = {g["method"]: cost_mean(g, model) for g in groups if math.isfinite(cost_mean(g, model))}
    return {x: frozenset(y for y, c in costs.items() if c < cx) for x, cx in costs.items()}


def setup_of(data: SweepData) -> dict:
    """A few lines on the sweep's common setting, from the parent run's logged spec."""
    from results.store import artifact_json

    spec = artifact_json(data.client, data.parent_run_id, "sweep_spec.yaml") or {}
    base = spec.get("base") if isinstance(spec.get("base"), dict) else {}
    run = data.client.get_run(data.parent_run_id)
    out = {}
    if path := spec_file_of(data.name, run.data.params):
        out["spec file"] = path
    if spec.get("description"):
        out["spec"] = " ".join(str(spec["description"]).split())
    for key in ("model", "data", "optim"):
        if base.get(key):
            out[key] = ", ".join(f"{k}={v}" for k, v in base[key].items())
    if spec.get("seeds"):
        out["seeds"] = spec["seeds"]
    info = run.info
    if info.end_time and info.start_time:
        out["sweep wall time"] = f"{(info.end_time - info.start_time) / 60000:.1f} minutes (the parent run's start to end)"
    return out


def spec_file_of(name: str, params: dict) -> str | None:
    """The spec file that made the sweep, as its page names it: the parent run's ``spec_file`` param (relative to
    the project root when the spec was inside it); for a sweep that predates the param, the spec of the sweep's
    name in this checkout's ``search_spaces/`` or ``docs/studies/``, said to be found by name; else None."""
    from engine.config.experiment import read_yaml
    from engine.errors import ConfigError
    from results.provenance import PROJECT_ROOT, SPEC_FOLDERS

    if recorded := params.get("spec_file"):
        return f"`{shown_path(recorded)}`"
    for folder in SPEC_FOLDERS:
        path = PROJECT_ROOT / folder / f"{name}.yaml"
        try:
            if path.is_file() and read_yaml(path, "spec").get("name") == name:
                return f"`{folder}/{name}.yaml` (found by the sweep's name: the sweep did not record its spec file)"
        except ConfigError:
            continue
    return None


# a gated setting added after runs were logged: the value that reproduces the engine before it existed. A logged
# config is the resolved one, so a missing field means an older engine, not the current default
PRE_FIELD_VALUES = {"option_state": "shared", "routed_sample_fraction": 1.0, "routed_statistics": "computed"}


def as_logged(config: dict) -> dict:
    """A logged ``config.yaml`` with the gated settings it predates filled in as its engine ran them."""
    sched = config.get("schedule")
    if not isinstance(sched, dict) or sched.get("kind") not in ("dfq", "fractrain"):
        return config
    return {**config, "schedule": {**PRE_FIELD_VALUES, **sched}}  # masked: its own defaults anyway


def with_configs(data: SweepData) -> list[dict]:
    """The finished rows, each with ``config``: the trial's resolved ``ExperimentConfig``, parsed by the engine
    from the ``config.yaml`` the tracker logged (one read per swept point: the seeds share everything else;
    settings the log predates as its engine ran them, ``as_logged``)."""
    from engine.config.experiment import parse_config
    from engine.errors import ConfigError
    from results.store import artifact_json

    cache: dict[str, ExperimentConfig | None] = {}
    rows = []
    for r in data.finished():
        key = json.dumps(r["point"], sort_keys=True, default=str)
        if key not in cache:
            try:
                cache[key] = parse_config(as_logged(artifact_json(data.client, r["run_id"], "config.yaml") or {}))
            except ConfigError:  # logged by an engine whose config this one no longer reads
                cache[key] = None
        rows.append({**r, "config": cache[key]})
    return rows


def last_stage(data: SweepData) -> tuple[SweepData, list[dict]]:
    """A staged sweep whose stages chain (a stage starts from an earlier one's runs): its last stage's rows (the
    methods compared) and a reference row per earlier stage (the task objective's mean/std over its finished
    runs: ``accuracy_mean``, or a language model's ``perplexity_mean``); any other sweep as it is."""
    if not any(r.get("stage") for r in data.rows) or not any(r.get("init_run") for r in data.rows):
        return data, []  # not staged, or stages that start from none of each other: one comparison
    order = [s for s in data.client.get_run(data.parent_run_id).data.tags.get("fractune.stages", "").split(",") if s]
    order = order or list(dict.fromkeys(r["stage"] for r in data.rows if r.get("stage")))
    task = data.task.key
    refs = []
    for stage in order[:-1]:
        acc = [r[task] for r in runs.finished([r for r in data.rows if r.get("stage") == stage], data.task)]
        refs.append({"stage": stage, "n": len(acc), f"{task}_mean": sum(acc) / len(acc) if acc else math.nan,
                     f"{task}_std": _std(acc)})
    last = [r for r in data.rows if r.get("stage") == order[-1]]
    init = [r["init_accuracy"] for r in runs.finished(last, data.task) if math.isfinite(r.get("init_accuracy", math.nan))]
    if init and task == ACCURACY:  # the engine measures a loaded model's accuracy only (no perplexity)
        refs.append({"stage": f"{order[-1]} before any step (init_accuracy)", "n": len(init),
                     "accuracy_mean": sum(init) / len(init), "accuracy_std": _std(init)})
    return dataclasses.replace(data, rows=last), refs


def paired_spec(data: SweepData):
    """The sweep's paired test (its logged spec's ``paired`` section), or None."""
    from results.store import artifact_json
    from search_spaces.spec import Paired

    spec = artifact_json(data.client, data.parent_run_id, "sweep_spec.yaml") or {}
    return Paired.model_validate(spec["paired"]) if spec.get("paired") else None


def build_results(uri: str, sweep: str, sweep_id: str | None, out: str | Path, notes: str | None = None,
                  log: bool = True, command: str | None = None, objective: str | None = None) -> dict:
    from results.runs import check_objective

    data, stage_refs = last_stage(load_sweep(uri, sweep, sweep_id))
    objective = check_objective(objective or data.objective, data.rows)
    done = with_configs(data)
    task = data.task
    groups = summarise(done, task)
    front = front_of(groups, task, objective)
    paired = paired_spec(data)
    checks = trends(groups, task, paired is not None)
    page = Path(out).expanduser().resolve()
    page.parent.mkdir(parents=True, exist_ok=True)
    plot = results_png(groups, front, page.with_name(page.stem + "_pareto.png"), task, objective)
    per_seed = seeds_png(groups, page.with_name(page.stem + "_seeds.png"), task)
    notes_text = read_text(notes, "--notes", "markdown file") if notes else None
    cmd = command or f"fractune results {sweep} --out {out}"
    test, pairs_plot, paired_lines = None, None, None
    if paired is not None:
        for g in groups:
            for r in g["runs"]:
                r["method"] = g["method"]
        pairs = pair_up(done, paired, task)
        test = {**decide(pairs, paired), "pairs": pairs, "rule": rule_text(paired, task)}
        pairs_plot = pairs_png(pairs, task, page.with_name(page.stem + "_pairs.png"))
        paired_lines = section(pairs, test, paired, task, pairs_plot.name if pairs_plot else None)
    text = markdown(data, groups, checks, front, plot.name, cmd, notes_text, setup_of(data),
                    per_seed.name if per_seed else None, paired_lines)
    if stage_refs:  # a staged sweep: the table is its last stage; the earlier stages for reference
        y, column, key = task.scale, task.column, task.key
        text = text.replace(section_title(task), "\n".join(
            ["## Earlier stages (reference)", "", "The tables below compare the last stage's methods; each of its runs "
             "started from the earlier stage's run of the same seed.", "", f"| stage | runs | {column} |",
             "| --- | --- | --- |"] + [f"| {r['stage']} | {r['n']} | {y * r[f'{key}_mean']:.2f} +/- "
                                       f"{y * r[f'{key}_std']:.2f} |" for r in stage_refs]
            + ["", section_title(task)]), 1)
    page.write_text(text)
    artifact = None
    if log:
        data.client.log_artifact(data.parent_run_id, str(page), "results")
        data.client.log_artifact(data.parent_run_id, str(plot), "results")
        for extra in (per_seed, pairs_plot):
            if extra:
                data.client.log_artifact(data.parent_run_id, str(extra), "results")
        artifact = data.client.get_run(data.parent_run_id).info.artifact_uri.rstrip("/") + f"/results/{page.name}"
    methods = [{k: v for k, v in g.items() if k not in ("config", "runs")} | {"schedule": g["config"].schedule.model_dump(mode="json")
                                                                 if g["config"] is not None else None}
               for g in groups]
    return {"sweep": data.name, "sweep_id": data.sweep_id, "parent_run_id": data.parent_run_id,
            "trials": len(data.rows), "finished": len(done),
            "stopped": runs.stopped_trials(data.rows),
            "methods": methods, "objective": objective,
            "task_objective": task.key, "direction": task.direction.optuna, "comparable_rule": comparable_rule(task),
            "status": data.status, "partial": data.progress() is not None,
            "pareto": [r["method"] for r in front], "rankings": rankings(groups), "trends": checks, "markdown": str(page), "plot": str(plot),
            "seeds_plot": str(per_seed) if per_seed else None, "paired": test,
            "pairs_plot": str(pairs_plot) if pairs_plot else None,
            "stages": stage_refs,
            "artifact": artifact}


def shown_path(path: str) -> str:
    """A path as a generated page names it: relative to the repository where it lies inside, else its last two
    parts after ``.../``, never a path of the machine the page was made on."""
    from results.provenance import PROJECT_ROOT

    if not Path(path).expanduser().is_absolute():
        return path
    full = Path(path).expanduser().resolve()
    try:
        return str(full.relative_to(PROJECT_ROOT))
    except ValueError:
        return ".../" + "/".join(full.parts[-2:])


def shown_uri(uri: str) -> str:
    """A tracking URI as a generated page names it: a sqlite file or a folder by ``shown_path`` (a relative
    sqlite URI, ``sqlite:///fractune_study/fair/mlflow.db``, opens it from the repository's root); a server's
    without its credentials."""
    from results import store

    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            return scheme + shown_path(uri.removeprefix(scheme))
    if "://" not in uri:
        return shown_path(uri)
    return store.redact(uri)


def cmd_results(args) -> int:
    from engine.errors import ConfigError
    from results import store
    from results.output import check_output_file, emit_json

    # every input and output path checked before the store is read or anything written
    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    ConfigError.check_all(lambda: store.check_names(args.sweep, args.sweep_id),
                          lambda: read_text(args.notes, "--notes", "markdown file") if args.notes else None,
                          lambda: check_output_file("--out", args.out, (".md", ".markdown", ".txt")),
                          lambda: store.check_uri(uri))
    command = "fractune results " + " ".join(
        [args.sweep] + (["--sweep-id", args.sweep_id] if args.sweep_id else [])
        + (["--tracking-uri", shown_uri(args.tracking_uri)] if args.tracking_uri else [])
        + ["--out", shown_path(args.out)] + (["--notes", shown_path(args.notes)] if args.notes else [])
        + (["--objective", args.objective] if args.objective else []))
    out = build_results(uri, args.sweep, args.sweep_id, args.out, args.notes, log=not args.no_log, command=command,
                        objective=args.objective)
    print(Path(out["markdown"]).read_text())
    print(f"written {out['markdown']} and {out['plot']}" + (f"; logged as {out['artifact']}" if out["artifact"]
                                                             else ""))
    if args.json:
        emit_json(out)
    return 0
