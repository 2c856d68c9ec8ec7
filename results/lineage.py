"""Where a run starts from: ``init.run_id`` (an MLflow run of an earlier sweep) resolved to that run's final
checkpoint (docs/sweeps.md, "Starting from an earlier run").

Every trial of a sweep records its final checkpoint folder as the tag ``fractune.checkpoint`` when it finishes
(``orchestrator.tracking.tracker``). A config or spec that sets ``init.run_id`` without ``init.checkpoint`` is resolved
here, on the machine that starts the work, before anything runs: the run must exist in the tracking store,
have finished with a checkpoint, and that folder must be readable here (a cluster's storage is shared). The
engine reads only ``init.checkpoint``; ``init.run_id`` stays as the lineage (``fractune.init_run`` on the new
trial's MLflow run).
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ConfigError
from search_spaces import trial

CHECKPOINT_TAG = "fractune.checkpoint"
RUN_ID_PATH = "init.run_id"


def run_checkpoint(uri: str, run_id: str, client=None) -> str:
    """The final checkpoint folder the MLflow run ``run_id`` recorded; one-line ``ConfigError`` otherwise."""
    from mlflow.exceptions import MlflowException

    from results import store

    c = client or store.client(uri)
    try:
        run = c.get_run(run_id)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")) or "not found" in str(exc).lower():
            raise ConfigError.single(RUN_ID_PATH, run_id, f"allowed: a run in the tracking store {uri} (no such run)") from None
        raise ConfigError.single(RUN_ID_PATH, run_id, f"allowed: a run readable from the tracking store {uri} "
                                 f"({store.one_line_error(exc)})") from None
    path = run.data.tags.get(CHECKPOINT_TAG)
    if not path:
        state = run.info.status
        raise ConfigError.single(RUN_ID_PATH, run_id, "allowed: a fractune trial run that finished with a checkpoint (this "
                                 f"run is {state} and records none: tag {CHECKPOINT_TAG})")
    folder = Path(path)
    if not (folder / "state.pt").is_file():
        raise ConfigError.single(RUN_ID_PATH, run_id, f"allowed: a run whose checkpoint is readable on this machine ({path} "
                                 "holds no state.pt: removed, or storage not shared with this machine)")
    return str(folder)


def spec_run_ids(loaded) -> list[str]:
    """Every run id a sweep's trials may start from without a checkpoint: the base's ``init.run_id`` and each
    value of a swept ``init.run_id`` (grid, choice), over every stage."""
    ids: list[str] = []
    specs = [loaded] + [s for s in (getattr(loaded, "stages", None) or [])]
    for sub in specs:
        run_id = trial.unresolved_run(sub.base_tree)
        if run_id:
            ids.append(run_id)
        param = sub.spec.parameters.get(RUN_ID_PATH)
        if param is not None:
            ids += [str(v) for v in param.probe_values() if v is not None]
        for point in getattr(sub, "points", None) or []:  # an ablation's explicit points
            if point.get(RUN_ID_PATH):
                ids.append(str(point[RUN_ID_PATH]))
    return sorted(set(ids))


def resolve_runs(tracking_uri: str | None, run_ids: list[str]) -> dict[str, str]:
    """``{run id: checkpoint folder}`` from the tracking store ``tracking_uri`` (default: the project's), which is
    opened only when there is a run to look up; every unresolvable run reported together (one line each)."""
    from results import store, store_checks

    if not run_ids:
        return {}
    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    store_checks.preflight(uri, mode="read")
    c = store.client(uri)
    found, problems = {}, []
    for run_id in run_ids:
        try:
            found[run_id] = run_checkpoint(uri, run_id, c)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return found


def resolve_config(cfg, tracking_uri: str | None):
    """An ``ExperimentConfig`` with ``init.checkpoint`` resolved from ``init.run_id`` when only the run is named;
    unchanged otherwise (no store is opened)."""
    if cfg.init is None or cfg.init.checkpoint is not None:
        return cfg
    checkpoint = resolve_runs(tracking_uri, [cfg.init.run_id])[cfg.init.run_id]
    return cfg.model_copy(update={"init": cfg.init.model_copy(update={"checkpoint": checkpoint})})
