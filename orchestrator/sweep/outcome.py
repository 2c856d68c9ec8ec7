"""A sweep's outcome at its end, for a plain and a staged sweep alike: its trial rows as MLflow holds them
(``results.runs``; Tune's results where the store cannot give them), its Pareto front tagged on the runs,
``pareto.json`` beside the experiment and on the parent run, and the parent closed with the sweep's view in the
MLflow UI, its summary metrics and note (``close_parent``)."""

from __future__ import annotations

import json
from pathlib import Path

from dashboards.ui import ui_command
from orchestrator.sweep.storage import storage_problem
from results.output import json_text
from search_spaces import naming, trial
from search_spaces.spec import LoadedSpec


def save_summary(exp_path: Path, summary: dict, track: dict) -> None:
    """``pareto.json`` (front, errors, trial rows) beside the experiment: kept when MLflow is down; a storage
    error is noted in ``track``, not raised."""
    try:
        from results.output import write_atomic

        write_atomic(exp_path / "pareto.json", json_text(summary, indent=1, default=str))
    except OSError as exc:
        track["storage_error"] = f"{exp_path}: {exc.strerror}"


def log_front(c, parent_id: str, summary: dict) -> None:
    """The front's runs tagged ``pareto``, and ``pareto.json`` on the parent run."""
    for r in summary["pareto"]:
        if r["run_id"]:
            c.set_tag(r["run_id"], "pareto", "true")
    c.log_text(parent_id, json_text(summary, indent=1, default=str), "pareto.json")


def sweep_front(rows: list[dict], task, objective: str) -> tuple[list[dict], dict]:
    """The sweep's Pareto front over the trials it compares (``results.runs.compared_rows``: a staged sweep's
    stages that none starts from) and the front's quality."""
    from results import runs

    compared = runs.compared_rows(rows)
    front = runs.front(compared, task, objective)
    return front, runs.front_quality(runs.finished(compared, task, objective), front, task, objective)


def close_parent(c, parent, sweep_id: str, summary: dict, quality: dict, factors: list[str], task,
                 tags: dict[str, str]) -> None:
    """The sweep's outcome on its parent run, for a plain and a staged sweep alike: the front (``log_front``),
    ``tags`` and the cost model, the front's hypervolume with its reference point, the sweep's view in the MLflow
    UI with the summary metrics and the note (``dashboards.mlflow_view``); then FINISHED."""
    from results import runs

    parent_id, objective, rows = parent.info.run_id, summary["objective"], summary["trials"]
    log_front(c, parent_id, summary)
    for key, value in {**tags, runs.OBJECTIVE_TAG: objective}.items():
        c.set_tag(parent_id, key, value)
    runs.log_quality(c, parent_id, quality)
    if factors or rows:
        from dashboards.mlflow_view import publish

        publish(c, parent.info.experiment_id, parent_id, sweep_id, rows, factors, task)
    c.set_terminated(parent_id, "FINISHED")


def finish(loaded: LoadedSpec, grid, uri: str, sweep_id: str, exp_path: Path, wall: float,
           report: dict | None = None) -> dict:
    """The sweep's outcome: its trial rows as MLflow holds them (``results.runs``, the loader every reader
    uses), the front tagged and ``pareto.json`` written beside the experiment and on the parent run; the parent's
    summary metrics, its note and the sweep's view in the MLflow UI (``dashboards.mlflow_view``)."""
    from orchestrator.tracking.tracker import REPORT_FILE
    from results import objectives, runs, store

    report_file = exp_path / REPORT_FILE
    track = dict(report) if report else (json.loads(report_file.read_text()) if report_file.is_file() else {})
    run_ids, parent_id = track.get("runs", {}), track.get("parent_run_id")
    variation = naming.variation(loaded)
    errors = [{"trial_id": r.metrics.get("trial_id"), "run_id": run_ids.get(r.metrics.get("trial_id")),
               "label": trial.label(r.config, variation), "error": store.one_line_error(r.error)}
              for r in grid if r.error is not None]
    c = parent = rows = None
    factors: list[str] = []
    try:
        c = store.client(uri)
        parent = c.get_run(parent_id) if parent_id else None
        if parent is not None and not track.get("pending"):
            rows, factors = runs.trial_rows(c, parent)
    except Exception as exc:  # the store went away at the very end: the summary comes from Tune's results
        track["final_error"] = store.one_line_error(exc)
    if rows is None:  # the store is unreachable or behind (operations pending): the same rows from Tune
        rows = [result_row(r, run_ids) for r in grid]
    else:  # a FINISHED run is final: a stale state's rerun that failed is not the trial's error
        final = {r["run_id"] for r in rows if r.get("status") == "FINISHED"}
        errors = [e for e in errors if e["run_id"] not in final]
        known = {e["run_id"] for e in errors}
        # a trial MLflow holds as FAILED is an error even where Tune could not write (or read back) its error
        errors += [{"trial_id": r["trial_id"], "run_id": r["run_id"],
                    "label": f"{r.get('method') or r.get('schedule')} [{r.get('name')}]",
                    "error": "the run FAILED (see its fractune.error tag)"}
                   for r in rows if r.get("status") == "FAILED" and r["run_id"] not in known]
    objective, task = loaded.spec.objective, objectives.of_spec(loaded)
    front, quality = sweep_front(rows, task, objective)
    summary = {"objective": objective, "front_quality": quality, "pareto": front, "errors": errors, "trials": rows}
    save_summary(exp_path, summary, track)
    if parent is not None:
        try:
            close_parent(c, parent, sweep_id, summary, quality, factors, task,
                         {"fractune.errored": str(len(errors)), "fractune.trials": str(len(grid))})
        except Exception as exc:  # the summary is on disk
            track["pending"] = track.get("pending", 0) + 1
            track["final_error"] = store.one_line_error(exc)
    elif track.get("final_error"):  # the store could not be read at the end: the summary is on disk only
        track["pending"] = track.get("pending", 0) + 1
    return {
        "sweep": loaded.name,
        "sweep_id": sweep_id,
        "experiment_id": parent.info.experiment_id if parent is not None else None,
        "parent_run_id": parent_id,
        "trials": len(grid),
        "errored": len(errors),
        "errors": errors,
        "objective": objective,
        "hypervolume": quality["hypervolume"],
        "pareto": [runs.front_entry(r, task, objective) for r in front],
        # stopped before their planned epochs (ASHA, the time limit): FINISHED, tagged, off the front
        "stopped": runs.stopped_trials(rows),
        "tracking": {k: track.get(k) for k in ("failed_calls", "backfilled", "pending", "gap", "final_error",
                                               "report_error", "storage_error") if track.get(k) is not None},
        "storage": str(exp_path),
        "storage_problem": storage_problem(exp_path.parent) if exp_path.parent.exists() else None,
        "tracking_uri": store.redact(uri),
        "wall_seconds": wall,
        "ui": ui_command(store.redact(uri), loaded.name,
                         (parent.info.experiment_id, sweep_id) if parent is not None and rows else None),
    }


def result_row(result, run_ids: dict) -> dict:
    """A trial's row from its Tune result, for when the tracking store cannot give it (same fields and rule)."""
    from results import runs

    m, cfg = result.metrics, trial.decode(result.config)
    return runs.make_row(run_id=run_ids.get(m.get("trial_id")), trial_id=m.get("trial_id"), name=None,
                         status="FAILED" if result.error is not None else "FINISHED", schedule=cfg.schedule.kind,
                         metrics=m, seed=cfg.seed, point=trial.swept_values(result.config),
                         planned_epochs=cfg.run_length().epochs, node_id=m.get("node_id"))
