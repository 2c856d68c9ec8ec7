"""The typed results of fractune's Python API (``orchestrator.api`` exports them): one pydantic model per
function's outcome, frozen, with the fields of the CLI's ``--json`` objects."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

from engine.metrics import ACCURACY, PERPLEXITY, TRAIN_BITOPS

if TYPE_CHECKING:
    import pandas as pd

# the columns of a front's rows, as `fractune pareto --json` gives each entry (a language model adds perplexity)
FRONT_COLUMNS = ("run_id", "trial_id", "name", "method", ACCURACY, TRAIN_BITOPS, "objective", "cost", "cp", "params")
# the keys a sweep's report adds to its outcome (written, or why not)
REPORT_KEYS = ("report", "report_pngs", "report_artifact", "report_error")

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

    @classmethod
    def of(cls, name: str, metrics: dict[str, Any], history: list[dict[str, Any]]) -> TrainResult:
        m = metrics
        return cls(name=name, accuracy=m.get(ACCURACY), perplexity=m.get(PERPLEXITY),
                   train_bitops=m.get(TRAIN_BITOPS), savings_vs_fp32=m.get("savings_vs_fp32"),
                   savings_vs_fw8bw8=m.get("savings_vs_fw8bw8"), wall_seconds=m.get("wall_seconds"), metrics=m,
                   history=history)

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
    stopped: list[dict[str, Any]] = []  # {run_id, name, at} per trial stopped before its planned epochs
    stages: dict[str, Any] | None = None  # a staged sweep: per stage its trials, errors and runs
    compared_stages: list[str] = []  # a staged sweep: the stages the front compares (not those others start from)
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
    finished: int  # trials that ran their planned epochs with both objectives (of every stage)
    status: str  # the parent run's: FINISHED, RUNNING, KILLED, ...
    planned: int | None = None
    partial: bool  # the sweep is running or was interrupted: the front of the trials done so far
    progress: str | None = None  # that, in a line
    diverged: list[str] = []  # run ids of trials whose loss passed the engine's bound
    diverged_trials: list[dict[str, Any]] = []  # {run_id, name, epoch} of each
    stopped: list[str] = []  # run ids of trials stopped before their planned epochs (ASHA, the time limit)
    stopped_trials: list[dict[str, Any]] = []  # {run_id, name, at: "epoch E of P"} of each
    compared_stages: list[str] = []  # a staged sweep: the stages the front compares (not those others start from)
    objective: str
    task: str  # "accuracy max", or "perplexity min" for language models
    pareto: list[dict[str, Any]]

    def frame(self) -> pd.DataFrame:
        """The front as a DataFrame: one row per member, the columns of ``fractune pareto --json``'s entries."""
        return front_frame(self.pareto)


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

    @classmethod
    def of(cls, rep: dict[str, Any]) -> ReportResult:
        """From the dict ``dashboards.report.build_report`` returns."""
        pngs = [Path(p) for p in rep["pngs"]]
        return cls(sweep=rep["sweep"], sweep_id=rep["sweep_id"], experiment_id=rep["experiment_id"],
                   parent_run_id=rep["parent_run_id"], trials=rep["trials"], finished=rep["finished"],
                   objective=rep["objective"], html=Path(rep["report"]), folder=Path(rep["folder"]), pngs=pngs,
                   figures={p.stem: p for p in pngs}, artifact=rep["artifact"], pareto=rep["pareto"],
                   front_quality=rep["front_quality"], importance=rep["importance"], analysis=rep["analysis"],
                   raw=rep)


class CompareResult(_Result):
    """Two or more sweeps side by side (``compare``): the fields of ``fractune compare --json``."""

    sweeps: list[dict[str, Any]]  # per sweep: sweep, sweep_id, trials, finished, status, pareto
    task: str  # "accuracy max", or "perplexity min" for language models
    objective: str  # the task objective's metric key
    methods: list[dict[str, Any]]  # per method: its means in each sweep and the differences from the first
    markdown: Path  # the page
    plot: Path  # the figure of every sweep's trials and front
    raw: dict[str, Any]

    @classmethod
    def of(cls, out: dict[str, Any]) -> CompareResult:
        """From the dict ``dashboards.compare_page.build`` returns."""
        return cls(sweeps=out["sweeps"], task=out["task"], objective=out["objective"], methods=out["methods"],
                   markdown=Path(out["markdown"]), plot=Path(out["plot"]), raw=out)


class SweepList(_Result):
    """The sweeps a tracking store holds (``sweeps``): the fields of ``fractune sweeps --json``."""

    tracking_uri: str  # credentials replaced by ***
    # per sweep, newest first: sweep (its experiment's name), sweep_id, kind (sweep, staged, ablation), status,
    # started (UTC), planned, trials, errored, front_size, best ({task objective: value}), objective,
    # experiment_id, parent_run_id; trials to best are None until the sweep ends
    sweeps: list[dict[str, Any]]

    def frame(self) -> pd.DataFrame:
        """The sweeps as a DataFrame, one row each."""
        import pandas as pd

        return pd.DataFrame(self.sweeps)


class ValidationResult(_Result):
    """What ``validate`` found valid: the kind of file, its name and, for a sweep or ablation, its trials."""

    file: str
    kind: str  # experiment, sweep or ablation
    name: str
    valid: bool = True
    trials: int | None = None
    stages: list[dict[str, Any]] | None = None  # a staged sweep: name, trials, init_from, head per stage


def sweep_result(cls, out: dict, uri: str, **extra):
    fields = {k: out[k] for k in cls.model_fields if k in out and k != "raw" and k not in extra}
    res = cls(**fields, **extra, raw=out)
    res._uri = uri
    return res


def front_frame(entries: list[dict]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(entries) if entries else pd.DataFrame(columns=list(FRONT_COLUMNS))
