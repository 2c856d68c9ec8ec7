"""MLflow tracking from the Ray driver: one Tune callback, one writer (ecosystem.md 3.2, 7.1).

An MLflow experiment per sweep name, a parent run per sweep, a child run per trial (tag
``mlflow.parentRunId``, named by what tells it from the sweep's other trials, and its seed:
``search_spaces.naming``, unique within the sweep; Tune's trial id is the ``ray_trial_id`` tag) with the
flattened resolved config as params, the per-epoch metrics at ``step = epoch``, provenance tags, the resolved
config, events and DFQ bit allocations as artifacts.

The metrics are whatever the engine reports: every numeric (not boolean) top-level key of a trial's result is
logged (beside them their readable companions, rounded to four significant figures: each exact cost in
tera-units, ``train_bitops`` and ``train_tbitops``, ``cum_cp`` as ``cp_pct``, and ``train_bitops_log10``:
``engine.metrics.readable_companions``), except Ray Tune's own bookkeeping (``TUNE_KEYS``:
``training_iteration``, ``time_this_iter_s``, ``timestamp``, ``pid``...) and where the trial ran (the trainable's ``PLACEMENT_KEYS``, kept as tags). A
metric the engine adds reaches MLflow without a change here. A trial Tune completes before its planned epochs
(stopped by ASHA or the sweep's time limit) stays FINISHED, tagged ``stopped_early`` ("epoch E of P").

Every write is an operation in a FIFO queue: it runs at once, and when the tracking store is unreachable it
stays queued (training goes on) and is retried at every later callback and at the end of the sweep, in
order, so nothing is silently dropped; ``tracking_report`` (written next to the experiment) counts the failed
calls, the backfilled operations and any still pending. The state (parent run, trial -> run, last logged
epoch, the queue) is saved by Tune with the experiment, and runs are also found again by their
``ray_trial_id`` tag, so a restored sweep continues the same runs: no duplicate runs, no repeated epochs. A run
that is FINISHED in the store is final: a resumed sweep whose saved state predates its end neither reopens it
nor marks it FAILED.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS, DEFAULT_EXPERIMENT_INFO_KEYS, DONE, SHOULD_CHECKPOINT

from engine.metrics import ACCURACY
from results import provenance
from results.lineage import CHECKPOINT_TAG
from results.output import write_atomic
from results.runs import STOPPED_TAG, stopped_early
from results.store import (
    METHOD_TAG,
    PARENT_TAG,
    PARENTS_FILTER,
    PLANNED_TAG,
    POINT_TAG,
    STAGE_TAG,
    SWEEP_TAG,
    TRIAL_TAG,
    client,
    ensure_experiment,
    flatten,
    one_line_error,
    trial_error_text,
    with_readable,
)
from search_spaces import naming
from search_spaces import trial as trial_dict
from trainables.tune_trainable import PLACEMENT_KEYS

# what Tune adds to every result (iteration counters, clocks, host, pid, done...): not the engine's metrics
TUNE_KEYS = frozenset(AUTO_RESULT_KEYS) | frozenset(DEFAULT_EXPERIMENT_INFO_KEYS) | {DONE, SHOULD_CHECKPOINT,
                                                                                     "checkpoint_dir_name"}
NOT_METRICS = TUNE_KEYS | frozenset(PLACEMENT_KEYS)
REPORT_FILE = "fractune_tracking.json"
ENDED = frozenset({"FINISHED", "FAILED", "KILLED"})  # a run in one of these has an end time
DIVERGED_TAG = "fractune.diverged"  # the first epoch whose loss passed the engine's bound (engine.train)
FLUSH_RETRIES, FLUSH_WAIT_S = 5, 2.0


def read_report(folder: str | Path) -> dict:
    """The tracker's file in a sweep's (or a stage's) folder: its parent run, run ids and backlog counts; ``{}``
    where none was written."""
    path = Path(folder) / REPORT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def stopped_at(trial) -> str | None:
    """"epoch E of P" for a trial Tune completed after E of its P planned epochs (``results.runs.stopped_early``)."""
    epoch = (trial.last_result or {}).get("epoch")
    return stopped_early("FINISHED", int(epoch) if epoch is not None else None,
                         trial_dict.decode(trial.config).run_length().epochs)


def _now_ms() -> int:
    return int(time.time() * 1000)


class MLflowTracker(tune.Callback):
    def __init__(self, tracking_uri: str, experiment: str, sweep_id: str, sweep_info: dict[str, Any],
                 spec_tree: dict, report_dir: str | None = None, variation: dict | None = None):
        self.tracking_uri, self.experiment, self.sweep_id = tracking_uri, experiment, sweep_id
        self.variation = variation  # what differs between the trials (search_spaces.naming.variation): run names
        self.sweep_info, self.spec_tree, self.report_dir = sweep_info, spec_tree, report_dir
        self.state: dict[str, Any] = {"experiment_id": None, "parent_run_id": None, "runs": {}, "last_epoch": {},
                                      "written_epoch": {},
                                      "events": {}, "alloc": {}, "queue": [], "failed_calls": 0, "backfilled": 0,
                                      "gap": None}
        self._client = None

    def __getstate__(self):  # Tune pickles callbacks with the experiment: keep the client out
        return {**self.__dict__, "_client": None}

    @property
    def c(self):
        if self._client is None:  # failing fast when the store is down (store.client): the queue retries
            self._client = client(self.tracking_uri)
        return self._client

    def get_state(self) -> dict:
        return json.loads(json.dumps(self.state))  # a deep copy of plain data

    def set_state(self, state: dict) -> None:
        self.state.update(state)

    # -- the operation queue --------------------------------------------------------------------------
    def _submit(self, op: dict) -> None:
        if self.state["queue"]:  # waiting behind a failed write: it will be a backfill
            op["deferred"] = True
        self.state["queue"].append(op)
        self._flush()

    def _flush(self) -> bool:
        """Run queued operations in order; stop at the first failure (the store is down). True when empty."""
        queue = self.state["queue"]
        while queue:
            op = queue[0]
            try:
                self._execute(op)
            except Exception as exc:  # any client/transport error: keep the op, note the gap
                self.state["failed_calls"] += 1
                now = time.time()
                gap = self.state["gap"] or {"first": now, "error": one_line_error(exc)[:300]}
                gap["last"] = now
                self.state["gap"] = gap
                op["failed"] = True
                return False
            queue.pop(0)
            if op.get("failed") or op.get("deferred"):
                self.state["backfilled"] += 1
        return True

    def _execute(self, op: dict) -> None:
        kind = op["op"]
        if kind == "parent":
            self._create_parent()
            return
        if kind == "trial":
            self._create_trial(op["trial_id"], op["config"], op["swept"], op.get("point", {}), op.get("planned"),
                               op.get("tags"))
            return
        run_id = self.state["parent_run_id"] if op["trial_id"] == "parent" else self.state["runs"][op["trial_id"]]
        if kind == "metrics":
            from mlflow.entities import Metric

            written = self.state["written_epoch"].get(op["trial_id"], 0)
            metrics = [Metric(k, v, ts, step) for k, v, ts, step in op["metrics"] if step > written]
            if metrics:  # an epoch already in the store (a resumed trial re-reporting it) is not written twice
                self.c.log_batch(run_id, metrics=metrics)
                self.state["written_epoch"][op["trial_id"]] = max(m.step for m in metrics)
        elif kind == "resume":  # a retried or restored trial: what the store already holds wins
            if self.c.get_run(run_id).info.status == "FINISHED":  # final: a stale state's rerun changes nothing
                self.state.setdefault("final", {})[op["trial_id"]] = True
            else:
                self.c.update_run(run_id, status="RUNNING")
            logged = max((m.step for m in self.c.get_metric_history(run_id, ACCURACY)), default=0)
            tid = op["trial_id"]
            self.state["written_epoch"][tid] = max(self.state["written_epoch"].get(tid, 0), logged)
            self.state["last_epoch"][tid] = max(self.state["last_epoch"].get(tid, 0), logged)
        elif kind == "tag":
            self.c.set_tag(run_id, op["key"], op["value"])
        elif kind == "dict":
            self.c.log_dict(run_id, op["obj"], op["path"])
        elif kind == "status":  # an ended run gets its end time (the UI's Duration), when it ended, not written
            if op["status"] in ENDED:
                self.c.set_terminated(run_id, op["status"], end_time=op.get("at"))
            else:
                self.c.update_run(run_id, status=op["status"])
        else:
            raise ValueError(f"unknown tracking operation {kind!r}")

    def _create_parent(self) -> None:
        if self.state["parent_run_id"]:
            return
        from mlflow.entities import Param

        exp_id = ensure_experiment(self.c, self.experiment)
        found = self.c.search_runs([exp_id], filter_string=f"tags.`{SWEEP_TAG}` = '{self.sweep_id}' and "
                                   f"{PARENTS_FILTER}", max_results=1)
        if found:  # a resumed sweep whose saved state predates the parent run
            self.state.update(experiment_id=exp_id, parent_run_id=found[0].info.run_id)
            return
        run = self.c.create_run(exp_id, run_name=self.sweep_id,
                                tags={SWEEP_TAG: self.sweep_id, "fractune.kind": "sweep", **provenance.tags()})
        params = [Param(k, str(v)[:6000]) for k, v in flatten(self.sweep_info).items()]
        for i in range(0, len(params), 100):
            self.c.log_batch(run.info.run_id, params=params[i:i + 100])
        self.c.log_dict(run.info.run_id, self.spec_tree, "sweep_spec.yaml")
        self.state.update(experiment_id=exp_id, parent_run_id=run.info.run_id)

    def _create_trial(self, trial_id: str, config: dict, swept: list[str], point: dict,
                      planned: int | None, extra_tags: dict | None = None) -> None:
        if trial_id in self.state["runs"]:
            return
        from mlflow.entities import Param

        parent = self.state["parent_run_id"]
        found = self.c.search_runs([self.state["experiment_id"]], filter_string=(
            f"tags.`{TRIAL_TAG}` = '{trial_id}' and tags.`{PARENT_TAG}` = '{parent}'"), max_results=1)
        if found:  # created before a driver crash that lost the saved mapping
            run_id = found[0].info.run_id
            logged = max((m.step for m in self.c.get_metric_history(run_id, ACCURACY)), default=0)
            self.state["written_epoch"][trial_id] = self.state["last_epoch"][trial_id] = logged
            self.state["runs"][trial_id] = run_id
            self.state.setdefault("names", {})[trial_id] = found[0].info.run_name
            return
        tags = {PARENT_TAG: parent, TRIAL_TAG: trial_id, SWEEP_TAG: self.sweep_id, "fractune.kind": "trial",
                "fractune.schedule": config["schedule"]["kind"], "fractune.swept": ",".join(swept),
                **provenance.tags(), **(extra_tags or {})}
        if text := trial_dict.point_tag(point):
            tags[POINT_TAG] = text
        if planned is not None:
            tags[PLANNED_TAG] = str(planned)
        names = self.state.setdefault("names", {})
        name = naming.unique_name(self.run_name(config, point, tags.get(STAGE_TAG)), set(names.values()))
        run = self.c.create_run(self.state["experiment_id"], run_name=name, tags=tags)
        params = [Param(k, v[:6000]) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):
            self.c.log_batch(run.info.run_id, params=params[i:i + 100])
        self.c.log_dict(run.info.run_id, config, "config.yaml")
        self.state["runs"][trial_id] = run.info.run_id
        names[trial_id] = name

    def run_name(self, config: dict, point: dict, stage: str | None) -> str:
        """What tells the trial from the sweep's others, and its seed (``search_spaces.naming``); a staged sweep's
        stage leads. A tracker pickled before it knew the sweep's variation names every swept value."""
        varied = getattr(self, "variation", None) or naming.every_value(point)
        return naming.run_name(point, config.get("seed"), varied, config["schedule"]["kind"], stage)

    # -- Tune hooks -----------------------------------------------------------------------------------
    def setup(self, **info) -> None:
        if self.state["parent_run_id"]:
            self._submit({"op": "status", "trial_id": "parent", "status": "RUNNING"})
        else:
            self._submit({"op": "parent"})

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        if trial.trial_id in self.state["runs"]:  # retried or restored: the same run
            self.state["last_epoch"][trial.trial_id] = 0  # re-reported epochs are filtered when written
            self._submit({"op": "resume", "trial_id": trial.trial_id})
            return

        cfg = trial_dict.decode(trial.config)
        point = trial_dict.swept_values(trial.config)
        self._submit({"op": "trial", "trial_id": trial.trial_id, "config": cfg.to_dict(), "swept": sorted(point),
                      "point": point, "planned": cfg.run_length().epochs,
                      "tags": {**lineage_tags(trial.config), METHOD_TAG: cfg.schedule.label()}})

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        tid = trial.trial_id
        epoch = int(result.get("epoch", result.get("training_iteration", 0)))
        if epoch <= self.state["last_epoch"].get(tid, 0):
            self._flush()
            return  # a retried trial re-reporting an epoch already logged
        ts = int(result.get("timestamp", time.time()) * 1000)
        exact = {k: float(v) for k, v in result.items() if is_metric(k, v)}
        metrics = [(k, v, ts, epoch) for k, v in with_readable(exact).items()]
        self.state["last_epoch"][tid] = epoch
        self._submit({"op": "metrics", "trial_id": tid, "metrics": metrics})
        where = {k: str(result[k]) for k in PLACEMENT_KEYS if k in result}
        if where and self.state.setdefault("nodes", {}).get(tid) != where:  # where it ran (again, after a restore)
            self.state["nodes"][tid] = where
            for key, value in where.items():
                self._submit({"op": "tag", "trial_id": tid, "key": f"fractune.{key}", "value": value})
        if result.get("diverged") and not self.state.setdefault("diverged", {}).get(tid):  # once, at its first epoch
            self.state["diverged"][tid] = epoch
            self._submit({"op": "tag", "trial_id": tid, "key": DIVERGED_TAG, "value": f"epoch {epoch}"})
        if result.get("events"):  # turning points and other precision switches, as they happen
            by_epoch = self.state["events"].setdefault(tid, {})
            by_epoch[str(epoch)] = result["events"]  # keyed by epoch: a re-reported epoch replaces itself
            flat = [e for k in sorted(by_epoch, key=int) for e in by_epoch[k]]
            self._submit({"op": "dict", "trial_id": tid, "obj": flat, "path": "events.json"})
        if result.get("bit_allocation"):  # DFQ: per epoch, per block, the options' shares (supplement Fig. 2)
            alloc = self.state["alloc"].setdefault(tid, {})
            alloc[str(epoch)] = result["bit_allocation"]
            self._submit({"op": "dict", "trial_id": tid, "obj": dict(alloc), "path": "bit_allocation.json"})

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        checkpoint = trial.checkpoint  # the final weights: a later run may start from this one (init.run_id)
        if checkpoint is not None:
            self._submit({"op": "tag", "trial_id": trial.trial_id, "key": CHECKPOINT_TAG, "value": checkpoint.path})
        if (stopped := stopped_at(trial)) is not None:  # ASHA or the time limit ended it before its epochs
            self._submit({"op": "tag", "trial_id": trial.trial_id, "key": STOPPED_TAG, "value": stopped})
        self._submit({"op": "status", "trial_id": trial.trial_id, "status": "FINISHED", "at": _now_ms()})

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self._submit({"op": "tag", "trial_id": trial.trial_id, "key": "fractune.retried",
                      "value": str(trial.num_failures)})

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        if self.state.get("final", {}).get(trial.trial_id):  # a FINISHED run stays FINISHED (module doc)
            self._submit({"op": "tag", "trial_id": trial.trial_id, "key": "fractune.rerun_error",
                          "value": one_line_error(trial_error_text(trial))})
            return
        self._submit({"op": "tag", "trial_id": trial.trial_id, "key": "fractune.error",
                      "value": one_line_error(trial_error_text(trial))})
        self._submit({"op": "status", "trial_id": trial.trial_id, "status": "FAILED", "at": _now_ms()})

    def on_experiment_end(self, trials, **info) -> None:
        for attempt in range(FLUSH_RETRIES):
            if self._flush():
                break
            time.sleep(FLUSH_WAIT_S * (attempt + 1))
        self.write_report()

    def write_report(self) -> dict:
        s = self.state
        report = {"failed_calls": s["failed_calls"], "backfilled": s["backfilled"], "pending": len(s["queue"]),
                  "gap": s["gap"], "parent_run_id": s["parent_run_id"], "runs": dict(s["runs"])}
        if self.report_dir:
            path = Path(self.report_dir) / REPORT_FILE
            body = {**report, "queue": s["queue"]} if s["queue"] else report  # the backlog, kept on disk
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(body, indent=1, default=str))
            except OSError as exc:  # e.g. the storage is full: the sweep's outcome still carries the report
                report["report_error"] = f"{path}: {exc.strerror}"
        self.last_report = report
        return report


def lineage_tags(config: dict) -> dict[str, str]:
    """A staged sweep's trial: its stage (``fractune.stage``) and the earlier run it starts from
    (``fractune.init_run``, its stage ``fractune.init_stage``; a failed one's id too); a trial of a plain sweep
    that starts from ``init.run_id``: that run (``fractune.init_run``)."""
    tags = {}
    if config.get(trial_dict.STAGE):
        tags[STAGE_TAG] = str(config[trial_dict.STAGE])
    source = trial_dict.init_source(config)
    if source:
        if source.get("run_id"):
            tags["fractune.init_run"] = str(source["run_id"])
        if source.get("stage"):
            tags["fractune.init_stage"] = str(source["stage"])
    else:
        init = trial_dict.resolved_tree(config).get("init")
        if isinstance(init, dict) and init.get("run_id"):
            tags["fractune.init_run"] = str(init["run_id"])
    return tags


def is_metric(key: str, value: Any) -> bool:
    """A number the trial reported (the engine's metrics), not Tune's bookkeeping or the trial's placement."""
    return isinstance(value, int | float) and not isinstance(value, bool) and key not in NOT_METRICS
