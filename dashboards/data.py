"""Read a sweep back from MLflow: its parent run, one row per trial, metric histories and JSON artifacts.

Read-only: nothing here writes to the store. Rows carry the trial's swept values typed (the
``fractune.point`` tag, JSON), falling back to the flattened params for runs logged before that tag.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from engine.errors import ConfigError
from orchestrator import store

GATED = ("dfq", "fractrain")  # schedules whose runs log a per-block bit allocation
# A report downloads a few small JSON artifacts per run: MLflow's progress bar per file is only noise.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@dataclass
class SweepData:
    uri: str
    name: str
    sweep_id: str
    experiment_id: str
    parent_run_id: str
    rows: list[dict]  # every trial run: status, metrics, point, seed, complete
    factors: list[str]  # the swept dotted paths
    meta: dict | None = None  # ablation.json of an ablation sweep
    client: object = field(default=None, repr=False)

    def finished(self) -> list[dict]:
        """Trials that ran their planned length with both objectives: the ones fronts and statistics use."""
        return [r for r in self.rows if r["complete"] and math.isfinite(r["accuracy"])
                and math.isfinite(r["train_bitops"])]


def load_sweep(uri: str, name: str, sweep_id: str | None = None) -> SweepData:
    uri = store.normalise_uri(uri)
    store.preflight(uri)
    c = store.client(uri)
    parent = store.sweep_parent(c, name, sweep_id)
    if parent is None:
        what = f"no sweep {sweep_id!r} of that name" if sweep_id else "no sweep of that name"
        raise ConfigError.single("sweep", name, f"{what} in {uri}")
    pid = parent.info.run_id
    trials = (artifact_json(c, pid, "pareto.json") or {}).get("trials")
    complete_ids = {t["run_id"] for t in trials if t.get("complete")} if trials is not None else None
    rows, factors = [], []
    for run in store.child_runs(c, parent):
        swept = [s for s in run.data.tags.get("fractune.swept", "").split(",") if s]
        factors += [s for s in swept if s not in factors]
        m, status = run.data.metrics, run.info.status
        rows.append({"run_id": run.info.run_id, "trial_id": run.data.tags.get(store.TRIAL_TAG),
                     "name": run.info.run_name, "status": status,
                     "schedule": run.data.tags.get("fractune.schedule", run.data.params.get("schedule.kind")),
                     "accuracy": m.get("accuracy", math.nan), "train_bitops": m.get("train_bitops", math.nan),
                     "cp": m.get("cum_cp", math.nan), "seed": _parse(run.data.params.get("seed")),
                     "wall_seconds": m.get("wall_seconds", math.nan),
                     "point": point_of(run, swept), "pareto": run.data.tags.get("pareto") == "true",
                     # the sweep's own record of full-length trials; without one, FINISHED is taken as complete
                     "complete": status == "FINISHED" and (complete_ids is None or run.info.run_id in complete_ids)})
    rows.sort(key=lambda r: r["name"] or "")
    return SweepData(uri, name, parent.data.tags.get(store.SWEEP_TAG, ""), parent.info.experiment_id, pid, rows,
                     factors, artifact_json(c, pid, "ablation.json"), c)


def point_of(run, swept: list[str]) -> dict:
    """The trial's swept values: the JSON tag, else rebuilt from the flattened params (sections as dicts)."""
    tag = run.data.tags.get(store.POINT_TAG)
    if tag:
        return json.loads(tag)
    params, out = run.data.params, {}
    for path in swept:
        if path in params:
            out[path] = _parse(params[path])
            continue
        sub = {k[len(path) + 1:]: _parse(v) for k, v in params.items() if k.startswith(path + ".")}
        if sub:
            out[path] = _unflatten(sub)
    return out


def _parse(text: str | None):
    if text is None:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def artifact_json(c, run_id: str, path: str):
    """A JSON (or YAML) artifact of a run, or None when the run has none of that name."""
    parent_dir = str(Path(path).parent) if "/" in path else None
    if path not in {a.path for a in c.list_artifacts(run_id, parent_dir)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = c.download_artifacts(run_id, path, tmp)
        return yaml.safe_load(Path(local).read_text())


def histories(c, run_id: str, keys: tuple[str, ...] | list[str]) -> dict[str, list[tuple[int, float]]]:
    """Per-epoch histories ``[(step, value)]`` of the keys the run logged (others are left out)."""
    logged = set(c.get_run(run_id).data.metrics)
    out = {}
    for key in keys:
        if key in logged:
            out[key] = sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))
    return out


def bit_allocation(c, run: dict) -> dict | None:
    """A gated run's mean forward bits per block (rows) and epoch (columns), with the options' names.

    From ``bit_allocation.json`` (per epoch: options, fractions, mean_fw_bits, mean_bw_bits); else from the
    ``alloc_fw_bNN`` metric histories."""
    alloc = artifact_json(c, run["run_id"], "bit_allocation.json")
    if alloc:
        epochs = sorted(alloc, key=int)
        fw = [alloc[e]["mean_fw_bits"] for e in epochs]
        bw = [alloc[e]["mean_bw_bits"] for e in epochs]
        return {"epochs": [int(e) for e in epochs], "fw": [list(x) for x in zip(*fw)],
                "bw": [list(x) for x in zip(*bw)], "options": alloc[epochs[-1]].get("options")}
    metrics = sorted(k for k in c.get_run(run["run_id"]).data.metrics if k.startswith("alloc_fw_b"))
    if not metrics:
        return None
    hist = histories(c, run["run_id"], metrics)
    epochs = [s for s, _ in hist[metrics[0]]]
    bw_keys = [k.replace("alloc_fw_", "alloc_bw_") for k in metrics]
    bw_hist = histories(c, run["run_id"], bw_keys)
    return {"epochs": epochs, "fw": [[v for _, v in hist[k]] for k in metrics],
            "bw": [[v for _, v in bw_hist.get(k, [])] for k in bw_keys], "options": None}
