"""A sweep whose trials train on two Ray Train workers each (``resources.workers``), through the CLI on a real
local Ray, with its rank-0 worker process killed mid-trial (docs/methods.md §12)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from results import store
from tests.conftest import run_main
from tests.orchestrator.procs import (
    SLOW,
    Pace,
    histories,
    kill_session,
    our_ray_processes,
    start_cli,
    wait_for,
)
from trainables import scratch

EPOCHS = 3


@pytest.mark.slow
def test_a_sweep_on_two_workers_per_trial_survives_a_killed_worker_with_every_epoch_once(ray_local, tmp_path,
                                                                                          sqlite_uri):
    spec = tmp_path / "dp.yaml"
    pace = Pace(tmp_path, 0.05)
    spec.write_text(yaml.safe_dump({
        "name": "dp_sweep",
        "base": {**SLOW, "data": {"dataset": "digits", "batch_size": 32}, "optim": {"epochs": EPOCHS},
                 "debug": pace.debug},
        # one trial: every Ray Train group costs a controller, helper actors and two workers, each a process
        "parameters": {"schedule": {"grid": [{"kind": "static", "fw": 4, "bw": 8}]}},
        "budget": {"max_concurrent_trials": 1, "max_failures": 1},
        "resources": {"workers": 2, "cpu": 1}}))
    proc = start_cli("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", sqlite_uri, "--quiet",
                     "--no-report", "--json", "--address", ray_local.get_runtime_context().gcs_address,
                     cwd=tmp_path, env={"RAY_ADDRESS": ""})
    try:
        def first_epoch_logged():
            try:
                return any(h["steps"] for h in histories(sqlite_uri, "dp_sweep").values())
            except Exception:  # nothing logged yet
                return False

        wait_for(first_epoch_logged, timeout=240, what="a data-parallel trial's first epoch")

        def rank0_holding_a_checkpoint_folder():  # rank 0 keeps its last checkpoint's folder until the next one
            return [pid for pid in our_ray_processes(b"RayTrainWorker")
                    if list(Path(tempfile.gettempdir()).glob(f"{scratch.PREFIX}{pid}-*"))]

        victim = wait_for(rank0_holding_a_checkpoint_folder, timeout=60, interval=0.1, what="rank 0's folder")[0]
        os.kill(victim, signal.SIGKILL)
        seen_in_storage = list((tmp_path / "runs").glob("*/train_trial_*/data_parallel/run-*/checkpoint_*"))
        pace.release()  # the restarted group trains at full speed
        assert proc.wait(timeout=400) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    finally:
        kill_session(proc.pid)
    out = json.loads((tmp_path / "stdout.log").read_text().strip().splitlines()[-1])
    assert out["trials"] == 1 and out["errored"] == 0
    runs = histories(sqlite_uri, "dp_sweep")
    # the trial once, finished, every epoch once: the group restarted from its checkpoint, not from scratch
    assert len(runs) == 1 and all(r["status"] == "FINISHED" and r["steps"] == list(range(1, EPOCHS + 1))
                                  for r in runs.values()), runs
    c = store.client(sqlite_uri)
    children = store.child_runs(c, store.sweep_parent(c, "dp_sweep"))
    assert {r.data.params["workers"] for r in children} == {"2"}  # the world size each trial trained on
    # the group that lost a worker restarted from its last checkpoint: Tune was handed every epoch once, in order
    # (its own log of the trial's results: a restart from scratch would hand it the first epoch again)
    trial_dirs = list(Path(out["storage"]).glob("train_trial_*"))
    assert len(trial_dirs) == 1
    reported = [json.loads(line)["epoch"] for line in (trial_dirs[0] / "result.json").read_text().splitlines()]
    assert reported == list(range(1, EPOCHS + 1)), reported
    # Ray Train's run kept its checkpoints in the sweep's storage (which every node of a cluster sees), and they
    # went with the run: the trial's own checkpoints are Tune's
    assert seen_in_storage and not list(trial_dirs[0].glob("data_parallel")), seen_in_storage
    # the killed rank's temporary checkpoint folder went with the group's restart, not left in the machine's /tmp
    assert not list(Path(tempfile.gettempdir()).glob(f"{scratch.PREFIX}{victim}-*"))


def test_a_sweeps_end_removes_the_ray_train_runs_of_trials_killed_without_a_retry(tmp_path):
    """A data-parallel trial whose process was killed, never run again, leaves its Ray Train run (checkpoints
    included) in the sweep's folder; the sweep removes such runs once every trial has ended, and nothing else."""
    from trainables.tune_trainable import RAY_TRAIN_DIR, remove_ray_train_runs

    exp = tmp_path / "dp_sweep-20260101-000000"
    left = exp / "train_trial_a" / RAY_TRAIN_DIR / "run-1" / "checkpoint_000000"
    left.mkdir(parents=True)
    (left / "state.pt").write_bytes(b"x")
    kept = [exp / "train_trial_a" / "checkpoint_000001" / "state.pt", exp / "train_trial_b" / "result.json",
            exp / "tuner.pkl", exp / RAY_TRAIN_DIR / "a-file-of-the-user"]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"y")
    remove_ray_train_runs(exp)
    assert not (exp / "train_trial_a" / RAY_TRAIN_DIR).exists()
    assert all(path.read_bytes() == b"y" for path in kept)


@pytest.mark.parametrize("resources, base, line", [
    ({"workers": 0}, {}, "resources.workers: got 0"),
    ({"workers": 3, "cpu": 1}, {}, "resources.workers: got 3; allowed: <= 2"),
    ({"workers": 2}, {"workers": 4}, "resources.workers: got 2; allowed: the base's workers (4)"),
    ({}, {"workers": 2}, "base.workers: got 2; allowed: 1"),
])
def test_workers_a_sweep_cannot_have_are_refused_in_one_line_before_anything_starts(ray_local, tmp_path, capsys,
                                                                                     resources, base, line):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"name": "bad_dp", "base": {"model": {"name": "tiny"},
                                                               "data": {"dataset": "digits"}, **base},
                                    "resources": resources}))
    code, _, _ = run_main("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri",
                          f"sqlite:///{tmp_path / 'm.db'}", "--no-report")
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(err) == 1 and line in err[0], err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()


@pytest.mark.slow
def test_a_data_parallel_run_whose_caller_stops_listening_stops_its_workers(ray_local, tmp_path):
    """Tune stops a trial (ASHA, a time budget) by raising in its thread as it reports an epoch; the trial's Ray
    Train run must end with it, its workers gone at once, not train on to its last epoch beside the next trial
    (which, reusing the actor, would wait for the same CPUs)."""
    from engine.config.experiment import ExperimentConfig
    from trainables.data_parallel import train_epoch_by_epoch

    cfg = ExperimentConfig.model_validate({"model": {"name": "tiny"}, "workers": 2, "optim": {"epochs": 30},
                                           "data": {"dataset": "digits", "batch_size": 32},
                                           "debug": {"sleep_per_iteration": 0.05}})
    seen = []

    def stop_after_the_first(metrics, folder):
        seen.append(metrics["epoch"])
        assert our_ray_processes(b"RayTrainWorker")  # the run's two workers, training
        raise SystemExit(0)  # what Tune's report raises in a trial it stops

    with pytest.raises(SystemExit):
        train_epoch_by_epoch(cfg, {"cpu": 1, "gpu": 0}, str(tmp_path / "dp"), stop_after_the_first)
    assert seen == [1]
    wait_for(lambda: not our_ray_processes(b"RayTrainWorker"), timeout=20, interval=0.2,
             what="the stopped run's workers to end")
    # and their CPUs free again (a killed controller would leave its placement group holding them)
    wait_for(lambda: ray_local.available_resources().get("CPU") == ray_local.cluster_resources()["CPU"],
             timeout=20, interval=0.2, what="every CPU free")
    # nothing trains on: no later epoch's checkpoint appears in the run's storage
    time.sleep(3)
    assert len([p for p in (tmp_path / "dp").rglob("checkpoint_*") if p.is_dir()]) == 1  # the first epoch's
