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

import copy
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

from engine.errors import CheckpointError, ConfigError, DataError, FractuneError, TrainingDiverged
from engine.metrics import ACCURACY, PERPLEXITY, TRAIN_BITOPS, VAL_ACCURACY, VAL_PERPLEXITY
from orchestrator._preflight import load_for_cluster
from orchestrator._reports import write_report
from orchestrator.sweep.lifecycle import SweepInterrupted

if TYPE_CHECKING:
    import pandas as pd

    from engine.config.experiment import ExperimentConfig

__all__ = [
    "train", "sweep", "ablate", "validate", "results", "pareto", "pareto_front", "report",
    "TrainResult", "SweepResult", "AblationResult", "ParetoFront", "ReportResult", "ValidationResult",
    "FractuneError", "ConfigError", "DataError", "CheckpointError", "TrainingDiverged", "SweepInterrupted",
    "SweepError",  # noqa: F822  loaded on first use (module __getattr__): it lives with the Tune code
]

PathLike = str | os.PathLike
# the columns of a front's rows, as `fractune pareto --json` gives each entry (a language model adds perplexity)
FRONT_COLUMNS = ("run_id", "trial_id", "name", "method", ACCURACY, TRAIN_BITOPS, "objective", "cost", "cp", "params")
# the keys a sweep's report adds to its outcome (written, or why not)
REPORT_KEYS = ("report", "report_pngs", "report_artifact", "report_error")
# what a training's per-epoch line shows
EPOCH_KEYS = ("epoch", "loss", "train_accuracy", VAL_ACCURACY, ACCURACY, VAL_PERPLEXITY, PERPLEXITY,
              "cum_gbitops", "cp", "fw_bits", "bw_bits", "stage", "target_cp", "cp_gated", "wall_seconds")


def __getattr__(name: str):  # SweepError lives with the Tune code, which imports torch: loaded when asked for
    if name == "SweepError":
        from orchestrator.sweep.driver import SweepError

        return SweepError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- results ---------------------------------------------------------------------------------------------------
class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class TrainResult(_Result):
    """One training's outcome (``train``): its summary metrics and per-epoch history, as ``fractune train --json``
    gives them."""

    name: str
    accuracy: float | None = None  # test accuracy (a language model: next-token accuracy)
    perplexity: float | None = None  # a language model's test perplexity
    train_bitops: float | None = None
    savings_vs_fp32: float | None = None
    savings_vs_fw8bw8: float | None = None
    wall_seconds: float | None = None
    metrics: dict[str, Any]  # every summary metric (costs under each cost model, events, bit allocation, ...)
    history: list[dict[str, Any]]  # one dict of metrics per epoch

    def history_frame(self) -> pd.DataFrame:
        """The per-epoch metrics as a DataFrame, one row per epoch."""
        import pandas as pd

        return pd.DataFrame(self.history)


class SweepResult(_Result):
    """A sweep's outcome (``sweep``): the fields of ``fractune sweep --json``; ``raw`` is that object whole.
    Pass it to ``results``, ``pareto``, ``pareto_front`` or ``report`` to read the sweep back from MLflow."""

    sweep: str
    sweep_id: str
    experiment_id: str | None = None
    parent_run_id: str | None = None
    trials: int
    errored: int
    errors: list[dict[str, Any]] = []  # {trial_id, run_id, error} per errored trial
    objective: str  # the cost model of the front's cost axis
    task: str = "accuracy max"  # the task objective and its direction: "accuracy max", "perplexity min"
    hypervolume: float | None = None
    pareto: list[dict[str, Any]] = []  # the front, cheapest first, as `fractune pareto --json` gives it
    stages: dict[str, Any] | None = None  # a staged sweep: per stage its trials, errors and runs
    storage: str | None = None  # the sweep's Tune folder
    storage_problem: str | None = None
    tracking_uri: str  # credentials replaced by ***
    wall_seconds: float | None = None
    ui: str | None = None  # how to look at it in the MLflow UI
    log: str | None = None  # Ray Tune's and MLflow's log lines
    report: str | None = None  # the HTML report's path (None with report=False or when it failed)
    report_pngs: list[str] = []
    report_artifact: str | None = None
    report_error: str | None = None
    raw: dict[str, Any]
    _uri: str = PrivateAttr(default="")  # the tracking URI with its credentials, to read the sweep back

    @property
    def ok(self) -> bool:
        """No trial errored and nothing is pending (the CLI's exit code 0)."""
        return not (self.errored or self.raw.get("tracking", {}).get("pending") or self.storage_problem)


class AblationResult(SweepResult):
    """An ablation's outcome (``ablate``): the sweep's fields, and per factor and level the mean and std over
    seeds, Optuna's importance per objective and a sensitivity verdict per factor (``analysis``: all of it as
    ``results.ablation_analysis.analyse`` gives it)."""

    mode: str  # ofat or grid
    factors: dict[str, list[str]]  # factor (dotted path) -> its levels' labels
    baseline: dict[str, str]  # factor -> the baseline level's label
    points: int
    seeds: list[int]
    finished: int  # trials finished with results
    task_objective: str  # accuracy, or a language model's perplexity
    direction: str
    levels: dict[str, dict[str, dict[str, Any]]]
    verdicts: dict[str, dict[str, Any]]
    verdict_rule: str
    importance: dict[str, Any]
    analysis: dict[str, Any]

    def levels_frame(self) -> pd.DataFrame:
        """One row per factor and level: ``n`` and every mean/std the analysis holds."""
        import pandas as pd

        return pd.DataFrame([{"factor": f, "level": lv, **s} for f, levels in self.levels.items()
                             for lv, s in levels.items()])


class ParetoFront(_Result):
    """A sweep's Pareto front read back from MLflow (``pareto_front``), with the sweep's state: the fields of
    ``fractune pareto --json``."""

    sweep: str
    sweep_id: str
    experiment_id: str
    parent_run_id: str
    trials: int
    finished: int  # trials that ran their planned epochs with both objectives
    status: str  # the parent run's: FINISHED, RUNNING, KILLED, ...
    planned: int | None = None
    partial: bool  # the sweep is running or was interrupted: the front of the trials done so far
    progress: str | None = None  # that, in a line
    diverged: list[str] = []  # run ids of trials whose loss passed the engine's bound
    diverged_trials: list[dict[str, Any]] = []  # {run_id, name, epoch} of each
    objective: str
    task: str  # "accuracy max", or "perplexity min" for language models
    pareto: list[dict[str, Any]]

    def frame(self) -> pd.DataFrame:
        """The front as a DataFrame: one row per member, the columns of ``fractune pareto --json``'s entries."""
        return _front_frame(self.pareto)


class ReportResult(_Result):
    """A sweep's report (``report``): the HTML page, the PNGs of its key figures and the data behind them."""

    sweep: str
    sweep_id: str
    experiment_id: str
    parent_run_id: str
    trials: int
    finished: int
    objective: str
    html: Path  # the self-contained report.html
    folder: Path
    pngs: list[Path]
    figures: dict[str, Path]  # figure name (pareto, importance, precision, sensitivity, bit_allocation) -> PNG
    artifact: str | None = None  # the report's MLflow artifact (None with log=False)
    pareto: list[dict[str, Any]]  # the front's rows as the report's table shows them
    front_quality: dict[str, Any]  # hypervolume, its reference point and rule
    importance: dict[str, Any]  # Optuna's parameter importance per objective
    analysis: dict[str, Any] | None = None  # an ablation's per-level statistics and verdicts
    raw: dict[str, Any]


class ValidationResult(_Result):
    """What ``validate`` found valid: the kind of file, its name and, for a sweep or ablation, its trials."""

    file: str
    kind: str  # experiment, sweep or ablation
    name: str
    valid: bool = True
    trials: int | None = None
    stages: list[dict[str, Any]] | None = None  # a staged sweep: name, trials, init_from, head per stage


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
    import json

    from engine.data.datasets import check_available
    from engine.train import train_and_evaluate
    from results import lineage
    from results.output import check_output_file, check_output_folder, info

    cfg = lineage.resolve_config(_config(config, overrides, data_dir), tracking_uri)
    check_available(cfg.data)
    # every output path and the checkpoint to resume from are checked before any work; files are opened only
    # once the first epoch is done (a refused resume leaves the history file as it was); history is appended to
    history_file = check_output_file("--history", history) if history else None
    ckpt_dir = check_output_folder("--checkpoint-dir", checkpoint_dir) if checkpoint_dir else None
    if resume:
        check_resume(resume)
        from engine.train import load_resume_state

        load_resume_state(cfg, resume, "cpu")  # refused here, before any output, when it cannot resume
    opened: list = []

    def report(metrics: dict, save) -> None:
        if progress:
            info("epoch " + "  ".join(f"{k}={_short(metrics[k])}" for k in EPOCH_KEYS if k in metrics))
            for ev in metrics.get("events", []):
                what = f"target cp {ev['target_cp']}" if "target_cp" in ev else f"FW{ev['fw_bits']}/BW{ev['bw_bits']}"
                info(f"  {ev['reason']} at iteration {ev['iteration']}: stage {ev['stage']} -> {what}")
        if history_file is not None:
            if not opened:
                opened.append(open(history_file, "a"))  # noqa: SIM115  closed after training
            opened[0].write(json.dumps(metrics) + "\n")
            opened[0].flush()
        if ckpt_dir is not None:
            save(ckpt_dir)
        if on_epoch is not None:
            on_epoch(dict(metrics))

    if progress:
        info(f"training {cfg.name}: {cfg.model.name} on {cfg.data.dataset}, schedule {cfg.schedule.kind}, "
             f"seed {cfg.seed}")
    try:
        result = train_and_evaluate(cfg, report=report, resume_from=resume,
                                    progress=progress and sys.stderr.isatty())
    finally:
        for fh in opened:
            fh.close()
    m = result.metrics
    return TrainResult(name=cfg.name, accuracy=m.get(ACCURACY), perplexity=m.get(PERPLEXITY),
                       train_bitops=m.get(TRAIN_BITOPS), savings_vs_fp32=m.get("savings_vs_fp32"),
                       savings_vs_fw8bw8=m.get("savings_vs_fw8bw8"), wall_seconds=m.get("wall_seconds"),
                       metrics=m, history=result.history)


def _config(config, overrides: Sequence[str], data_dir: str | None) -> ExperimentConfig:
    """The validated experiment config of a file, a mapping or a config, with the overrides applied."""
    from engine.config.experiment import (
        ExperimentConfig,
        apply_overrides,
        check_path,
        load_config,
        parse_config,
    )

    overrides = list(overrides)
    if data_dir is not None:  # checked naming the flag, then an override of data.data_dir
        check_path("--data-dir", data_dir)
        overrides.append(f"data.data_dir={data_dir}")
    if isinstance(config, ExperimentConfig):
        return parse_config(apply_overrides(config.model_dump(mode="json"), overrides)) if overrides else config
    if isinstance(config, Mapping):
        return parse_config(apply_overrides(copy.deepcopy(dict(config)), overrides))
    return load_config(config, overrides)


def check_resume(path: str) -> None:
    """``--resume``: a checkpoint folder written by ``--checkpoint-dir`` (or its state.pt)."""
    import stat

    from engine.checkpoint import FILENAME

    p = Path(path)
    state = p / FILENAME if p.is_dir() else p
    try:
        ok = stat.S_ISREG(state.stat().st_mode)
    except OSError:
        ok = False
    if not ok:
        raise ConfigError.single("--resume", path, f"allowed: a checkpoint folder written by --checkpoint-dir "
                                 f"(holding {FILENAME})")


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# -- sweeps and ablations --------------------------------------------------------------------------------------
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
    return _sweep_result(SweepResult, out, uri, task=str(objectives.of_spec(loaded)))


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
    return _sweep_result(AblationResult, outcome, uri, mode=meta["mode"], factors=meta["labels"],
                         baseline=meta["baseline"], points=len(loaded.points), seeds=list(meta["seeds"]),
                         finished=a["trials"], task_objective=a["objective"], direction=a["direction"],
                         levels=a["levels"], verdicts=a["verdicts"], verdict_rule=a["verdict_rule"],
                         importance=a["importance"], analysis=a)


def _sweep_result(cls, out: dict, uri: str, **extra):
    fields = {k: out[k] for k in cls.model_fields if k in out and k != "raw" and k not in extra}
    res = cls(**fields, **extra, raw=out)
    res._uri = uri
    return res


def _where(sweep: str | SweepResult, sweep_id: str | None, tracking_uri: str | None) -> tuple[str, str | None, str]:
    """(name, sweep id, normalised tracking URI) of a sweep given by name or by its ``SweepResult``."""
    from results import store

    if isinstance(sweep, SweepResult):
        return sweep.sweep, sweep_id or sweep.sweep_id, store.normalise_uri(tracking_uri or sweep._uri
                                                                            or sweep.tracking_uri)
    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    return sweep, sweep_id, uri


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

    name, sweep_id, uri = _where(sweep, sweep_id, tracking_uri)
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
        sweep's state (trials, finished, status, partial, diverged trials).

    Raises:
        ConfigError: no such sweep, a bad name or URI, or an objective no trial logged.
    """
    from results import runs, store

    name, sweep_id, uri = _where(sweep, sweep_id, tracking_uri)
    store.check_uri(uri)
    data = runs.load(uri, name, sweep_id)
    objective = runs.check_objective(objective or data.objective, data.rows)
    front = data.front(objective)
    progress = data.progress()
    diverged = [r for r in data.rows if r.get("diverged")]
    return ParetoFront(sweep=name, sweep_id=data.sweep_id, experiment_id=data.experiment_id,
                       parent_run_id=data.parent_run_id, trials=len(data.rows),
                       finished=len(data.finished(objective)), status=data.status, planned=data.planned,
                       partial=progress is not None, progress=progress, diverged=[r["run_id"] for r in diverged],
                       diverged_trials=[{"run_id": r["run_id"], "name": r["name"], "epoch": r["diverged"]}
                                        for r in diverged],
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


def _front_frame(entries: list[dict]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(entries) if entries else pd.DataFrame(columns=list(FRONT_COLUMNS))


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
    from dashboards.report import build_report
    from results import store
    from results.output import check_output_folder

    name, sweep_id, uri = _where(sweep, sweep_id, tracking_uri)
    ConfigError.check_all(lambda: store.check_names(name, sweep_id), lambda: store.check_uri(uri),
                          lambda: check_output_folder("--out", out) if out else None)
    rep = build_report(uri, name, sweep_id, out, list(runs) if runs else None, log=log, objective=objective)
    pngs = [Path(p) for p in rep["pngs"]]
    return ReportResult(sweep=rep["sweep"], sweep_id=rep["sweep_id"], experiment_id=rep["experiment_id"],
                        parent_run_id=rep["parent_run_id"], trials=rep["trials"], finished=rep["finished"],
                        objective=rep["objective"], html=Path(rep["report"]), folder=Path(rep["folder"]),
                        pngs=pngs, figures={p.stem: p for p in pngs}, artifact=rep["artifact"],
                        pareto=rep["pareto"], front_quality=rep["front_quality"], importance=rep["importance"],
                        analysis=rep["analysis"], raw=rep)


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

    kind, obj = _load_any(file)
    if kind in ("spec", "ablation"):
        lineage.resolve_runs(tracking_uri, lineage.spec_run_ids(obj))  # each init.run_id: a readable checkpoint
        stages = None
        if getattr(obj, "stages", None):  # a staged sweep: its stages in order, their trials and references
            stages = [{"name": s.stage.name, "trials": s.num_trials(), "init_from": s.stage.init_from,
                       "head": s.stage.head if s.stage.init_from else None} for s in obj.stages]
        return ValidationResult(file=str(file), kind="sweep" if kind == "spec" else "ablation", name=obj.name,
                                trials=obj.num_trials(), stages=stages)
    from engine.data.datasets import check_available
    from engine.train import pick_device

    pick_device(obj.device)  # device: cuda where no GPU is visible would fail at the first step
    if obj.data.data_dir:  # a folder named in the config must hold the data
        check_available(obj.data)
    if obj.init is not None:  # the pretrained checkpoint (or init.run_id's) must exist, of this run's model
        from engine.checkpoint import load_init

        load_init(lineage.resolve_config(obj, tracking_uri).init, obj.model.name)
    return ValidationResult(file=str(file), kind="experiment", name=obj.name)


def _load_any(path: PathLike):
    """An ablation spec (has ``ablation``), a sweep spec (``parameters``/``base``/``search``...) or an
    experiment config."""
    from engine.config.experiment import load_config, read_yaml
    from search_spaces.ablation import load_ablation
    from search_spaces.spec import load_spec

    tree = read_yaml(path)
    if "ablation" in tree:
        return "ablation", load_ablation(path)
    if any(k in tree for k in ("parameters", "base", "search", "seeds", "budget", "resources", "stages")):
        return "spec", load_spec(path)
    return "config", load_config(path)
