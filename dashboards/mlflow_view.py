"""The MLflow UI as the window on a sweep: what the sweep writes so that its page shows it without clicking.

MLflow's UI (3.17) keeps an experiment page's view (filter, sort, columns, charts, which runs the charts use) in
the browser, and can load it from an experiment tag ``mlflow.sharedViewState.<key>`` holding the view as JSON,
named by ``?viewStateShareKey=<key>`` in the page's URL (the UI's own "share view" button writes the same tag).
``publish`` writes, for one sweep:

- the view ``fractune-<sweep id>``: the sweep's trials only (``tags.fractune.sweep_id`` and kind ``trial``),
  sorted by the task objective (``results.objectives.Objective``, received: accuracy, highest first, or a language
  model's test perplexity, lowest first; a sort by a metric also lists the nested trials flat, no parent row to
  expand), with the swept parameters, that objective, training TBitOPs (``train_tbitops``), cp (``cp_pct``) and
  a gated trial's cp (``cp_gated_pct``), the readable companions of ``train_bitops``, ``cum_cp`` and ``cp_gated`` (``engine.metrics.readable_companions``;
  a sweep logged before them has the exact values), a staged sweep's ``fractune.stage`` tag, the ``pareto`` tag
  and, where a scheduler or the time limit stopped trials, their ``stopped_early`` tag as columns, every trial in
  the charts,
  and a first chart section "sweep" with the objective against training BitOPs on a log scale
  (``train_bitops_log10``: MLflow's scatter axes are linear only), the swept parameters and objectives in parallel
  coordinates, and the objective per epoch of every trial;
- the parent run's summary metrics (``sweep/trials``, ``sweep/finished``, ``sweep/stopped_early``, ``sweep/errored``,
  ``sweep/best_accuracy``, or a language model's ``sweep/best_perplexity``, ``sweep/front_size``: the best and the
  front over the trials the sweep compares, ``results.runs.compared_rows``, which leaves out a staged sweep's
  pretrain);
- the parent run's description (``mlflow.note.content``, markdown): the front as a table, each row linking to its
  run, links to the two views and to the report artifact once it is logged.

``view_url`` is the URL ``fractune ui`` prints. The experiment's kind tag (model-training mode) is
``results.store.mark_training``. Everything here is rebuilt from MLflow (``fractune ui --sweep`` refreshes
it for sweeps logged before it existed).
"""

from __future__ import annotations

import json
import math
import re

from engine.metrics import (
    CP_GATED,
    CP_GATED_PCT,
    CP_PCT,
    CUM_CP,
    TERA,
    TRAIN_BITOPS,
    TRAIN_BITOPS_LOG10,
    TRAIN_TBITOPS,
)
from results import runs, store
from results.objectives import Objective

VIEW_TAG = "mlflow.sharedViewState."
NOTE_TAG = "mlflow.note.content"
NAME_WIDTH = 260  # pixels: the run name column shows names like "pfq auto fw3-4-6-8/bw6-6-8-8 s0" (naming.py)
MAX_RUNS = 1000  # runs each chart draws (the UI's default is 10 for lines, 100 for scatters)
REPORT = "report/report.html"
# MLflow 3.17's UI takes an experiment's mode (GenAI or model training) from this URL parameter, else from the
# browser's last choice of its sidebar switch (local storage "mlflow.workflowType_v1", GenAI at first); the
# experiment's kind tag (store.KIND_TAG) is read only with its workflow-based navigation flag off, and it ships on
TRAINING_MODE = "workflowType=machine_learning"


def view_key(sweep_id: str) -> str:
    return "fractune-" + re.sub(r"[^A-Za-z0-9_.-]", "_", sweep_id)


def view_url(base: str, experiment_id: str, sweep_id: str, charts: bool = False) -> str:
    """The sweep's view on a server at ``base`` ("" for a link inside the UI itself): the table or the charts."""
    mode = "CHART" if charts else "TABLE"
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_MODE}&viewStateShareKey="
            f"{view_key(sweep_id)}&compareRunsMode={mode}")


def _col(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # the UI's canonical column key (also its sort key)


def param_columns(rows: list[dict], factors: list[str]) -> list[str]:
    """The params that hold the swept values: a swept section (e.g. the whole ``schedule``) as its leaves, in
    the order first seen; the seed when the sweep has more than one."""
    keys: list[str] = []
    for path in factors:
        for r in rows:
            value = (r.get("point") or {}).get(path)
            leaves = [f"{path}.{k}" for k in store.flatten(value)] if isinstance(value, dict) else [path]
            keys += [k for k in leaves if k not in keys]
    keys.sort(key=lambda k: not k.endswith(".kind"))  # the method first (stable: the rest as first seen)
    if len({r.get("seed") for r in rows}) > 1:
        keys.append("seed")
    return keys


def _holds(row: dict, param: str) -> bool:
    """The trial's swept point sets ``param`` (a dotted path, or a leaf of a swept section; the seed always)."""
    if param == "seed":
        return True
    point = row.get("point") or {}
    if param in point:
        return True
    return any(isinstance(v, dict) and param[len(path) + 1:] in store.flatten(v)
               for path, v in point.items() if param.startswith(path + "."))


def _logged_by_all(rows: list[dict], key: str) -> bool:
    return bool(rows) and all(math.isfinite(r.get(key, math.nan)) for r in rows if r["epochs"])


def cost_column(rows: list[dict]) -> str:
    """The training BitOPs' column: ``train_tbitops`` (tera-BitOPs, readable) where every trial logged it, else
    the exact ``train_bitops`` (a sweep logged before the readable companions existed)."""
    return TRAIN_TBITOPS if _logged_by_all(rows, TRAIN_TBITOPS) else TRAIN_BITOPS


def cp_column(rows: list[dict]) -> str:
    """cp's column: ``cp_pct`` (four significant figures) where every trial logged it, else ``cum_cp``."""
    return CP_PCT if _logged_by_all(rows, CP_PCT) else CUM_CP


def cost_axis(rows: list[dict]) -> str:
    """The scatter's cost axis: ``train_bitops_log10`` where every trial logged it (MLflow's scatter has no log
    scale, and on a linear one FP32 squeezes every quantized trial against the axis), else ``cost_column``."""
    return TRAIN_BITOPS_LOG10 if _logged_by_all(rows, TRAIN_BITOPS_LOG10) else cost_column(rows)


def objective_columns(rows: list[dict], task: Objective) -> list[str]:
    """The three objectives' metrics, in this order: the task objective (accuracy, or a language model's
    ``perplexity``), the training BitOPs (``cost_column``) and cp (``cp_column``)."""
    return [task.key, cost_column(rows), cp_column(rows)]


def metric_columns(rows: list[dict], task: Objective) -> list[str]:
    gated = [r for r in rows if math.isfinite(r.get(CP_GATED, math.nan))]  # DFQ, FracTrain
    column = CP_GATED_PCT if _logged_by_all(gated, CP_GATED_PCT) else CP_GATED
    return [*objective_columns(rows, task), *([column] if gated else [])]  # in this order in the table


def view_state(sweep_id: str, rows: list[dict], factors: list[str], task: Objective) -> dict:
    """The page's state as the UI reads it from a shared-view tag (its search facets and UI state keys)."""
    params, metrics = param_columns(rows, factors), metric_columns(rows, task)
    # a staged sweep's stage of each trial, the front's tag, and the stopped trials' where a scheduler or the time
    # limit stopped any
    tags = [*([store.STAGE_TAG] if any(r.get("stage") for r in rows) else []), "pareto",
            *([runs.STOPPED_TAG] if any(r.get("stopped") for r in rows) else [])]
    key, mode, word = task.key, task.mode, task.word
    cost = cost_axis(rows)
    axis_title = {TRAIN_BITOPS_LOG10: "log10 training BitOPs", TRAIN_TBITOPS: "training TBitOPs"}.get(
        cost, "training BitOPs")
    section = "fractune-sweep"

    def chart(n: int, **config) -> dict:
        return {"uuid": f"fractune-chart-{n}", "metricSectionId": section, "isGenerated": False, "deleted": False,
                "runsCountToCompare": MAX_RUNS, **config}

    def axis(key: str) -> dict:
        return {"key": key, "type": "METRIC"}

    charts = [
        # one scatter of cost: cp is the same cost over FP32's (a second axis FP32 would squeeze as well)
        chart(1, type="SCATTER", displayName=f"{word} vs {axis_title} (every trial)", xaxis=axis(cost),
              yaxis=axis(key)),
        # the parallel plot draws only the runs that hold every selected param: the swept ones all trials have
        chart(3, type="PARALLEL", displayName="swept parameters and objectives", selectedMetrics=objective_columns(rows, task),
              selectedParams=[p for p in params if all(_holds(r, p) for r in rows)], showAllRuns=True),
        chart(4, type="LINE", displayName=f"{word} per epoch", metricKey=key,
              selectedMetricKeys=[key], xAxisKey="step", scaleType="linear", xAxisScaleType="linear",
              lineSmoothness=0, useGlobalXaxisKey=False, useGlobalLineSmoothing=False, ignoreOutliers=False,
              range={}, yAxisKey="metric", yAxisExpressions=[], selectedXAxisMetricKey=""),
    ]
    return {
        # search facets
        "searchFilter": f"tags.`{store.SWEEP_TAG}` = '{sweep_id}' and tags.`fractune.kind` = 'trial'",
        "orderByKey": _col("metrics", key), "orderByAsc": mode == "min",
        # UI state
        "selectedColumns": ([_col("metrics", m) for m in metrics] + [_col("params", p) for p in params]
                            + [_col("tags", t) for t in tags]),
        "runsHiddenMode": "SHOW_ALL", "hideEmptyCharts": True, "useGroupedValuesInCharts": True, "groupBy": None,
        "viewMaximized": False, "runListHidden": False,
        "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo", "duration", *(_col("metrics", m) for m in metrics),
                        *(_col("params", p) for p in params), *(_col("tags", t) for t in tags)],
        "columnWidths": {"attributes.`Run Name`": NAME_WIDTH},
        "compareRunCharts": charts, "isAccordionReordered": True,
        "compareRunSections": [{"uuid": section, "name": "sweep", "display": True, "isReordered": True,
                                "deleted": False, "isGenerated": False}],
    }


def summary_metrics(rows: list[dict], task: Objective) -> dict[str, float]:
    """The sweep's summary as the parent run's metrics (read from the trial rows MLflow holds): counts over every
    trial, the front and the best over the trials it compares (``results.runs.compared_rows``)."""
    compared = runs.compared_rows(rows)
    done = runs.finished(compared, task)
    out = {"sweep/trials": float(len(rows)), "sweep/finished": float(len(runs.finished(rows, task))),
           "sweep/errored": float(sum(r["status"] == "FAILED" for r in rows)),
           "sweep/stopped_early": float(sum(bool(r.get("stopped")) for r in rows)),
           "sweep/front_size": float(len(runs.front(compared, task)))}
    if done:  # a language model's sweep: its best (lowest) test perplexity
        out[f"sweep/best_{task.key}"] = task.direction.best(r[task.key] for r in done)
    return out


def note(experiment_id: str, sweep_id: str, rows: list[dict], task: Objective, metrics: dict[str, float],
         report_run: str | None) -> str:
    """The parent run's description (markdown): the numbers, the front with links, the views and the report."""
    compared = runs.compared_rows(rows)
    front = runs.front(compared, task)
    key, mode = task.key, task.mode
    base = f"#/experiments/{experiment_id}"
    over = runs.compared_stages(rows)  # a staged sweep's front is over the stages no other starts from
    lines = [f"**Sweep `{sweep_id}`**: {len(rows)} trials, {int(metrics['sweep/finished'])} finished, "
             + (f"{int(metrics['sweep/stopped_early'])} stopped early, " if metrics.get("sweep/stopped_early") else "")
             + f"{int(metrics['sweep/errored'])} errored, {len(front)} on the Pareto front "
             + (f"of stage{'s' if len(over) > 1 else ''} {', '.join(over)} " if over else "") + f"({key} {mode}, training BitOPs min).", "",
             f"[All trials, sorted by {task.label}]"
             f"({view_url('', experiment_id, sweep_id)}) · "
             f"[Charts of every trial]({view_url('', experiment_id, sweep_id, charts=True)})"
             + (f" · [HTML report]({base}/runs/{report_run}/artifacts/{REPORT})" if report_run else ""), ""]
    hv = {k: v for k, v in metrics.items() if "hypervolume" in k}
    if hv:
        lines += [" · ".join(f"{k}: {v:.4g}" for k, v in sorted(hv.items())), ""]
    if front:
        lines += [f"| run | {key} | training TBitOPs | cp % | seed |", "| --- | ---: | ---: | ---: | ---: |"]
        for r in front:
            name = (r["name"] or r["run_id"] or "?").replace("|", "/")
            link = f"[{name}]({base}/runs/{r['run_id']})" if r["run_id"] else name
            lines.append(f"| {link} | {r[key]:.4f} | {r[TRAIN_BITOPS] / TERA:.4g} | {r['cp']:.3g} | "
                         f"{r['seed']} |")
    else:
        lines.append("No trial finished its planned epochs: the front is empty.")
    return "\n".join(lines)


def publish(c, experiment_id: str, parent_run_id: str, sweep_id: str, rows: list[dict],
            factors: list[str], task: Objective) -> dict:
    """Write the sweep's view tag, the parent's summary metrics and its note. Idempotent; returns what it wrote."""
    import time

    from mlflow.entities import Metric

    c.set_experiment_tag(experiment_id, VIEW_TAG + view_key(sweep_id),
                         json.dumps(view_state(sweep_id, rows, factors, task), separators=(",", ":")))
    metrics = summary_metrics(rows, task)
    now = int(time.time() * 1000)
    c.log_batch(parent_run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    held = c.get_run(parent_run_id).data.metrics  # a hypervolume another step logged is shown too
    metrics.update({k: v for k, v in held.items() if "hypervolume" in k})
    has_report = any(a.path == REPORT for a in c.list_artifacts(parent_run_id, "report"))
    text = note(experiment_id, sweep_id, rows, task, metrics, parent_run_id if has_report else None)
    c.set_tag(parent_run_id, NOTE_TAG, text)
    return {"view": view_key(sweep_id), "metrics": metrics, "note": text}


def publish_sweep(data: runs.SweepRuns) -> dict:
    return publish(data.client, data.experiment_id, data.parent_run_id, data.sweep_id, data.rows, data.factors,
                   data.task)
