"""A sweep's trials as rows read back from MLflow: the one loader behind the sweep's own summary
(``pareto.json`` and its JSON line), ``fractune pareto``, the HTML report and ``fractune results``.

A row: ``run_id``, ``trial_id``, ``name``, ``status``, ``schedule`` (the kind), every registered task objective's
metric (``results.objectives``: ``accuracy``, a language model's test ``perplexity``) and ``train_bitops``,
``cp`` (the run's cumulative cp), ``cp_gated`` (DFQ/FracTrain: the mean of the per-epoch gated
cp the papers report, else NaN), ``seed``, ``wall_seconds``, ``point`` (the swept values, typed), ``epochs``
(the last epoch logged), ``planned_epochs``, ``complete``, ``stopped`` (``stopped_early``), ``node_id``,
``pareto`` (the front's tag) and ``costs`` (the run's training cost under every cost model it logged: ``bitops`` and each ``train_cost_<model>``);
a staged sweep's ``stage``, and ``init_run`` and ``init_stage`` where the trial started from an earlier stage's run.

The trials a sweep compares (``compared_rows``: its front, its statistics, its methods) are all its trials but
those of a stage another stage starts from: a staged sweep's pretrain runs are where its retrain trials start, not
methods of the comparison. Stages side by side (a control stage) are all compared.

The cost axis of a front is any cost model (``objective``: ``bitops`` by default, the sweep spec's
``objective`` at sweep time, ``--objective`` for the readers); the sweep records its own in the parent run's
``fractune.objective`` tag and in ``pareto.json``. The task objective (``results.objectives.Objective``) is
resolved once, when the rows are read (``SweepRuns.task``), and every front and statistic here receives it.

``complete``: the run FINISHED and logged its planned epochs, the engine's ``run_length(cfg).epochs`` of the
trial's resolved config, which the tracker records in the ``fractune.planned_epochs`` tag when it creates the
run. Runs logged before that tag fall back to the sweep's own record (``pareto.json``), else FINISHED. Only
complete trials with both objectives are ``finished``: the only ones a Pareto front or a statistic uses (an
ASHA-stopped trial's BitOPs are those of a shorter run). No Ray here, so readers start fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine import metrics as keys
from engine.cost.cost_models import check_model_name
from engine.errors import ConfigError
from engine.metrics import ACCURACY, COST_PREFIX, CUM_CP, TRAIN_BITOPS, TRAIN_TBITOPS, cost_key
from results import objectives, store, store_checks
from results.objectives import Objective
from results.pareto import hypervolume, pareto_rows
from search_spaces import trial

OBJECTIVE_TAG = "fractune.objective"
# a FINISHED trial that ran fewer epochs than planned (a scheduler such as ASHA stopped it, or the sweep's time
# limit): "epoch E of P", a plain tag so that the MLflow UI shows it as a column beside ``pareto``
STOPPED_TAG = "stopped_early"


def stopped_early(status: str, epochs: int | None, planned: int | None) -> str | None:
    """"epoch E of P" for a trial that FINISHED after E of its P planned epochs (E < P), else None."""
    if status == "FINISHED" and epochs is not None and planned is not None and epochs < planned:
        return f"epoch {epochs} of {planned}"
    return None


def stopped_trials(rows: list[dict]) -> list[dict]:
    """{run_id, name, at: "epoch E of P"} of each trial stopped before its planned epochs, as the sweep's JSON,
    ``fractune pareto`` and ``fractune results`` list them."""
    return [{"run_id": r["run_id"], "name": r["name"], "at": r["stopped"]} for r in rows if r.get("stopped")]


@dataclass
class SweepRuns:
    uri: str
    name: str
    sweep_id: str
    experiment_id: str
    parent_run_id: str
    rows: list[dict]  # every trial run, sorted by run name
    factors: list[str]  # the swept dotted paths
    client: object = field(default=None, repr=False)
    objective: str = "bitops"  # the cost model the sweep's own front used (parent tag fractune.objective)
    status: str = "FINISHED"  # the parent run's: RUNNING while the sweep runs, KILLED when it was interrupted
    planned: int | None = None  # the trials the sweep planned (parent param planned_trials)
    task: Objective = objectives.DEFAULT  # the task objective, resolved once from the rows (``load``)
    stages: tuple[str, ...] = ()  # a staged sweep's stages in order (parent param ``stages``)

    @property
    def compared(self) -> list[dict]:
        """The trials the sweep compares (``compared_rows``): all but a staged sweep's start stages'."""
        return compared_rows(self.rows)

    def finished(self, objective: str = "bitops") -> list[dict]:
        """The compared trials that finished (``finished``)."""
        return finished(self.compared, self.task, objective)

    def front(self, objective: str = "bitops") -> list[dict]:
        """The sweep's Pareto front: over its compared trials, as the sweep itself tagged it."""
        return front(self.compared, self.task, objective)

    def progress(self) -> str | None:
        """A line saying the sweep is not done (running, or interrupted) and how far it got; None when done."""
        if self.status == "FINISHED":
            return None
        done = sum(1 for r in self.rows if r["status"] in ("FINISHED", "FAILED"))
        total = self.planned if self.planned is not None else len(self.rows)
        state = "running" if self.status == "RUNNING" else f"stopped ({self.status}; resume it with --resume)"
        return f"sweep {self.sweep_id} is {state}: {done} of {total} trials done; what follows is partial"


def load(uri: str, name: str, sweep_id: str | None = None) -> SweepRuns:
    """The latest sweep of ``name`` (or ``sweep_id``) in the store at ``uri``, one row per trial."""
    store.check_names(name, sweep_id)
    uri = store.normalise_uri(uri)
    store_checks.preflight(uri, mode="read")
    c = store.client(uri)
    parent = store.sweep_parent(c, name, sweep_id)
    if parent is None:
        if sweep_id and store.sweep_parent(c, name, None) is not None:  # the sweep is there; the id is not its
            raise ConfigError.single("--sweep-id", sweep_id, f"no run of sweep {name!r} with that id in "
                                     f"{store.redact(uri)}; `fractune sweeps {name}` lists them")
        raise ConfigError.single("sweep", name, f"no sweep of that name in {store.redact(uri)}")
    rows, factors = trial_rows(c, parent)
    planned = parent.data.params.get("planned_trials")
    return SweepRuns(uri, name, parent.data.tags.get(store.SWEEP_TAG, ""), parent.info.experiment_id,
                     parent.info.run_id, rows, factors, c, parent.data.tags.get(OBJECTIVE_TAG, "bitops"),
                     parent.info.status, int(planned) if planned and planned.isdigit() else None,
                     objectives.of_rows(rows), tuple(s for s in parent.data.params.get("stages", "").split(",") if s))


def trial_rows(c, parent) -> tuple[list[dict], list[str]]:
    """One row per child run of the sweep's parent run, and the swept paths in the order first seen."""
    children = store.child_runs(c, parent)
    record = None
    if any(store.PLANNED_TAG not in run.data.tags for run in children):  # runs from before the tag
        trials = (store.artifact_json(c, parent.info.run_id, "pareto.json") or {}).get("trials")
        record = {t["run_id"] for t in trials if t.get("complete")} if trials is not None else None
    rows, factors = [], []
    for run in children:
        swept = [s for s in run.data.tags.get("fractune.swept", "").split(",") if s]
        factors += [s for s in swept if s not in factors]
        rows.append(_row(c, run, swept, record))
    rows.sort(key=lambda r: r["name"] or "")
    return rows, factors


def _row(c, run, swept: list[str], record: set[str] | None) -> dict:
    tags, m, status = run.data.tags, store.metrics(run), run.info.status
    planned = tags.get(store.PLANNED_TAG)
    schedule = tags.get("fractune.schedule", run.data.params.get("schedule.kind"))
    gated = {}
    for key in ("cp_gated", "cp_model"):  # DFQ and FracTrain: the cp on each basis, the mean over the epochs
        if key in m:
            history = [store.stored(x.value) for x in c.get_metric_history(run.info.run_id, key)]
            gated[key] = math.fsum(history) / len(history) if history else math.nan
    cp_gated = gated.get("cp_gated", math.nan)
    row = make_row(run_id=run.info.run_id, trial_id=tags.get(store.TRIAL_TAG), name=run.info.run_name,
                   status=status, schedule=schedule, metrics=m, seed=trial.param_value(run.data.params.get("seed")),
                   point=trial.point_of(tags.get(store.POINT_TAG), run.data.params, swept),
                   planned_epochs=int(planned) if planned else None, node_id=tags.get("fractune.node_id"),
                   cp_gated=cp_gated, pareto=tags.get("pareto") == "true")
    row["method"] = tags.get(store.METHOD_TAG, schedule)  # the method's label (runs logged before it: the kind)
    row["stage"], row["init_run"] = tags.get(store.STAGE_TAG), tags.get("fractune.init_run")  # staged sweeps
    row["init_stage"] = tags.get("fractune.init_stage")
    row["diverged"] = tags.get("fractune.diverged")  # the epoch its loss passed the engine's bound, or None
    row["init_accuracy"] = float(m.get("init_accuracy", math.nan))  # from a pretrained model: before any step
    row["cp_model"] = gated.get("cp_model", math.nan)
    # a gated run's last epoch: each block's mean bits and skipped share (alloc_*), the gate's cumulative BitOPs
    row["gate"] = {k: float(v) for k, v in m.items() if k.startswith("alloc_") or k == "gate_bitops"}
    if planned is None:  # logged before the planned-epochs tag: the sweep's own record, else FINISHED
        row["complete"] = status == "FINISHED" and (record is None or run.info.run_id in record)
    return row


def make_row(*, run_id: str | None, trial_id: str | None, name: str | None, status: str, schedule: str | None,
             metrics: dict, seed, point: dict, planned_epochs: int | None, node_id: str | None = None,
             cp_gated: float = math.nan, pareto: bool = False) -> dict:
    """A trial row from a run's (or a Tune result's) metrics; ``complete`` by the one rule of this module."""
    epochs = metrics.get("epoch")
    epochs = int(epochs) if epochs is not None else None
    return {"run_id": run_id, "trial_id": trial_id, "name": name, "status": status, "schedule": schedule,
            **{key: float(metrics.get(key, math.nan)) for key in objectives.OBJECTIVES},
            TRAIN_BITOPS: float(metrics.get(TRAIN_BITOPS, math.nan)),
            # the readable companions, where logged (engine.metrics.readable_companions)
            **{key: float(metrics.get(key, math.nan)) for key in (TRAIN_TBITOPS, keys.TRAIN_BITOPS_LOG10, keys.CP_PCT,
                                                                keys.CP_GATED_PCT)},
            "cp": float(metrics.get(CUM_CP, math.nan)), "cp_gated": cp_gated, "seed": seed,
            "wall_seconds": float(metrics.get("wall_seconds", math.nan)), "point": point, "epochs": epochs,
            "planned_epochs": planned_epochs, "node_id": node_id, "pareto": pareto, "costs": row_costs(metrics),
            "stopped": stopped_early(status, epochs, planned_epochs),
            "complete": (status == "FINISHED" and epochs is not None and planned_epochs is not None
                         and epochs >= planned_epochs)}


def row_costs(metrics: dict) -> dict[str, float]:
    """Cost model name -> the run's training cost (``train_bitops`` and every ``train_cost_<model>`` metric)."""
    out = {"bitops": float(metrics.get(TRAIN_BITOPS, math.nan))}
    for key, value in metrics.items():
        if key.startswith(COST_PREFIX):
            name = key[len(COST_PREFIX):]
            out["table:" + name[len("table_"):] if name.startswith("table_") else name] = float(value)
    return out


def cost_of(row: dict, objective: str = "bitops") -> float:
    """A row's training cost under the cost model ``objective`` (NaN when the run did not log it)."""
    if objective == "bitops":
        return row[TRAIN_BITOPS]
    return float(row.get("costs", {}).get(objective, math.nan))


def check_objective(objective: str, rows: list[dict] | None = None, field_name: str = "--objective") -> str:
    """A known cost model name; with ``rows``, one that at least one of them logged, where any logged a cost (a
    sweep whose trials have logged none yet, or failed before, has an empty front under any model)."""
    check_model_name(objective, field_name)
    logged = sorted({n for r in rows or [] for n, v in r.get("costs", {}).items() if math.isfinite(v)})
    if logged and not any(math.isfinite(cost_of(r, objective)) for r in rows):
        raise ConfigError.single(field_name, objective, "no trial logged it (metric "
                                 f"{cost_key(objective)}); allowed here: {', '.join(logged)}")
    return objective


def start_stages(rows: list[dict]) -> list[str]:
    """The stages other stages' trials start from (``init_stage``), in the order the rows first name them."""
    return list(dict.fromkeys(r["init_stage"] for r in rows if r.get("init_stage")))


def compared_rows(rows: list[dict]) -> list[dict]:
    """The trials a sweep compares: every row but those of a stage another stage starts from (a staged sweep's
    pretrain); a sweep without stages, or with stages side by side, is compared whole."""
    starts = start_stages(rows)
    return [r for r in rows if r.get("stage") not in starts] if starts else rows


def compared_stages(rows: list[dict], order: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The stages whose trials a staged sweep compares (``compared_rows``), in the sweep's ``order``; empty where
    the sweep compares every trial."""
    if not start_stages(rows):
        return []
    return in_order(dict.fromkeys(r["stage"] for r in compared_rows(rows) if r.get("stage")), order)


def in_order(stages, order: tuple[str, ...] | list[str]) -> list[str]:
    """``stages`` in the sweep's ``order`` of stages, any it does not name after them as given."""
    stages = list(stages)
    return [s for s in order if s in stages] + [s for s in stages if s not in order]


def finished(rows: list[dict], task: Objective, objective: str = "bitops") -> list[dict]:
    """Trials that ran their planned length with both objectives (the ``task`` objective's metric and the cost
    under the cost model ``objective``): the ones fronts and statistics use."""
    return [r for r in rows if r["complete"] and math.isfinite(r.get(task.key, math.nan))
            and math.isfinite(cost_of(r, objective))]


def front(rows: list[dict], task: Objective, objective: str = "bitops") -> list[dict]:
    """The Pareto front (the ``task`` objective in its direction; training cost under the cost model
    ``objective`` min) of the finished trials, cheapest first; each member carries its ``cost`` under that
    model."""
    keyed = [{**r, "cost": cost_of(r, objective)} for r in finished(rows, task, objective)]
    return pareto_rows(keyed, acc_key=task.key, cost_key="cost", maximize=task.direction is objectives.Direction.MAX)


def front_entry(row: dict, task: Objective, objective: str = "bitops") -> dict:
    """A front member as the sweep's and ``fractune pareto``'s JSON give it: its run ``name`` and ``method``
    label, the swept values and the seed as ``params``, its ``cost`` under the front's ``objective`` and its task
    objective's value where that is not accuracy (a language model's ``perplexity``)."""
    entry = {"run_id": row["run_id"], "trial_id": row["trial_id"], "name": row.get("name"),
             "method": row.get("method") or row.get("schedule"), ACCURACY: row[ACCURACY],
             TRAIN_BITOPS: row[TRAIN_BITOPS], "objective": objective, "cost": cost_of(row, objective),
             "cp": row["cp"], "params": {**row["point"], "seed": row["seed"]}}
    if task.key != ACCURACY and math.isfinite(row.get(task.key, math.nan)):
        entry[task.key] = row[task.key]
    return entry


def front_quality(done: list[dict], front: list[dict], task: Objective, objective: str) -> dict:
    """The hypervolume of the front (``results.pareto.hypervolume``) with its reference point stated. The quality
    axis is the task objective (accuracy, from 0), or its inverse where the objective says so (``inverse``: a
    language model's ``1 / perplexity``, the geometric-mean probability of the next token, in (0, 1], from the
    reference point perplexity infinity)."""
    costs = [cost_of(r, objective) for r in done]
    ref = max(costs) if costs else float("nan")
    quality = [task.quality(r[task.key]) for r in done]
    axis, origin = (f"1 / {task.label}", "infinity") if task.inverse else (task.key, "0")
    return {"objective": objective, "task_objective": task.key,
            "hypervolume": hypervolume(quality, costs, ref) if costs else float("nan"),
            "reference": {("inverse_" if task.inverse else "") + task.key: 0.0, "cost": ref},
            "rule": f"area dominated by the front in the (cost / reference cost, {axis}) unit square, from the "
                    f"reference point {task.key} {origin} at the dearest finished trial's cost under {objective} "
                    f"({ref:.6g}); 1 = {task.key} 1 at no cost", "front_size": len(front)}


def log_quality(c, run_id: str, quality: dict) -> None:
    """A front's hypervolume (``front_quality``) on the sweep's parent run, where it is finite: the metric
    ``hypervolume_<cost model>`` and its reference point in words (tag ``fractune.hypervolume_<model>.reference``)."""
    if math.isfinite(quality["hypervolume"]):
        key = "hypervolume_" + quality["objective"].replace(":", "_")
        c.log_metric(run_id, key, quality["hypervolume"])
        c.set_tag(run_id, f"fractune.{key}.reference", quality["rule"][:5000])
