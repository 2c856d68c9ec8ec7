"""Run a sweep on Ray Tune: local Ray by default, ``address`` to attach to a running cluster
(``orchestrator.sweep.ray_cluster``).

Only ``ray.tune.*`` APIs. Storage is absolute (``orchestrator.sweep.storage``); every sweep invocation gets an id
``<name>-<timestamp>`` of its own (``orchestrator.sweep.lifecycle``: a suffix where another start of the same
second holds it) so a second run never overwrites the first, and ``resume`` restores the latest unfinished one
with ``Tuner.restore``; SIGINT and SIGTERM stop a sweep gracefully (``SweepInterrupted``). Resources are checked
against the cluster before ``fit()``, and after ``fit()`` trial errors are surfaced, not swallowed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dashboards.ui import ui_command
from engine.errors import ConfigError, FractuneError
from orchestrator.sweep.lifecycle import (
    SweepInterrupted,
    claim_sweep_id,
    hold_sweep,
    interruptible,
    reconcile,
)
from orchestrator.sweep.ray_cluster import check_resources, init_ray
from orchestrator.sweep.space import param_space, search_algorithm, tune_metrics
from orchestrator.sweep.storage import check_shared_storage, latest_sweep_id, storage_problem, storage_root
from search_spaces import trial
from search_spaces.spec import LoadedSpec


class SweepError(FractuneError):
    exit_code = 1


@dataclass
class SweepOptions:
    address: str | None = None
    tracking_uri: str | None = None
    storage: str | None = None
    resume: bool = False
    dashboard: bool = False
    progress: bool = True
    verbose: bool = False  # Tune's and MLflow's log lines on stderr, else in the sweep's fractune.log


def sweep_taken(uri: str, name: str):
    """``taken(sweep_id)`` for ``lifecycle.claim_sweep_id``: whether the tracking store holds a parent run of that
    id (a sweep of the same second with another storage folder); False where the store cannot say."""
    def taken(sweep_id: str) -> bool:
        from results import store

        try:
            return store.sweep_parent(store.client(uri), name, sweep_id) is not None
        except Exception:  # noqa: BLE001  an unreadable store: the storage folder's claim stands
            return False
    return taken


def start_sweep(loaded: LoadedSpec, opts: SweepOptions):
    """What every sweep (plain or staged) does before its first Tuner: the tracking store checked, the storage
    root, the sweep id (the latest one on ``--resume``), Ray started or attached with the resources and shared
    storage checked, every ``init.run_id`` resolved to its checkpoint, and the trainable with its resources.
    Returns ``(uri, root, sweep_id, trainable, init_runs)``."""
    from ray import tune

    from results import lineage, store
    from trainables.tune_trainable import train_trial

    spec = loaded.spec
    uri = store.normalise_uri(opts.tracking_uri or store.default_tracking_uri())
    store.preflight(uri)
    init_runs = lineage.resolve_runs(uri, lineage.spec_run_ids(loaded))  # before Ray starts: a bad run id exits 2
    root = storage_root(opts.storage)
    if opts.resume:
        sweep_id = latest_sweep_id(root, spec.name)
        hold_sweep(root / sweep_id, sweep_id)  # a second resume of a running sweep is refused
    init_ray(opts.address, opts.dashboard)
    check_resources(spec.resources.cpu, spec.resources.gpu, spec.resources.workers)
    check_shared_storage(root)
    if opts.resume:
        reconcile(uri, spec.name, sweep_id, parent_status=None)  # runs a killed driver left RUNNING
    else:  # claimed once every check passed: a refused sweep leaves nothing behind
        sweep_id = claim_sweep_id(root, spec.name, sweep_taken(uri, spec.name))
        hold_sweep(root / sweep_id, sweep_id)
    # a data-parallel trial coordinates its Ray Train workers, which hold the resources: the trial itself takes
    # no CPU (a token of memory: Tune needs a resource), so its workers never wait for CPUs their own trial holds
    trainable = tune.with_resources(train_trial, {"cpu": 0, "memory": 2**20} if spec.resources.workers > 1 else
                                    {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu})
    return uri, root, sweep_id, trainable, init_runs


def spec_file_param(loaded: LoadedSpec) -> dict[str, str]:
    """``spec_file``, the parent run's param naming the spec file the sweep ran (its results page names it)."""
    from results import provenance

    path = provenance.spec_file(loaded.source)
    return {"spec_file": path} if path else {}


def run_plain(loaded: LoadedSpec, opts: SweepOptions, uri: str, root: Path, sweep_id: str, trainable,
               init_runs) -> dict:
    """A sweep without stages (``orchestrator.sweep.launch.run_sweep`` once the sweep id is claimed and Ray is up)."""
    from ray import tune

    from orchestrator.sweep.progress_lines import ProgressPrinter
    from orchestrator.tracking.tracker import MLflowTracker
    from results import objectives, store
    from search_spaces import naming

    spec = loaded.spec
    exp_path = root / sweep_id

    tracker = None
    if opts.resume:
        from orchestrator.sweep.tune_checkpoints import restore_state

        if note := restore_state(exp_path):  # a state file cut by a full or read-only disk
            print(f"fractune: {note}", file=sys.stderr)
        if not tune.Tuner.can_restore(str(exp_path)):
            raise ConfigError.single("--resume", spec.name, f"{exp_path} holds no restorable sweep")
        print(f"resuming sweep {sweep_id} from {exp_path}", file=sys.stderr)
        no_auto_loggers()
        tuner = tune.Tuner.restore(str(exp_path), trainable, resume_unfinished=True, resume_errored=True)
    else:
        info = {"sweep_id": sweep_id, "spec": spec.name, "algorithm": spec.search.algorithm,
                "sampler": spec.search.sampler, "num_samples": spec.search.num_samples,
                "planned_trials": loaded.num_trials(), "seeds": spec.seeds, "resources": spec.resources.model_dump(),
                "storage": str(exp_path), "scheduler": spec.scheduler.kind, **spec_file_param(loaded)}
        tracker = MLflowTracker(uri, spec.name, sweep_id, info, spec.model_dump(mode="json"), str(exp_path),
                                variation=naming.variation(loaded))
        callbacks: list = [tracker]
        if opts.progress:
            callbacks.append(ProgressPrinter(loaded.num_trials(), objectives.of_spec(loaded), naming.variation(loaded)))
        tuner = make_tuner(loaded, trainable, param_space(loaded, sweep_id, init_runs), sweep_id, sweep_id, root,
                           callbacks)
        print(f"sweep {sweep_id}: {loaded.num_trials()} trials, storage {exp_path}, tracking {store.redact(uri)}", file=sys.stderr)
    started = time.perf_counter()
    try:
        grid = fit(tuner, uri, spec.name, sweep_id)
    except SweepInterrupted:
        raise
    except Exception as exc:  # Tune itself gave up (e.g. its state or error files could not be written)
        cause = storage_problem(root) or (f"Ray Tune could not finish sweep {sweep_id}: {type(exc).__name__}: "
                                          f"{str(exc).splitlines()[0] if str(exc) else ''}")
        started_any = bool(tracker is not None and tracker.state["runs"])
        mark_failed(tracker, cause)
        reconcile(uri, spec.name, sweep_id, parent_status="FAILED")  # the trials it stopped: KILLED, resumable
        resume = "" if "--resume" in cause else "; rerun with --resume"
        raise SweepError(cause + (resume if started_any or tracker is None else
                                  "; no trial started (the parent run is marked FAILED)")) from None
    # the tracker's own report when it ran in this process, else the one it wrote beside the experiment
    report = getattr(tracker, "last_report", None) if not opts.resume else None
    return finish(loaded, grid, uri, sweep_id, exp_path, time.perf_counter() - started, report)


QUIET_LOGGERS = ("ray.tune", "ray.train", "ray.air", "mlflow", "alembic", "sqlalchemy")


@contextlib.contextmanager
def quiet_logs(exp_path: Path, verbose: bool):
    """Ray Tune's and MLflow's log lines (a traceback per failed trial, one per failed write to a full tracking
    database) go to ``fractune.log`` beside the sweep's state instead of stderr while the sweep runs; fractune's
    own lines say what failed and name the file. Yields the file, or None with ``verbose`` (or where it cannot
    be opened); the loggers are as they were afterwards."""
    import logging

    class QuietFileHandler(logging.FileHandler):
        """Opens the file for each record and closes it again: no file held open for writing on the storage (a
        file system with one cannot be remounted read-only), and a full or read-only disk loses the line
        quietly."""

        def emit(self, record) -> None:
            super().emit(record)
            with contextlib.suppress(OSError):
                self.close()

        def handleError(self, record) -> None:  # noqa: N802
            pass

    handler = None if verbose else QuietFileHandler(exp_path / "fractune.log", delay=True)
    if handler is None:
        yield None
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved = {}
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.propagate)
        for h in logger.handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                logger.removeHandler(h)
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield Path(handler.baseFilename)
    finally:
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate = propagate
        with contextlib.suppress(OSError):  # its last lines on a full disk: lost, the sweep's outcome is not
            handler.close()


def fit(tuner, uri: str, experiment: str, sweep_id: str):
    """``tuner.fit()``, stopped gracefully on SIGINT or SIGTERM (``lifecycle.interruptible``): the sweep's runs
    left RUNNING become KILLED and ``SweepInterrupted`` says how far it got."""
    with interruptible() as got:
        try:
            grid = tuner.fit()
        except KeyboardInterrupt:  # a second signal, or one before Tune's loop ran
            grid = None
    if "signal" not in got:
        if grid is None:
            raise KeyboardInterrupt
        return grid
    reconcile(uri, experiment, sweep_id)
    finished = sum(1 for r in grid if r.error is None and (r.metrics or {}).get("done")) if grid is not None else 0
    raise SweepInterrupted(got["signal"], sweep_id, finished, len(grid) if grid is not None else 0)


def mark_failed(tracker, cause: str) -> None:
    """A sweep that Tune refused or abandoned: its parent run FAILED with the cause, never left RUNNING."""
    if tracker is None or not tracker.state.get("parent_run_id"):
        return
    from results.store import one_line_error

    try:
        tracker.c.set_tag(tracker.state["parent_run_id"], "fractune.error", one_line_error(cause)[:5000])
        tracker.c.set_terminated(tracker.state["parent_run_id"], "FAILED")
    except Exception:  # noqa: BLE001  the store is down as well: the error line still tells the user
        pass


def no_auto_loggers() -> None:
    """Tune adds CSV, JSON and TensorBoard loggers to a run unless told not to; fractune asks for the first two
    itself (``make_tuner``; a restored run keeps its callbacks). The TensorBoard one writes event files nothing
    reads, and its tensorboardX imports torch in a driver that otherwise never loads it."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"


def make_tuner(loaded: LoadedSpec, trainable, space: dict, sweep_id: str, name: str, storage: Path, callbacks: list):
    """The Tuner of a sweep (or of one stage of a staged sweep: ``name`` is the stage, under ``storage``)."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from orchestrator.sweep.tune_checkpoints import CheckpointPruner, StateKeeper, checkpoint_config

    no_auto_loggers()
    spec = loaded.spec
    scheduler = None
    if spec.scheduler.kind == "asha":
        from ray.tune.schedulers import ASHAScheduler

        max_t = trial.decode(loaded.base_trial()).run_length().epochs
        (metric, mode), _ = tune_metrics(loaded)  # accuracy max, or a language model's test perplexity min
        scheduler = ASHAScheduler(time_attr="training_iteration", metric=metric, mode=mode, max_t=max_t,
                                  grace_period=spec.scheduler.grace_period,
                                  reduction_factor=spec.scheduler.reduction_factor)
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(search_alg=search_algorithm(loaded, sweep_id, storage), scheduler=scheduler,
                                    num_samples=spec.search.num_samples,
                                    max_concurrent_trials=spec.budget.max_concurrent_trials,
                                    time_budget_s=spec.budget.time_limit_s, reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=str(storage),
                                  callbacks=[*callbacks, JsonLoggerCallback(), CSVLoggerCallback(), CheckpointPruner(),
                                             StateKeeper(str(storage / name))],
                                  verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=spec.budget.max_failures),
                                  checkpoint_config=checkpoint_config()),
    )


def save_summary(exp_path: Path, summary: dict, track: dict) -> None:
    """``pareto.json`` (front, errors, trial rows) beside the experiment: kept when MLflow is down; a storage
    error is noted in ``track``, not raised."""
    try:
        from results.output import write_atomic

        write_atomic(exp_path / "pareto.json", json.dumps(summary, indent=1, default=str))
    except OSError as exc:
        track["storage_error"] = f"{exp_path}: {exc.strerror}"


def log_front(c, parent_id: str, summary: dict) -> None:
    """The front's runs tagged ``pareto``, and ``pareto.json`` on the parent run."""
    for r in summary["pareto"]:
        if r["run_id"]:
            c.set_tag(r["run_id"], "pareto", "true")
    c.log_dict(parent_id, summary, "pareto.json")


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
    if math.isfinite(quality["hypervolume"]):
        key = "hypervolume_" + objective.replace(":", "_")
        c.log_metric(parent_id, key, quality["hypervolume"])
        c.set_tag(parent_id, f"fractune.{key}.reference", quality["rule"][:5000])
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
    errors = [{"trial_id": r.metrics.get("trial_id"), "run_id": run_ids.get(r.metrics.get("trial_id")),
               "error": store.one_line_error(r.error)} for r in grid if r.error is not None]
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
        errors += [{"trial_id": r["trial_id"], "run_id": r["run_id"], "error": "the run FAILED (see its "
                    "fractune.error tag)"} for r in rows if r.get("status") == "FAILED" and r["run_id"] not in known]
    objective, task = loaded.spec.objective, objectives.of_spec(loaded)
    front = runs.front(rows, task, objective)
    quality = runs.front_quality(runs.finished(rows, task, objective), front, task, objective)
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
