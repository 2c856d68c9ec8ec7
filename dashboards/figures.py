"""The report's interactive figures (plotly). Inputs are plain rows and dicts, so tests can build them.

Every figure has a fixed layout height and no external resources; ``report.py`` embeds plotly.js once.
"""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.metrics import TRAIN_BITOPS
from results import objectives
from results.objectives import Objective
from results.runs import cost_of

PRECISION_KEYS = ("fw_bits", "bw_bits", "target_cp", "stage")


def _hover(row: dict, task: Objective, objective: str = "bitops") -> str:
    point = ", ".join(f"{k}={_short(v)}" for k, v in (row.get("point") or {}).items())
    quality = task.value_text(row[task.key])
    other = "" if objective == "bitops" else f"<br>{objective} {cost_of(row, objective):.4g}"
    return (f"{row.get('name')}<br>{quality}<br>{row[TRAIN_BITOPS] / 1e9:.3f} GBitOPs"
            f"{other}<br>seed {row.get('seed')}<br>{point}")


def cost_axis(objective: str) -> tuple[float, str]:
    """(scale, axis label) of a cost model's axis: GBitOPs for BitOPs, the model's own unit otherwise."""
    from engine.cost.cost_models import UNITS

    if objective == "bitops":
        return 1e9, "training GBitOPs"
    return 1.0, f"training cost under {objective} ({UNITS.get(objective, 'cost')})"


def _short(v) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def pareto_figure(rows: list[dict], front: list[dict], task: Objective, objective: str = "bitops") -> go.Figure:
    """The task objective (accuracy, a language model's test perplexity) against the training cost under
    ``objective`` (GBitOPs by default), one colour per schedule kind, the front as a stepped line."""
    key, title, mode = task.key, task.label, task.mode
    scale, label = cost_axis(objective)
    fig = go.Figure()
    for kind in sorted({r.get("schedule") or "?" for r in rows}):
        sub = [r for r in rows if (r.get("schedule") or "?") == kind]
        fig.add_trace(go.Scatter(x=[cost_of(r, objective) / scale for r in sub], y=[r[key] for r in sub],
                                 mode="markers", name=kind, marker={"size": 9, "opacity": 0.75},
                                 text=[_hover(r, task, objective) for r in sub], hoverinfo="text"))
    if front:
        fig.add_trace(go.Scatter(x=[cost_of(r, objective) / scale for r in front], y=[r[key] for r in front],
                                 mode="lines+markers", name="Pareto front", line={"shape": "hv", "color": "black"},
                                 marker={"symbol": "star", "size": 14, "color": "gold",
                                         "line": {"color": "black", "width": 1}},
                                 text=[_hover(r, task, objective) for r in front], hoverinfo="text"))
    costs = [c for r in rows if (c := cost_of(r, objective)) > 0]
    log = bool(costs) and max(costs) / min(costs) > 20  # fp32 next to 4-bit runs spans decades
    word = key
    fig.update_layout(title=f"{word.capitalize()} vs {label.removeprefix('training ')} (front: {word} {mode}, "
                      "cost min)", height=520,
                      xaxis={"title": label + (" (log)" if log else ""), "type": "log" if log else "linear"},
                      yaxis={"title": title}, legend={"title": "schedule"})
    return fig


def parallel_figure(rows: list[dict], factors: list[str], models: list[str], task: Objective) -> go.Figure:
    """Parallel coordinates: every swept parameter (categorical ones as numbered levels) and the objectives
    (accuracy, or a language model's perplexity, and the training cost under each model), one line per finished
    trial coloured by the task objective."""
    dims = []
    for f in factors:
        values = [(r.get("point") or {}).get(f) for r in rows]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            dims.append({"label": f, "values": values})
        else:
            levels = sorted({_short(v) for v in values})
            dims.append({"label": f, "values": [levels.index(_short(v)) for v in values],
                         "tickvals": list(range(len(levels))), "ticktext": [t[:24] for t in levels]})
    key = task.key  # accuracy, or a language model's perplexity
    dims.append({"label": key, "values": [r[key] for r in rows]})
    for name in models:
        dims.append({"label": name, "values": [cost_of(r, name) for r in rows]})
    fig = go.Figure(go.Parcoords(line={"color": [r[key] for r in rows], "colorscale": "Viridis",
                                       "showscale": True, "colorbar": {"title": key}}, dimensions=dims))
    fig.update_layout(title="Parameters and objectives (one line per finished trial)", height=480)
    return fig


def sensitivity_figure(levels: dict, verdicts: dict, objective: Objective) -> go.Figure:
    """Per factor: the mean task objective (accuracy, or a language model's test ``perplexity``) and mean
    GBitOPs per level, error bars one std over seeds."""
    factors = list(levels)
    task = objective.key
    titles = []
    for f in factors:
        titles += [f"{f}: {task} ({verdicts[f]['verdict']})", f"{f}: GBitOPs ({verdicts[f]['train_bitops_verdict']})"]
    height = 340 * len(factors) + 80
    fig = make_subplots(rows=len(factors), cols=2, subplot_titles=titles, vertical_spacing=_gap(len(factors), height))
    for i, f in enumerate(factors, start=1):
        labels = list(levels[f])
        stats = [levels[f][k] for k in labels]
        for col, key, scale in ((1, task, 1.0), (2, TRAIN_BITOPS, 1e9)):
            fig.add_trace(go.Scatter(
                x=labels, y=[s[f"{key}_mean"] / scale for s in stats], mode="lines+markers", showlegend=False,
                name=f, error_y={"type": "data", "array": [_zero(s[f"{key}_std"]) / scale for s in stats],
                                 "visible": True},
                text=[f"n={s['n']}" for s in stats]), row=i, col=col)
            fig.update_xaxes(title_text=f, type="category", row=i, col=col)
        fig.update_yaxes(title_text=objective.word, row=i, col=1)
        fig.update_yaxes(title_text="GBitOPs", row=i, col=2)
    fig.update_layout(title="Sensitivity: mean ± std over seeds per level", height=height)
    return fig


def _gap(rows: int, height: int, pixels: int = 110) -> float:
    """Vertical space between stacked subplots as plotly wants it (a fraction of the figure), sized in pixels
    so an x-axis title never runs into the next subplot's title."""
    return min(pixels / height, 0.9 / max(rows - 1, 1))


def _zero(v) -> float:
    return 0.0 if v is None or not math.isfinite(v) else float(v)


IMPORTANCE_META = ("evaluator", "trials", "note", "constant", "objective", "direction")


def importance_objectives(importance: dict) -> list[str]:
    """The objectives an importance dict holds with values: accuracy (a language model's ``perplexity``), then
    BitOPs (``train_bitops``) or each cost model (a model under which every trial costs the same has none)."""
    return [k for k in importance if k not in IMPORTANCE_META and importance[k]]


def importance_title(key: str) -> str:
    if key in objectives.OBJECTIVES:
        return f"for {objectives.OBJECTIVES[key].word}"
    return "for training BitOPs" if key == TRAIN_BITOPS else f"for {key}"


def importance_figure(importance: dict) -> go.Figure:
    keys = importance_objectives(importance)
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=[importance_title(k) for k in keys])
    for col, key in enumerate(keys, start=1):
        imp = importance.get(key) or {}
        names = list(imp)[::-1]  # most important on top
        fig.add_trace(go.Bar(x=[imp[n] for n in names], y=names, orientation="h", showlegend=False), row=1, col=col)
        fig.update_xaxes(title_text="importance (normalised)", range=[0, 1], row=1, col=col)
    fig.update_layout(title=f"Parameter importance (Optuna, {importance.get('evaluator')} evaluator)",
                      height=180 + 40 * max(len((importance.get(keys[0]) if keys else None) or {}), 1))
    return fig


def precision_figure(runs: list[dict], hist: dict[str, dict], events: dict[str, list]) -> go.Figure:
    """Per chosen run: mean FW/BW bits per epoch, the gated target CP when logged, and the precision events."""
    height = 300 * len(runs) + 80
    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=[run_title(r) for r in runs],
                        specs=[[{"secondary_y": True}] for _ in runs], vertical_spacing=_gap(len(runs), height))
    for i, run in enumerate(runs, start=1):
        h = hist.get(run["run_id"], {})
        for key, dash, color in (("fw_bits", "solid", "#1f77b4"), ("bw_bits", "dash", "#d62728")):
            if key in h:  # one colour per series in every subplot, so the single legend entry holds for all
                fig.add_trace(go.Scatter(x=[s for s, _ in h[key]], y=[v for _, v in h[key]], mode="lines+markers",
                                         name=key, line={"dash": dash, "color": color}, legendgroup=key,
                                         showlegend=i == 1), row=i, col=1)
        if "target_cp" in h:
            fig.add_trace(go.Scatter(x=[s for s, _ in h["target_cp"]], y=[v for _, v in h["target_cp"]],
                                     mode="lines", name="target cp %", line={"dash": "dot", "color": "#7f7f7f"},
                                     legendgroup="cp",
                                     showlegend=i == 1), row=i, col=1, secondary_y=True)
        evs = events.get(run["run_id"]) or []
        if evs and "fw_bits" in h:
            top = max(v for _, v in h["fw_bits"])
            fig.add_trace(go.Scatter(x=[e.get("epoch") for e in evs], y=[top + 0.5] * len(evs), mode="markers",
                                     marker={"symbol": "triangle-down", "size": 11, "color": "#2ca02c"},
                                     name="precision event",
                                     legendgroup="ev", showlegend=i == 1,
                                     text=[_event_text(e) for e in evs], hoverinfo="text"), row=i, col=1)
        fig.update_xaxes(title_text="epoch", dtick=1, row=i, col=1)
        fig.update_yaxes(title_text="bits (epoch mean)", row=i, col=1)
    fig.update_layout(title="Precision over training", height=height)
    return fig


def run_title(run: dict) -> str:
    point = ", ".join(f"{k}={_short(v)}" for k, v in (run.get("point") or {}).items())
    return f"{run['name']} (seed {run.get('seed')}{', ' + point if point else ''})"


def _event_text(e: dict) -> str:
    keys = ("iteration", "stage", "fw_bits", "bw_bits", "target_cp", "reason")
    return ", ".join(f"{k} {e[k]}" for k in keys if k in e)


def allocation_figure(allocs: dict[str, dict], names: dict[str, str]) -> go.Figure:
    """DFQ's bit allocation: mean forward bits chosen per gated block (rows) and epoch (columns), per run."""
    ids = list(allocs)
    height = max(320, 40 * max(len(a["fw"]) for a in allocs.values()) + 180) * len(ids)
    fig = make_subplots(rows=len(ids), cols=1, subplot_titles=[names[i] for i in ids],
                        vertical_spacing=_gap(len(ids), height))
    for i, rid in enumerate(ids, start=1):
        a = allocs[rid]
        fig.add_trace(go.Heatmap(z=a["fw"], x=a["epochs"], y=[f"block {b}" for b in range(len(a["fw"]))],
                                 colorscale="Viridis", zmin=0, zmax=max(8.0, max(max(r) for r in a["fw"])),
                                 colorbar={"title": "FW bits", "len": 1 / len(ids), "y": 1 - (i - 0.5) / len(ids)}),
                      row=i, col=1)
        fig.update_xaxes(title_text="epoch", type="category", row=i, col=1)
    fig.update_layout(title="DFQ bit allocation: mean forward bits per block and epoch (0 = skipped)",
                      height=height)
    return fig
