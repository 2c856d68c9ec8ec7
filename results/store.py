"""The MLflow store of sweeps, without Ray: tracking URIs, the tags fractune writes and the run queries (the
checks that a store can be used before any work are ``results.store_checks``).

Split from ``tracking`` (the Tune callback, which needs ``ray.tune`` at import) so that the commands that
only read a store (``pareto``, ``report``, ``ui``) start without importing Ray.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from engine.metrics import readable_companions

PARENT_TAG = "mlflow.parentRunId"
TRIAL_TAG = "ray_trial_id"
SWEEP_TAG = "fractune.sweep_id"
POINT_TAG = "fractune.point"  # JSON of the trial's swept values {dotted path: value} (search_spaces.trial)
METHOD_TAG = "fractune.method"  # the trial's method label (its schedule's ``label()``: FW4/BW8, PFQ auto ...)
PARENTS_FILTER = "tags.`fractune.kind` = 'sweep'"  # MLflow's filter of the sweeps' parent runs
STAGE_TAG = "fractune.stage"  # a staged sweep's trial: the stage it ran in (search_spaces.trial.staged)
PLANNED_TAG = "fractune.planned_epochs"  # the engine's run_length(cfg).epochs of the trial's resolved config
# An experiment's kind: "custom_model_development" is model training (runs table, metric charts). MLflow 3.17.2's
# UI does not read it to pick an experiment's first page: its switch (GenAI / Model training, the URL's
# workflowType, else the browser's last choice, GenAI at first) decides, because the bundle's workflow-based
# navigation flag is on (the tag is read only with it off). Set all the same: the kind MLflow's API and other
# clients see, and the one its UI reads where that flag is off.
KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
def with_readable(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` and beside them their readable companions (``engine.metrics.readable_companions``); a
    companion the metrics already hold is kept as it is."""
    out = dict(metrics)
    for key, value in metrics.items():
        out.update({k: v for k, v in readable_companions(key, value).items() if k not in metrics})
    return out


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or an absolute ``sqlite:///<cwd>/mlflow.db`` (trials run in another cwd)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def normalise_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        return f"sqlite:///{Path(rel).expanduser().resolve()}"
    if "://" not in uri:  # a bare path to a database file
        return f"sqlite:///{Path(uri).expanduser().resolve()}"
    return uri


def stored(value: float) -> float:
    """A metric as it was logged: MLflow's SQL stores keep an infinite value (a diverged run's perplexity) as
    the largest float, which every reader must take back as the infinity, never as a number on a front."""
    return math.copysign(math.inf, value) if abs(value) >= sys.float_info.max else value


def metrics(run) -> dict[str, float]:
    """A run's latest metrics, as logged (``stored``)."""
    return {key: stored(value) for key, value in run.data.metrics.items()}


def redact(uri: str) -> str:
    """A URI safe to print: credentials (user:password@) replaced by ***."""
    import re

    return re.sub(r"(?<=://)[^/?#\s]*@", "***@", uri)


def without_credentials(uri: str) -> str:
    """A URI to show or open: the ``user:password@`` part removed (a browser asks for it)."""
    return redact(uri).replace("://***@", "://")


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = "null" if value is None else str(value)
    return out


def artifact_root(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: beside a sqlite database (``<db folder>/mlartifacts/<name>``),
    never ``./mlruns`` of whatever folder the command ran in (MLflow's default for a client on sqlite); None
    for a server, which has its own artifact root."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / experiment).as_uri()


def client(uri: str):
    """MLflow's client, failing fast when a server stops answering: its default retries back off for minutes
    (a reader would hang, a sweep's Tune loop stall), and printing no URI or progress bar. Every fractune process reads its store through this; the
    sweep's tracker queues and retries its writes itself. The environment may still set other values."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    # MLflow prints a "View run ... at" line with the URI as given, credentials included, for every run ended,
    # and a progress bar for every artifact a reader downloads (a few small JSON files per run)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return MlflowClient(tracking_uri=uri)


def ensure_experiment(c, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        mark_training(c, exp)
        return exp.experiment_id
    return c.create_experiment(name, artifact_location=artifact_root(c.tracking_uri, name),
                               tags={KIND_TAG: TRAINING_KIND})


def mark_training(c, exp) -> bool:
    """Open ``exp`` in the UI's model-training mode: set its kind tag unless someone chose a kind (the UI's own
    guesses end in ``_inferred``). True when the tag was written."""
    kind = exp.tags.get(KIND_TAG, "")
    if kind and not kind.endswith("_inferred") and kind != "no_inferred_type":
        return False
    c.set_experiment_tag(exp.experiment_id, KIND_TAG, TRAINING_KIND)
    return True


def trial_error_text(trial) -> str:
    """The trial's error trace: the local error file Tune just wrote, else the synced copy."""
    path = trial.error_file
    if path and Path(path).is_file():
        return Path(path).read_text(errors="replace")
    err = trial.get_error()
    return str(err) if err else "trial failed (no error recorded)"


def one_line_error(err: BaseException | str) -> str:
    return _one_line(str(err))[:2000]


# what a store's failure ends with that is no cause (SQLAlchemy's footer and statement echo)
FOOTERS = ("(Background on this error at", "[SQL:", "[parameters:")
# the causes a user can act on, named wherever they appear in a failure's text
CAUSES = ("database or disk is full", "No space left on device", "Read-only file system",
          "attempt to write a readonly database", "database is locked", "unable to open database file",
          "disk I/O error", "Permission denied")


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip() and not x.strip().startswith(FOOTERS)]
    for cause in CAUSES:
        hit = [x for x in lines if cause in x]
        if hit:
            return hit[-1]
    errors = [x for x in lines if "Error" in x or "error" in x]
    return (errors[-1] if errors else (lines[-1] if lines else text))


def sweep_parent(c, experiment: str, sweep_id: str | None = None):
    """The parent run of ``sweep_id``, or of the latest sweep of the experiment. A sweep id the experiment does
    not hold is looked for in every experiment, so that a sweep whose experiment was renamed (in MLflow's UI)
    still opens by the id ``fractune sweeps`` lists; it must be one of ``experiment``'s (``<experiment>-...``)."""
    check_names(experiment, sweep_id)
    exp = c.get_experiment_by_name(experiment)
    flt = PARENTS_FILTER
    if sweep_id:
        flt += f" and tags.`{SWEEP_TAG}` = '{sweep_id}'"
    first = {"filter_string": flt, "order_by": ["attributes.start_time DESC"], "max_results": 1}
    runs = c.search_runs([exp.experiment_id], **first) if exp is not None else []
    if not runs and sweep_id and sweep_id.startswith(experiment + "-"):
        ids = [e.experiment_id for e in c.search_experiments()]
        runs = c.search_runs(ids, **first) if ids else []
    return runs[0] if runs else None


def check_names(sweep: str, sweep_id: str | None = None, name_field: str = "sweep") -> None:
    """A sweep name and sweep id as fractune makes them (``<name>-<timestamp>``): nothing else reaches an
    MLflow filter string. ``name_field``: how the command takes the name (a positional ``sweep``, ``ui --sweep``)."""
    import re

    from engine.config.experiment import NAME_PATTERN
    from engine.errors import ConfigError

    problems = [(field, value, "allowed: letters, digits, '.', '_' and '-', starting with a letter or digit, at "
                 "most 100 characters") for field, value in ((name_field, sweep), ("--sweep-id", sweep_id))
                if value is not None and not re.match(NAME_PATTERN, value)]
    if problems:
        raise ConfigError(problems)


def child_runs(c, parent) -> list:
    out, token = [], None
    while True:
        page = c.search_runs([parent.info.experiment_id],
                             filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'", max_results=1000,
                             page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def artifact_json(c, run_id: str, path: str):
    """A JSON (or YAML) artifact of a run, or None when the run has none of that name."""
    import tempfile

    from engine import safe_yaml

    parent_dir = str(Path(path).parent) if "/" in path else None
    if path not in {a.path for a in c.list_artifacts(run_id, parent_dir)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = c.download_artifacts(run_id, path, tmp)
        return safe_yaml.read_yaml_file(local, f"artifact {path} of run {run_id}")  # the guarded reader
