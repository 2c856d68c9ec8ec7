"""PNG versions of the report's key plots, drawn with matplotlib (Agg).

plotly's own image export needs kaleido and a Chrome binary; matplotlib needs neither, so the PNGs (the
files the MLflow UI previews inline) never depend on a browser being installed.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

from engine.metrics import TRAIN_BITOPS
from results.objectives import Direction, Objective
from results.summary import cost_mean

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dashboards.figures import cost_axis, run_title  # noqa: E402
from dashboards.markdown import upper_first  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def legend(ax, **kw) -> None:
    """The axes' legend, where anything on them has a label: an empty sweep draws no points, and matplotlib's
    warning about an empty legend would reach the CLI's stderr."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def log_x_if_wide(ax, costs: list[float]) -> None:
    """A log BitOPs axis when the costs span more than 20x (FP32 next to 4-bit runs)."""
    costs = [c for c in costs if c > 0]
    if costs and max(costs) / min(costs) > 20:
        ax.set_xscale("log")


def pareto_png(rows: list[dict], front: list[dict], path: Path, task: Objective, objective: str = "bitops") -> Path:
    from results.runs import cost_of

    key, title = task.key, task.label  # accuracy, or a language model's test perplexity
    scale, label = cost_axis(objective)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for kind in sorted({r.get("schedule") or "?" for r in rows}):
        sub = [r for r in rows if (r.get("schedule") or "?") == kind]
        ax.scatter([cost_of(r, objective) / scale for r in sub], [r[key] for r in sub], label=kind, alpha=0.75)
    if front:
        xs = [cost_of(r, objective) / scale for r in front]
        ax.step(xs, [r[key] for r in front], where="post", color="k", lw=1)
        ax.scatter(xs, [r[key] for r in front], marker="*", s=160,
                   color="gold", edgecolors="k", label="Pareto front", zorder=3)
    log_x_if_wide(ax, [cost_of(r, objective) for r in rows])
    ax.set_xlabel(label)
    ax.set_ylabel(title)
    ax.set_title(f"{title[5:].capitalize()} vs {label.removeprefix('training ')}")
    legend(ax, fontsize=8)
    return _save(fig, path)


def sensitivity_png(levels: dict, verdicts: dict, path: Path, objective: Objective) -> Path:
    task, quality = objective.key, objective.word
    factors = list(levels)
    fig, axes = plt.subplots(len(factors), 2, figsize=(10, 3.2 * len(factors)), squeeze=False)
    for i, f in enumerate(factors):
        labels = list(levels[f])
        stats = [levels[f][k] for k in labels]
        for j, (key, scale, unit) in enumerate(((task, 1.0, quality), (TRAIN_BITOPS, 1e9, "GBitOPs"))):
            ax = axes[i][j]
            ax.errorbar(range(len(labels)), [s[f"{key}_mean"] / scale for s in stats],
                        yerr=[_zero(s[f"{key}_std"]) / scale for s in stats], marker="o", capsize=4)
            ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=8)
            word = verdicts[f]["verdict"] if key == task else verdicts[f]["train_bitops_verdict"]
            ax.set_title(f"{f}: {unit} ({word})", fontsize=10)
            ax.set_ylabel(unit)
    return _save(fig, path)


def _zero(v) -> float:
    return 0.0 if v is None or not math.isfinite(v) else float(v)


def importance_png(importance: dict, path: Path) -> Path:
    from dashboards.figures import importance_objectives, importance_title

    keys = importance_objectives(importance)
    bars = max(len((importance.get(keys[0]) if keys else None) or {}), 1)
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 1.5 + 0.45 * bars), squeeze=False)
    for ax, key, title in ((axes[0][i], k, importance_title(k)) for i, k in enumerate(keys)):
        imp = importance.get(key) or {}
        names = list(imp)[::-1]
        ax.barh(names, [imp[n] for n in names])
        ax.set_xlim(0, 1)
        ax.set_title(f"importance {title} ({importance.get('evaluator')})", fontsize=10)
    return _save(fig, path)


def precision_png(runs: list[dict], hist: dict[str, dict], path: Path) -> Path:
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        h = hist.get(run["run_id"], {})
        for key, style in (("fw_bits", "-o"), ("bw_bits", "--s")):
            if key in h:
                ax.plot([s for s, _ in h[key]], [v for _, v in h[key]], style, label=key)
        ax.set_title(run_title(run), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel("bits")
        legend(ax, fontsize=8)
    return _save(fig, path)


def allocation_png(allocs: dict[str, dict], names: dict[str, str], path: Path) -> Path:
    fig, axes = plt.subplots(len(allocs), 1, figsize=(8, 2.8 * len(allocs)), squeeze=False)
    for ax, (rid, a) in zip(axes[:, 0], allocs.items()):
        im = ax.imshow(a["fw"], aspect="auto", cmap="viridis", vmin=0, vmax=max(8.0, max(max(r) for r in a["fw"])))
        ax.set_xticks(range(len(a["epochs"])), [str(e) for e in a["epochs"]])
        ax.set_yticks(range(len(a["fw"])), [f"block {b}" for b in range(len(a["fw"]))])
        ax.set_xlabel("epoch")
        ax.set_title(f"{names[rid]}: mean forward bits (0 = skipped)", fontsize=9)
        fig.colorbar(im, ax=ax)
    return _save(fig, path)


def results_png(groups: list[dict], front: list[dict], path: Path, task: Objective, objective: str = "bitops") -> Path:
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
    ax.set_title(f"{upper_first(task.word)} vs training cost ({objective}) per method")
    legend(ax, fontsize=7, loc="upper right" if lower else "lower right")
    return _save(fig, path)


def seeds_png(groups: list[dict], path: Path, task: Objective) -> Path | None:
    """One panel per seed: the static rows of that seed joined cheapest first (the static front where they
    form one), every other method's run of that seed as a point; accuracy against training BitOPs. None for a
    language model's sweep or one without static rows."""
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
    legend(axes[0][-1], fontsize=6, loc="lower right")
    return _save(fig, path)
