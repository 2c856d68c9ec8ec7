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
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError, FractuneError
from orchestrator.sweep.lifecycle import (
    SweepInterrupted,
    claim_sweep_id,
    hold_sweep,
    interruptible,
    reconcile,
)
from orchestrator.sweep.outcome import finish
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

    from results import lineage, store, store_checks
    from trainables.tune_trainable import train_trial

    spec = loaded.spec
    uri = store.normalise_uri(opts.tracking_uri or store.default_tracking_uri())
    store_checks.preflight(uri)
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
        from orchestrator.sweep.tune_checkpoints import restore_state, restored_tuner

        if note := restore_state(exp_path):  # a state file cut by a full or read-only disk
            print(f"fractune: {note}", file=sys.stderr)
        if not tune.Tuner.can_restore(str(exp_path)):
            raise ConfigError.single("--resume", spec.name, f"{exp_path} holds no restorable sweep")
        print(f"resuming sweep {sweep_id} from {exp_path}", file=sys.stderr)
        no_auto_loggers()
        tuner = restored_tuner(exp_path, trainable, spec.name)
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
    from trainables.tune_trainable import remove_ray_train_runs

    remove_ray_train_runs(exp_path)  # every trial has ended: no Ray Train run is resumed from these
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
