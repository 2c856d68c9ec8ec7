"""The tracker logs what the engine reports: every numeric metric of a trial's epochs reaches MLflow, and nothing
of Tune's own bookkeeping does. Checked on the session's served sweep (an FP32, a static, an auto-PFQ and a
routed-DFQ trial on digits, logged over HTTP) against the engine's own per-epoch history in each trial's checkpoint; and a
sweep whose tracking server becomes unreachable mid-sweep loses nothing."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from engine import checkpoint
from engine.metrics import readable_companions, readable_key
from orchestrator.sweep.driver import SweepOptions
from orchestrator.sweep.launch import run_sweep
from orchestrator.tracking.tracker import NOT_METRICS, is_metric
from results import store
from search_spaces.spec import parse_spec
from tests.conftest import needs_root
from tests.orchestrator.procs import SLOW, Pace, Relay, histories, wait_for


def _engine_history(storage: Path, trial_id: str) -> list[dict]:
    """The per-epoch metrics the engine reported, as its last checkpoint of this trial keeps them."""
    (trial_dir,) = [p for p in storage.iterdir() if p.is_dir() and trial_id in p.name]
    last = max(trial_dir.glob("checkpoint_*"), key=lambda p: p.name)
    return checkpoint.load(last)["history"]


def test_every_numeric_engine_metric_reaches_mlflow(served_sweep, mlflow_server):
    c = store.client(mlflow_server["uri"])
    children = store.child_runs(c, c.get_run(served_sweep["parent_run_id"]))
    assert len(children) == 4
    # every run ends with its end time (the MLflow UI's Duration), read back from a real server
    assert all(r.info.status == "FINISHED" and r.info.end_time >= r.info.start_time > 0 for r in children)
    for run in children:
        history = _engine_history(Path(served_sweep["storage"]), run.data.tags[store.TRIAL_TAG])
        reported = {k for k, v in history[-1].items() if isinstance(v, int | float) and not isinstance(v, bool)}
        logged = set(run.data.metrics)
        readable = {c: k for k in reported for c in readable_companions(k, 1e15)}  # e.g. train_tbitops
        assert {"train_tbitops", "step_tbitops", "cp_pct", "train_bitops_log10"} <= set(readable), readable
        # nothing dropped, nothing of Tune's; beside the exact values their readable companions
        assert logged == reported | set(readable), (run.info.run_name, logged ^ (reported | set(readable)))
        for companion, exact in readable.items():  # the last epoch's, and at every epoch: to four figures
            steps = {m.step: m.value for m in c.get_metric_history(run.info.run_id, exact)}
            assert {m.step: m.value for m in c.get_metric_history(run.info.run_id, companion)} == {
                step: readable_companions(exact, value)[companion] for step, value in steps.items()}, companion
        assert run.data.metrics["train_tbitops"] == pytest.approx(run.data.metrics["train_bitops"] / 1e12, rel=1e-3)
        for key in ("accuracy", "epoch"):
            assert [m.step for m in c.get_metric_history(run.info.run_id, key)] == [1, 2]
    dfq = next(r for r in children if r.data.tags["fractune.schedule"] == "dfq")
    # metrics the engine added after the tracker was written (it once kept an allow-list that dropped them)
    for key in ("gate_price", "cp_batch_error", "alloc_fw_b00"):
        assert [m.step for m in c.get_metric_history(dfq.info.run_id, key)] == [1, 2], key
    # where a trial ran is a tag, not a metric
    assert {"fractune.node_id", "fractune.device", "fractune.torch_threads"} <= set(dfq.data.tags)


def test_each_exact_cost_has_a_readable_companion_rounded_to_four_figures():
    exact = {"train_bitops": 1.234567890123e15, "step_bitops": 3.2e11, "fp32_bitops": 9e15, "gate_bitops": 4e12,
             "train_cost_energy": 7.5e13, "epoch_cost_memory": 2e12, "cum_gbitops": 1234.5, "train_gbitops": 1234.5,
             "bitops_per_token": 5e9, "accuracy": 0.9, "cp": 12.5, "cum_cp": 6.25641991371636,
             "cp_gated": 3.04852160}
    out = store.with_readable(exact)
    assert {k: v for k, v in out.items() if k not in exact} == {
        "train_tbitops": 1235.0, "step_tbitops": 0.32, "fp32_tbitops": 9000.0, "gate_tbitops": 4.0,
        "train_tcost_energy": 75.0, "epoch_tcost_memory": 2.0, "cp_pct": 6.256, "cp_gated_pct": 3.049,
        "train_bitops_log10": 15.0915}
    assert {k: out[k] for k in exact} == exact  # the exact ones stay, unchanged
    assert all(readable_key(k) is None for k in ("cum_gbitops", "bitops_per_token", "accuracy", "train_cost_"))
    # what a person reads: no companion longer than four significant figures (the log: four decimals)
    assert all(len(f"{v:g}".replace(".", "").lstrip("0")) <= 4 for k, v in out.items()
               if k not in exact and k != "train_bitops_log10")
    # no logarithm of zero BitOPs; a NaN stays NaN
    edge = store.with_readable({"train_bitops": 0.0, "cum_cp": math.nan})
    assert set(edge) == {"train_bitops", "train_tbitops", "cum_cp", "cp_pct"} and math.isnan(edge["cp_pct"])


def test_tune_bookkeeping_and_placement_are_not_metrics():
    result = {"accuracy": 0.9, "epoch": 2, "new_engine_metric": 1.5, "stage": 1, "training_iteration": 2,
              "time_this_iter_s": 0.3, "timestamp": 1700000000, "pid": 42, "date": "2026-11-23", "done": False,
              "torch_threads": 1, "node_id": "abc", "events": [], "flag": True}
    assert {k for k, v in result.items() if is_metric(k, v)} == {"accuracy", "epoch", "new_engine_metric", "stage"}
    assert {"training_iteration", "time_total_s", "iterations_since_restore", "torch_threads"} <= NOT_METRICS


@pytest.mark.slow
def test_tracking_store_unreachable_mid_sweep_is_backfilled(ray_local, mlflow_server, tmp_path):
    """The session's MLflow server becomes unreachable after the sweep's first metric (its port refuses
    connections, open ones are reset: what a killed server does to its clients) and comes back two epochs later.
    Training goes on, the writes queue up and are backfilled in order: every history is complete."""
    relay = Relay(int(mlflow_server["uri"].rsplit(":", 1)[1]))
    uri = f"http://127.0.0.1:{relay.port}"
    pace = Pace(tmp_path)
    spec = {"name": "store_down", "base": {**SLOW, "optim": {"epochs": 6}, "debug": pace.debug},
            "parameters": {"schedule": {"grid": [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8}]}},
            "budget": {"max_concurrent_trials": 1}, "resources": {"cpu": 1}}
    storage = tmp_path / "r"

    def outage():
        def a_first_metric():
            try:
                return any(h["steps"] for h in histories(mlflow_server["uri"], "store_down").values())
            except Exception:  # noqa: BLE001  nothing logged yet
                return False

        wait_for(a_first_metric, timeout=120, what="a first metric in the store")
        relay.cut()
        before = _tune_results(storage)
        # trials keep training and reporting while the store is unreachable: two more epochs of each trial
        wait_for(lambda: _tune_results(storage) >= before + 4, timeout=120, what="epochs reported to Tune")
        relay.restore()
        pace.release()  # the backfill and the rest of the sweep at full speed

    t = threading.Thread(target=outage, daemon=True)
    t.start()
    out = run_sweep(parse_spec(spec), SweepOptions(tracking_uri=uri, storage=str(storage), progress=False))
    t.join(timeout=120)
    relay.cut()
    assert out["errored"] == 0
    report = out["tracking"]
    print("tracking report:", json.dumps(report))  # figures for docs/reliability.md (pytest -s)
    # retried at every callback of the outage, nothing left pending
    assert report["failed_calls"] >= 3 and report["backfilled"] >= 3 and report.get("pending", 0) == 0
    assert report["gap"]["last"] >= report["gap"]["first"]
    runs = histories(mlflow_server["uri"], "store_down")
    assert len(runs) == 2 and all(r["steps"] == list(range(1, 7)) for r in runs.values())
    assert all(r["status"] == "FINISHED" for r in runs.values())


def _tune_results(storage: Path) -> int:
    """Epoch results Tune has recorded so far (one line each in the trials' result.json)."""
    return sum(len(p.read_text().splitlines()) for p in storage.glob("*/*/result.json"))


@needs_root
def test_a_tracking_database_on_a_full_disk_says_so_in_one_line(tmp_path, tiny_mount):
    """A real sqlite store whose disk fills: the failure's one line is sqlite's cause, not SQLAlchemy's footer."""
    import subprocess

    from results import store

    disk = tiny_mount("4m")
    uri = f"sqlite:///{disk / 'mlflow.db'}"
    c = store.client(uri)
    exp = c.create_experiment("full")
    run = c.create_run(exp)
    subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=64k"], capture_output=True)
    with pytest.raises(Exception) as err:
        for i in range(20000):  # the store's free pages run out within a few hundred writes
            c.log_param(run.info.run_id, f"p{i}", "x" * 500)
    line = store.one_line_error(err.value)
    assert "database or disk is full" in line and "sqlalche.me" not in line and "\n" not in line
