"""fractune's Python API: what the ``fractune`` command line does, as functions a notebook calls.

Train one experiment (``train``), run a sweep or an ablation on Ray Tune (``sweep``, ``ablate``: a local Ray by
default, ``address=`` for a running cluster, ``resume=True`` to continue), check a file (``validate``), read a
sweep's trials and its Pareto front back from MLflow as pandas DataFrames (``results``, ``pareto``; the front with
the sweep's state: ``pareto_front``) and write its report (``report``: the HTML page and the PNGs of its figures).
Results are typed (pydantic models); errors are the ones the CLI reports: every ``FractuneError`` (``ConfigError``
with its ``problems``, one ``(field, value, allowed)`` each, ``DataError``, ``CheckpointError``, ...) is raised
where the CLI would print it and exit 2. The CLI's commands are a layer over these functions: they parse the
arguments and print.

Importing this module loads neither Ray, MLflow nor torch: each function imports what it needs. See docs/api.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.errors import CheckpointError, ConfigError, DataError, FractuneError, TrainingDiverged
from orchestrator import _interrupts as interrupts
from orchestrator._data_parallel import check_workers, train_on_workers
from orchestrator._inputs import (
    PathLike,
    check_not_overwritten,
    check_resume,
    experiment_config,
    load_any,
    where,
)
from orchestrator._preflight import load_for_cluster
from orchestrator._reports import write_report
from orchestrator._result_types import (
    AblationResult,
    CompareResult,
    ParetoFront,
    ReportResult,
    SweepList,
    SweepResult,
    TrainResult,
    ValidationResult,
    sweep_result,
)
from orchestrator.sweep.lifecycle import SweepInterrupted

if TYPE_CHECKING:
    import pandas as pd

    from engine.config.experiment import ExperimentConfig

__all__ = [
    "train", "sweep", "ablate", "validate", "sweeps", "results", "pareto", "pareto_front", "report", "compare",
    "TrainResult", "SweepResult", "AblationResult", "SweepList", "ParetoFront", "ReportResult", "CompareResult",
    "ValidationResult",
    "FractuneError", "ConfigError", "DataError", "CheckpointError", "TrainingDiverged", "SweepInterrupted",
    "SweepError",  # noqa: F822  loaded on first use (module __getattr__): it lives with the Tune code
]


def __getattr__(name: str):  # SweepError lives with the Tune code, which imports torch: loaded when asked for
    if name == "SweepError":
        from orchestrator.sweep.driver import SweepError

        return SweepError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- train -----------------------------------------------------------------------------------------------------
def train(config: PathLike | Mapping[str, Any] | ExperimentConfig, *, overrides: Sequence[str] = (),
          data_dir: str | None = None, tracking_uri: str | None = None, checkpoint_dir: str | None = None,
          resume: str | None = None, history: str | None = None,
          on_epoch: Callable[[dict[str, Any]], None] | None = None, progress: bool = True) -> TrainResult:
    """Train one experiment in this process (no Ray, no MLflow), as ``fractune train`` does.

    Args:
        config: an experiment YAML file (see examples/), its contents as a mapping, or an ``ExperimentConfig``.
        overrides: ``"key.path=value"`` settings applied on top, e.g. ``["schedule.fw=6"]`` (``--set``).
        data_dir: the folder holding the data set (overrides ``data.data_dir``).
        tracking_uri: where a config's ``init.run_id`` is looked up (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///$PWD/mlflow.db``).
        checkpoint_dir: write a checkpoint here after every epoch.
        resume: a checkpoint folder written by ``checkpoint_dir`` to continue from.
        history: append the per-epoch metrics to this file as JSON lines.
        on_epoch: called with each epoch's metrics.
        progress: the start line and a line per epoch on stderr.

    Returns:
        A ``TrainResult``: summary metrics and the per-epoch history.

    Raises:
        ConfigError: an invalid config or argument (every problem at once, each naming field, value, allowed).
        DataError: the data set cannot be read. CheckpointError: ``resume`` or ``init`` cannot be used.
        TrainingDiverged: the loss became NaN or infinite.
    """

    from engine.data.files import check_available
    from results import lineage
    from results.output import check_output_file, check_output_folder, epoch_lines, info, json_text

    cfg = lineage.resolve_config(experiment_config(config, overrides, data_dir), tracking_uri)
    _check_run(cfg, None, lambda: cfg.init)  # as validate checks it, before the line that says training starts
    check_available(cfg.data)
    resources = check_workers(cfg) if cfg.workers > 1 else None
    # every output path and the checkpoint to resume from are checked before any work; files are opened only
    # once the first epoch is done (a refused resume leaves the history file as it was); history is appended to
    history_file = check_output_file("--history", history) if history else None
    ckpt_dir = check_output_folder("--checkpoint-dir", checkpoint_dir) if checkpoint_dir else None
    if ckpt_dir is not None:
        check_not_overwritten(checkpoint_dir, resume)
    if resume:
        check_resume(resume)
        from engine.train import load_resume_state

        load_resume_state(cfg, resume, "cpu")  # refused here, before any output, when it cannot resume
    opened: list = []

    def report(metrics: dict, save) -> None:
        for line in epoch_lines(metrics) if progress else ():
            info(line)
        # the checkpoint before the history line, and a Ctrl-C held until both are written: the history never
        # names an epoch that --resume would train again
        with interrupts.held():
            if ckpt_dir is not None:
                save(ckpt_dir)
            if history_file is not None:
                if not opened:
                    opened.append(open(history_file, "a"))  # noqa: SIM115  closed after training
                opened[0].write(json_text(metrics) + "\n")
                opened[0].flush()
        if on_epoch is not None:
            on_epoch(dict(metrics))

    if progress:
        info(f"training {cfg.name}: {cfg.model.name} on {cfg.data.dataset}, schedule {cfg.schedule.kind}, "
             f"seed {cfg.seed}" + (f", {cfg.workers} data-parallel workers" if cfg.workers > 1 else ""))
    try:
        if cfg.workers > 1:
            metrics, epochs = train_on_workers(cfg, resources, resume, report)
            return TrainResult.of(cfg.name, metrics, epochs)
        from engine.train import train_and_evaluate  # torch: loaded once the run is known to be able to start

        result = train_and_evaluate(cfg, report=report, resume_from=resume,
                                    progress=progress and sys.stderr.isatty())
    finally:
        for fh in opened:
            fh.close()
    return TrainResult.of(cfg.name, result.metrics, result.history)


def sweep(spec: PathLike | Mapping[str, Any], *, tracking_uri: str | None = None, storage: str | None = None,
          address: str | None = None, resume: bool = False, objective: str | None = None, report: bool = True,
          report_dir: str | None = None, dashboard: bool = False, progress: bool = True,
          verbose: bool = False) -> SweepResult:
    """Run a sweep spec on Ray Tune, every trial tracked in MLflow, as ``fractune sweep`` does.

    Everything is checked before anything is created or Ray starts (the spec, the tracking store, the storage
    folder, the report folder, the Ray address, the resources), every problem at once. A local Ray is started
    for the sweep and shut down after it unless one is already running in this process or ``address`` names a
    cluster.

    Args:
        spec: a sweep spec YAML file (see search_spaces/), or its contents as a mapping.
        tracking_uri: the MLflow tracking URI (default: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///$PWD/mlflow.db``).
        storage: Ray Tune's storage folder, shared by every node (default: ``$FRACTUNE_STORAGE`` or
            ``./fractune_runs``).
        address: a running Ray cluster to attach to (``auto`` or ``HOST:PORT``); default: a local Ray.
        resume: continue the latest unfinished sweep of this name in ``storage``.
        objective: the cost axis of the front instead of the spec's (one of ``results.objectives.COST_MODELS``).
        report: write the HTML report at the end (into ``report_dir``, default ``./fractune_reports/SWEEP_ID``)
            and log it on the sweep's parent run; a report that fails is noted in ``report_error``, not raised.
        dashboard: start the Ray dashboard with a local Ray.
        progress: a line per epoch and per ended trial on stderr.
        verbose: Ray Tune's and MLflow's own log lines on stderr (default: in the sweep's ``fractune.log``).

    Returns:
        A ``SweepResult``: trials, errors, the Pareto front, the parent run and the report's files.

    Raises:
        ConfigError: an invalid spec or argument (each problem naming field, value, allowed).
        DataError: the trials' data set cannot be read.
        SweepInterrupted: SIGINT or SIGTERM stopped the sweep (its state is saved; ``resume=True`` continues it);
            it carries ``sweep``, ``sweep_id``, ``finished``, ``total`` and ``tracking_uri``.
        SweepError: Ray Tune itself gave up (e.g. the storage became unwritable).
    """
    from orchestrator.sweep.driver import SweepOptions
    from orchestrator.sweep.launch import run_sweep
    from results import objectives

    if objective:  # a bad name is refused before Ray starts
        from engine.cost.cost_models import check_model_name

        check_model_name(objective, "--objective")
    # before Ray starts and before anything is created: the spec, the tracking store, the storage folder,
    # the report folder and the Ray address, every problem at once
    loaded, uri = load_for_cluster(spec, address, dashboard, tracking_uri=tracking_uri, storage=storage,
                                   resume=resume, outputs={"--report-dir": report_dir if report else None})
    if objective:
        loaded = loaded.with_objective(objective)
    opts = SweepOptions(address=address, tracking_uri=tracking_uri, storage=storage, resume=resume,
                        dashboard=dashboard, progress=progress, verbose=verbose)
    try:
        out = run_sweep(loaded, opts)
    except SweepInterrupted as stop:
        stop.sweep, stop.tracking_uri = loaded.name, uri
        raise
    if report:
        out.update(write_report(out, report_dir, uri=uri))
    return sweep_result(SweepResult, out, uri, task=str(objectives.of_spec(loaded)))


def ablate(spec: PathLike | Mapping[str, Any], *, tracking_uri: str | None = None, storage: str | None = None,
           address: str | None = None, resume: bool = False, out: str | None = None, report: bool = True,
           dashboard: bool = False, progress: bool = True, verbose: bool = False) -> AblationResult:
    """Run an ablation spec (a sweep spec with an ``ablation`` section) as one grid sweep, then analyse it from
    MLflow, as ``fractune ablate`` does: per factor and level the mean and std over seeds of the task objective
    and BitOPs, Optuna's parameter importance per objective, a sensitivity verdict per factor, the HTML report.

    Args:
        spec: an ablation spec YAML file (e.g. search_spaces/pfq_sensitivity.yaml), or its contents as a mapping.
        tracking_uri, storage, address, resume, dashboard, progress, verbose: as for ``sweep``.
        out: the report folder (default: ``./fractune_reports/SWEEP_ID``).
        report: write the report (a report that fails is noted in ``report_error``, not raised).

    Returns:
        An ``AblationResult``: the sweep's outcome with the per-level statistics, importance and verdicts.

    Raises:
        ConfigError, DataError, SweepInterrupted, SweepError: as for ``sweep``.
    """
    from dashboards.data import load_sweep
    from orchestrator.sweep.driver import SweepOptions
    from orchestrator.sweep.launch import run_sweep
    from results import store
    from results.ablation_analysis import analyse

    loaded, uri = load_for_cluster(spec, address, dashboard, ablation=True, tracking_uri=tracking_uri,
                                   storage=storage, resume=resume, outputs={"--out": out if report else None})
    opts = SweepOptions(address=address, tracking_uri=tracking_uri, storage=storage, resume=resume,
                        dashboard=dashboard, progress=progress, verbose=verbose)
    outcome = run_sweep(loaded, opts)
    meta = loaded.meta()
    if outcome["parent_run_id"]:
        # The design travels with the sweep, so `fractune report` can rebuild the curves from MLflow alone.
        c = store.client(uri)  # outcome["tracking_uri"] is the printable (redacted) one
        c.log_dict(outcome["parent_run_id"], meta, "ablation.json")
        c.set_tag(outcome["parent_run_id"], "fractune.ablation", meta["mode"])
    data = load_sweep(uri, outcome["sweep"], outcome["sweep_id"])
    a = analyse(data.finished(), data.meta or meta, data.task)
    if report:
        outcome.update(write_report(outcome, out, data=data, uri=uri))
    return sweep_result(AblationResult, outcome, uri, mode=meta["mode"], factors=meta["labels"],
                         baseline=meta["baseline"], points=len(loaded.points), seeds=list(meta["seeds"]),
                         finished=a["trials"], task_objective=a["objective"], direction=a["direction"],
                         levels=a["levels"], verdicts=a["verdicts"], verdict_rule=a["verdict_rule"],
                         importance=a["importance"], analysis=a)


def results(sweep: str | SweepResult, *, sweep_id: str | None = None,
            tracking_uri: str | None = None) -> pd.DataFrame:
    """A sweep's trials read back from MLflow: one row per trial run.

    The rows every reader uses (``results.runs``): ``run_id``, ``trial_id``, ``name``, ``status``,
    ``schedule``, ``accuracy``, ``perplexity``, ``train_bitops``, ``cp``, ``cp_gated``, ``seed``,
    ``wall_seconds``, ``point`` (the swept values), ``epochs``, ``planned_epochs``, ``complete``, ``pareto`` (on
    the sweep's front), ``costs`` (the training cost under every cost model logged), ``stage``, ...

    Args:
        sweep: the sweep's name (its MLflow experiment), or the ``SweepResult`` of ``sweep``/``ablate``.
        sweep_id: a particular run of the sweep (default: the latest, or the ``SweepResult``'s).
        tracking_uri: the MLflow tracking URI (default: the ``SweepResult``'s, else ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///$PWD/mlflow.db``).

    Returns:
        A ``pandas.DataFrame``, one row per trial, sorted by run name.

    Raises:
        ConfigError: no such sweep in the store, or a bad name or tracking URI.
    """
    import pandas as pd

    from results import runs

    name, sweep_id, uri = where(sweep, sweep_id, tracking_uri)
    data = runs.load(uri, name, sweep_id)
    return pd.DataFrame(data.rows)


def pareto_front(sweep: str | SweepResult, *, sweep_id: str | None = None, tracking_uri: str | None = None,
                 objective: str | None = None) -> ParetoFront:
    """A sweep's Pareto front recomputed from MLflow alone, as ``fractune pareto`` does: accuracy max (a
    language model: test perplexity min) against the training cost min, over the trials that finished their
    planned epochs.

    Args:
        sweep, sweep_id, tracking_uri: as for ``results``.
        objective: the cost model of the cost axis (one of ``results.objectives.COST_MODELS``; default: the
            sweep's own).

    Returns:
        A ``ParetoFront``: the front's members (``pareto``, cheapest first; ``frame()`` as a DataFrame) with the
        sweep's state (trials, finished, status, partial, diverged trials, trials stopped early).

    Raises:
        ConfigError: no such sweep, a bad name or URI, or an objective no trial logged.
    """
    from results import runs, store_checks

    name, sweep_id, uri = where(sweep, sweep_id, tracking_uri)
    store_checks.check_uri(uri)
    data = runs.load(uri, name, sweep_id)
    objective = runs.check_objective(objective or data.objective, data.rows)
    front = data.front(objective)
    progress = data.progress()
    diverged = [r for r in data.rows if r.get("diverged")]
    stopped = runs.stopped_trials(data.rows)
    return ParetoFront(sweep=name, sweep_id=data.sweep_id, experiment_id=data.experiment_id,
                       parent_run_id=data.parent_run_id, trials=len(data.rows),
                       finished=len(runs.finished(data.rows, data.task, objective)), status=data.status,
                       planned=data.planned, compared_stages=runs.compared_stages(data.rows, data.stages),
                       partial=progress is not None, progress=progress, diverged=[r["run_id"] for r in diverged],
                       diverged_trials=[{"run_id": r["run_id"], "name": r["name"], "epoch": r["diverged"]}
                                        for r in diverged],
                       stopped=[r["run_id"] for r in stopped], stopped_trials=stopped,
                       objective=objective, task=str(data.task),
                       pareto=[runs.front_entry(r, data.task, objective) for r in front])


def pareto(sweep: str | SweepResult, *, sweep_id: str | None = None, tracking_uri: str | None = None,
           objective: str | None = None) -> pd.DataFrame:
    """A sweep's Pareto front as a DataFrame: ``pareto_front(...).frame()``.

    Args:
        sweep, sweep_id, tracking_uri, objective: as for ``pareto_front``.

    Returns:
        A ``pandas.DataFrame``, one row per front member, cheapest first, with the columns of
        ``fractune pareto --json``'s entries: ``run_id``, ``trial_id``, ``accuracy``, ``train_bitops``,
        ``objective``, ``cost``, ``cp``, ``params`` (the swept values and the seed), and ``perplexity`` for a
        language model.

    Raises:
        ConfigError: as for ``pareto_front``.
    """
    return pareto_front(sweep, sweep_id=sweep_id, tracking_uri=tracking_uri, objective=objective).frame()


def report(sweep: str | SweepResult, *, sweep_id: str | None = None, tracking_uri: str | None = None,
           out: str | None = None, runs: Sequence[str] | None = None, objective: str | None = None,
           log: bool = True) -> ReportResult:
    """Write a sweep's self-contained HTML report and the PNGs of its key figures from MLflow, as
    ``fractune report`` does: accuracy vs training cost with the front and its hypervolume, parallel
    coordinates, importance per objective, precision over training, sensitivity curves (ablations), DFQ bit
    allocation.

    Args:
        sweep, sweep_id, tracking_uri: as for ``results``.
        out: the report folder (default: ``./fractune_reports/SWEEP_ID``).
        runs: runs (id, trial id or name) for the precision plot (default: the Pareto front).
        objective: the cost axis of the front (default: the sweep's own).
        log: also log the files under ``report/`` on the sweep's parent run.

    Returns:
        A ``ReportResult``: the HTML file, the PNGs by figure name, and the data behind them (front,
        hypervolume, importance, an ablation's analysis).

    Raises:
        ConfigError: no such sweep, a bad name, URI, output folder or objective.
    """
    from dashboards.report import build_report, check_inputs

    name, sweep_id, uri = where(sweep, sweep_id, tracking_uri)
    check_inputs(uri, name, sweep_id, out, log, no_log="log=False")
    rep = build_report(uri, name, sweep_id, out, list(runs) if runs else None, log=log, objective=objective)
    return ReportResult.of(rep)


def compare(sweeps: Sequence[str], *, tracking_uri: str | None = None, out: str = "compare.md") -> CompareResult:
    """Two or more sweeps side by side from MLflow alone, as ``fractune compare`` does: one figure with each
    sweep's finished trials and Pareto front, and a markdown table of each method's mean task objective and
    training TBitOPs in every sweep with the differences from the first.

    Args:
        sweeps: two or more sweeps, each a name (its latest run) or a sweep id (``NAME-YYYYMMDD-HHMMSS``).
        tracking_uri: the MLflow tracking URI (default: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///$PWD/mlflow.db``).
        out: the markdown page; the figure is written beside it (``compare.md`` -> ``compare_fronts.png``).

    Returns:
        A ``CompareResult``: per sweep its counts and front, per method its means in each sweep and the
        differences, the page and the figure.

    Raises:
        ConfigError: fewer than two sweeps, one named twice, an unknown one, sweeps of different task objectives,
            a bad URI or output file.
    """
    from dashboards.compare_page import build, check_inputs
    from results import store

    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    check_inputs(uri, list(sweeps), "out", out)
    return CompareResult.of(build(uri, list(sweeps), out, "orchestrator.api.compare"))


def sweeps(name: str | None = None, *, tracking_uri: str | None = None) -> SweepList:
    """The sweeps a tracking store holds, newest first, as ``fractune sweeps`` lists them: each one's name and
    sweep id (what ``results``, ``pareto``, ``report`` and ``compare`` take), kind, status, start, trials,
    errored trials, front size and best task objective, read from its parent run alone.

    Args:
        name: only the sweeps of this name (its MLflow experiment); default every sweep in the store.
        tracking_uri: the MLflow tracking URI (default: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///$PWD/mlflow.db``).

    Returns:
        A ``SweepList``: ``sweeps`` (``frame()`` as a DataFrame) and the store's URI without credentials.

    Raises:
        ConfigError: a bad name or URI, a store that cannot be read, no sweep of that name.
    """
    from results import listing, store, store_checks

    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    ConfigError.check_all(lambda: store.check_names(name) if name is not None else None,
                          lambda: store_checks.check_uri(uri))
    return SweepList(tracking_uri=store.redact(uri), sweeps=listing.sweeps(uri, name))


# -- validate --------------------------------------------------------------------------------------------------
def validate(file: PathLike, *, tracking_uri: str | None = None) -> ValidationResult:
    """Check a sweep spec (every grid point and range end), an ablation spec (every level and point) or an
    experiment config (its device, data folder and starting checkpoint too), as ``fractune validate`` does.

    Args:
        file: the YAML file.
        tracking_uri: where ``init.run_id`` references are looked up.

    Returns:
        A ``ValidationResult``: its kind (experiment, sweep, ablation), name and trials.

    Raises:
        ConfigError: every problem at once, each naming field, value and what is allowed.
        DataError, CheckpointError: the data or a starting checkpoint cannot be read.
    """
    from results import lineage

    kind, obj = load_any(file)
    if kind in ("spec", "ablation"):
        lineage.resolve_runs(tracking_uri, lineage.spec_run_ids(obj))  # each init.run_id: a readable checkpoint
        stages = None
        if getattr(obj, "stages", None):  # a staged sweep: its stages in order, their trials and references
            stages = [{"name": s.stage.name, "trials": s.num_trials(), "init_from": s.stage.init_from,
                       "head": s.stage.head if s.stage.init_from else None} for s in obj.stages]
        return ValidationResult(file=str(file), kind="sweep" if kind == "spec" else "ablation", name=obj.name,
                                trials=obj.num_trials(), stages=stages)
    from engine.data.files import check_available

    _check_run(obj, str(file), lambda: lineage.resolve_config(obj, tracking_uri).init)
    if obj.data.data_dir:  # a folder named in the config must hold the data
        check_available(obj.data)
    return ValidationResult(file=str(file), kind="experiment", name=obj.name)


def _check_run(cfg, source: str | None, init) -> None:
    """What only the machine or the built network can refuse, checked before a run starts (``train``) or is
    called valid (``validate``): the cp targets' exact reach, a GPU for ``device: cuda``, and the pretrained
    checkpoint (``init()``: the resolved ``init`` section) of this run's model."""
    from engine.reach import exact_target_problems

    if problems := exact_target_problems(cfg):  # what the built network can reach, where the config cannot tell
        raise ConfigError(problems, source)
    if cfg.device == "cuda":  # where no GPU is visible it would fail at the first step (auto and cpu never do)
        from engine.train import pick_device

        pick_device(cfg.device)
    if cfg.init is not None:  # the pretrained checkpoint (or init.run_id's) must exist, of this run's model
        from engine.checkpoint import load_init

        load_init(init(), cfg.model.name)
