"""The sweeps a tracking store holds (``fractune sweeps``): one row per sweep, newest first, read from its parent
run alone (its tags, params and the summary metrics the sweep writes at its end), no trial run read, so a store
of many sweeps lists at once. A row names a sweep as the readers take it: its experiment's name (the latest
sweep of that name) or its sweep id (``fractune pareto --sweep-id``, ``fractune compare``)."""

from __future__ import annotations

import math
import time

from engine.errors import ConfigError
from results import store, store_checks
from results.runs import OBJECTIVE_TAG

MAX_SWEEPS = 1000  # rows a listing reads at the most (the newest): `fractune sweeps` says when it reached it
BEST_PREFIX = "sweep/best_"  # the parent's best task objective (``dashboards.mlflow_view.summary_metrics``)


def sweeps(uri: str, name: str | None = None) -> list[dict]:
    """The sweeps in the store at ``uri`` (those of the experiment ``name`` only, with a name), newest first."""
    if name is not None:
        store.check_names(name)
    uri = store.normalise_uri(uri)
    store_checks.preflight(uri, mode="read")
    c = store.client(uri)
    if name is not None:
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise ConfigError.single("sweep", name, f"no sweep of that name in {store.redact(uri)}")
        experiments = [exp]
    else:  # every experiment, page by page: a store may hold more than one page of them
        experiments, token = [], None
        while True:
            page = c.search_experiments(max_results=1000, page_token=token)
            experiments += list(page)
            token = page.token
            if not token:
                break
    names = {e.experiment_id: e.name for e in experiments}
    if not names:
        return []
    parents = c.search_runs(list(names), store.PARENTS_FILTER, order_by=["attributes.start_time DESC"],
                            max_results=MAX_SWEEPS)
    if name is not None and not parents:
        raise ConfigError.single("sweep", name, f"no sweep of that name in {store.redact(uri)}")
    return [row(run, names[run.info.experiment_id]) for run in parents]


def row(parent, experiment: str) -> dict:
    """A sweep as its parent run records it. ``trials``, ``errored``, ``front_size`` and ``best`` are written when
    the sweep ends: None while it runs or after it was stopped (``status`` RUNNING or KILLED; ``planned`` says how
    many trials it plans). An ablation is ``kind`` ablation once it has ended (its tag is written then), a
    sweep until then."""
    tags, params, m = parent.data.tags, parent.data.params, store.metrics(parent)
    kind = "ablation" if tags.get("fractune.ablation") else "staged" if params.get("stages") else "sweep"
    return {"sweep": experiment, "sweep_id": tags.get(store.SWEEP_TAG, ""), "kind": kind,
            "status": parent.info.status, "started": _utc(parent.info.start_time),
            "planned": _int(params.get("planned_trials")), "trials": _int(tags.get("fractune.trials")),
            "errored": _int(tags.get("fractune.errored")), "front_size": _int(m.get("sweep/front_size")),
            "best": {k[len(BEST_PREFIX):]: v for k, v in sorted(m.items()) if k.startswith(BEST_PREFIX)},
            "objective": tags.get(OBJECTIVE_TAG), "experiment_id": parent.info.experiment_id,
            "parent_run_id": parent.info.run_id}


def _utc(ms: int | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) if ms else None


def _int(value) -> int | None:
    if isinstance(value, str):
        return int(value) if value.isdigit() else None
    return int(value) if value is not None and math.isfinite(value) else None
