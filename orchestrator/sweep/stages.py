"""Staged sweeps: the stages of a spec run in order on Ray Tune, under one MLflow parent run.

Each stage is a Tune experiment of its own, ``<storage>/<sweep id>/<stage>``; ``stages.json`` beside them records
every finished stage: its trials' errors and, per seed, the run (MLflow run id, final checkpoint) a later stage's
trial of that seed starts from (``init_from``), or why there is none. The trial dicts of such a stage carry that
map (``search_spaces.trial.staged``): the trial of seed s loads the weights of seed s's run, its MLflow run is tagged
``fractune.stage``, ``fractune.init_run`` and ``fractune.init_stage``; the trial of a seed whose earlier run failed
fails at once with the reason (``trainables.tune_trainable.DependencyFailed``), the other seeds' trials run.

``--resume`` restores the latest staged sweep of the name: a stage recorded in ``stages.json`` is not run again,
an unfinished stage is restored with ``Tuner.restore`` (finished trials kept, the others resumed from their last
checkpoint), a stage never started starts. The outcome is the sweep's: its Pareto front over the trials it
compares (``results.runs.compared_rows``: every stage but those another starts from), every stage's errors,
``pareto.json`` beside the experiment and on the parent run, and the sweep's view in the MLflow UI.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dashboards.ui import ui_command
from engine.errors import ConfigError
from orchestrator.sweep.driver import (
    SweepError,
    SweepOptions,
    fit,
    make_tuner,
    no_auto_loggers,
    spec_file_param,
)
from orchestrator.sweep.lifecycle import SweepInterrupted, reconcile
from orchestrator.sweep.outcome import close_parent, save_summary, sweep_front
from orchestrator.sweep.space import param_space
from orchestrator.sweep.storage import storage_problem
from search_spaces import trial
from search_spaces.spec import LoadedSpec

MANIFEST = "stages.json"


def read_manifest(exp_root: Path) -> dict:
    path = exp_root / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {"stages": {}}


def write_manifest(exp_root: Path, manifest: dict) -> None:
    path = exp_root / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    tmp.replace(path)  # atomic: a killed driver leaves the previous record


def run_staged(loaded: LoadedSpec, opts: SweepOptions, uri: str, root: Path, sweep_id: str, trainable,
               init_runs) -> dict:
    """A staged sweep (``orchestrator.sweep.launch.run_sweep`` once the sweep id is claimed and Ray is up)."""
    from ray import tune

    from orchestrator.sweep.progress_lines import ProgressPrinter
    from orchestrator.tracking.tracker import MLflowTracker, read_report
    from results import objectives
    from search_spaces import naming

    spec = loaded.spec
    exp_root = root / sweep_id
    manifest = read_manifest(exp_root)
    if opts.resume and not (exp_root / MANIFEST).is_file():  # written before the first stage starts
        raise ConfigError.single("--resume", spec.name, f"{exp_root} holds no staged sweep (no {MANIFEST})")
    exp_root.mkdir(parents=True, exist_ok=True)
    names = [sub.stage.name for sub in loaded.stages]
    manifest.setdefault("sweep_id", sweep_id)
    manifest.setdefault("order", names)
    write_manifest(exp_root, manifest)
    info = {"sweep_id": sweep_id, "spec": spec.name, "algorithm": "grid", "stages": ",".join(names),
            "planned_trials": loaded.num_trials(), "seeds": spec.seeds, "resources": spec.resources.model_dump(),
            "storage": str(exp_root), "scheduler": spec.scheduler.kind, **spec_file_param(loaded)}
    print(f"staged sweep {sweep_id}: stages {' -> '.join(names)}, {loaded.num_trials()} trials, storage {exp_root}, "
          f"tracking {uri}", file=sys.stderr)
    started = time.perf_counter()
    for sub in loaded.stages:
        stage = sub.stage
        if stage.name in manifest["stages"]:
            print(f"stage {stage.name}: finished before, not run again", file=sys.stderr)
            continue
        stage_path = exp_root / stage.name
        inits = None
        if stage.init_from:
            inits = {int(s): v for s, v in manifest["stages"][stage.init_from]["seeds"].items()}
        tracker = None
        from orchestrator.sweep.tune_checkpoints import restore_state, restored_tuner

        if opts.resume and (note := restore_state(stage_path)):
            print(f"fractune: stage {stage.name}: {note}", file=sys.stderr)
        if opts.resume and tune.Tuner.can_restore(str(stage_path)):
            print(f"stage {stage.name}: resuming from {stage_path}", file=sys.stderr)
            no_auto_loggers()
            tuner = restored_tuner(stage_path, trainable, spec.name)
        else:
            tracker = MLflowTracker(uri, spec.name, sweep_id, info, spec.model_dump(mode="json"), str(stage_path),
                                    variation=naming.variation(sub))
            callbacks: list = [tracker]
            if opts.progress:
                callbacks.append(ProgressPrinter(sub.num_trials(), objectives.of_spec(sub), naming.variation(sub)))
            space = trial.staged(param_space(sub, sweep_id, init_runs), stage.name, inits)
            tuner = make_tuner(sub, trainable, space, sweep_id, stage.name, exp_root, callbacks)
            print(f"stage {stage.name}: {sub.num_trials()} trials" +
                  (f", each from the {stage.init_from} run of its seed" if stage.init_from else ""), file=sys.stderr)
        try:
            grid = fit(tuner, uri, spec.name, sweep_id)
        except SweepInterrupted:
            raise
        except Exception as exc:  # Tune itself gave up
            reconcile(uri, spec.name, sweep_id, parent_status="FAILED")  # its stopped trials: KILLED, resumable
            raise SweepError(storage_problem(root) or f"Ray Tune could not finish stage {stage.name} of sweep "
                             f"{sweep_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
                             "rerun with --resume") from None
        report = getattr(tracker, "last_report", None) or read_report(stage_path)
        manifest["stages"][stage.name] = stage_record(stage.name, grid, report, naming.variation(sub))
        write_manifest(exp_root, manifest)
    return finish_staged(loaded, manifest, uri, sweep_id, exp_root, time.perf_counter() - started)


def stage_record(name: str, grid, report: dict, variation: dict) -> dict:
    """A finished stage: its trials, errors (each with its trial's label: ``search_spaces.trial.label`` of the
    stage's ``variation``) and per seed the run a later stage starts from (or why not)."""
    from results import store

    run_ids = report.get("runs", {})
    seeds, errors = {}, []
    for r in grid:
        tid = (r.metrics or {}).get("trial_id")  # Tune sets it even for a trial that never reported
        run_id, seed = run_ids.get(tid), int(r.config[trial.SEED])
        if r.error is not None:
            reason = store.one_line_error(r.error)
            errors.append({"stage": name, "trial_id": tid, "run_id": run_id, "seed": seed,
                           "label": trial.label(r.config, variation), "error": reason})
            seeds[str(seed)] = {"error": f"the {name} run {run_id} of seed {seed} failed ({reason})",
                                "run_id": run_id, "stage": name}
        elif r.checkpoint is None:
            seeds[str(seed)] = {"error": f"the {name} run {run_id} of seed {seed} left no checkpoint",
                                "run_id": run_id, "stage": name}
        else:
            seeds[str(seed)] = {"checkpoint": r.checkpoint.path, "run_id": run_id, "stage": name}
    return {"trials": len(grid), "errors": errors, "seeds": seeds, "parent_run_id": report.get("parent_run_id"),
            "runs": sorted(v for v in run_ids.values() if v)}


def finish_staged(loaded: LoadedSpec, manifest: dict, uri: str, sweep_id: str, exp_root: Path, wall: float) -> dict:
    """The outcome: every stage's trials and errors; the Pareto front of the compared trials that finished,
    tagged and written as ``pareto.json`` beside the experiment and on the parent run, which is then closed
    (``close_parent``)."""
    from results import objectives, runs, store

    stages = [sub.stage.name for sub in loaded.stages]
    records = manifest["stages"]
    errors = [e for s in stages for e in records[s]["errors"]]
    parent_id = next((records[s].get("parent_run_id") for s in stages if records[s].get("parent_run_id")), None)
    track: dict = {}
    c = parent = rows = None
    factors: list[str] = []
    try:
        c = store.client(uri)
        parent = c.get_run(parent_id) if parent_id else None
        rows, factors = runs.trial_rows(c, parent) if parent is not None else (None, [])
    except Exception as exc:  # the store went away at the very end: the record on disk still holds the outcome
        track["final_error"] = store.one_line_error(exc)
    rows = rows or []
    objective, task = loaded.spec.objective, objectives.of_spec(loaded)
    front, quality = sweep_front(rows, task, objective)  # a pretrain is where trials start, not compared
    summary = {"stages": stages, "objective": objective, "front_quality": quality, "pareto": front,
               "errors": errors, "trials": rows}
    save_summary(exp_root, summary, track)
    if parent is not None:
        try:
            c.log_dict(parent_id, manifest, "stages.json")
            close_parent(c, parent, sweep_id, summary, quality, factors, task,
                         {"fractune.stages": ",".join(stages), "fractune.errored": str(len(errors)),
                          "fractune.trials": str(sum(records[s]["trials"] for s in stages))})
        except Exception as exc:
            track["pending"] = 1
            track["final_error"] = store.one_line_error(exc)
    by_stage = {s: {"trials": records[s]["trials"], "errored": len(records[s]["errors"]),
                    "runs": records[s].get("runs", [])} for s in stages}
    return {
        "sweep": loaded.name,
        "sweep_id": sweep_id,
        "experiment_id": parent.info.experiment_id if parent is not None else None,
        "parent_run_id": parent_id,
        "stages": by_stage,
        "trials": sum(records[s]["trials"] for s in stages),
        "errored": len(errors),
        "errors": errors,
        "objective": objective,
        "hypervolume": quality["hypervolume"],
        "pareto": [runs.front_entry(r, task, objective) for r in front],
        "compared_stages": runs.compared_stages(rows, stages),
        "stopped": runs.stopped_trials(rows),
        "tracking": track,
        "storage": str(exp_root),
        "tracking_uri": store.redact(uri),
        "wall_seconds": wall,
        "ui": ui_command(store.redact(uri), loaded.name,
                         (parent.info.experiment_id, sweep_id) if parent is not None and rows else None),
    }
