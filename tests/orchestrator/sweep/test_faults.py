"""Faults against real Ray and a real MLflow store: failing trials, killed trials, a killed driver, an
unreachable tracking store and a full or unwritable storage folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.sweep.driver import SweepOptions
from orchestrator.sweep.launch import run_sweep
from results import store
from search_spaces.spec import parse_spec
from tests.conftest import needs_root, run_main
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

FOUR = [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8}, {"kind": "static", "fw": 4, "bw": 8},
        {"kind": "static", "fw": 2, "bw": 4}]


@pytest.mark.slow
def test_a_nan_loss_errors_its_trial_and_the_others_finish(ray_local, tmp_path, sqlite_uri, capsys):
    spec = {"name": "nan_sweep", "base": {**SLOW, "optim": {"epochs": 2}, "debug": {}},
            "parameters": {"debug": {"grid": [{}, {"nan_loss_at_iteration": 3}]}},
            "budget": {"max_concurrent_trials": 1, "max_failures": 0}, "resources": {"cpu": 1}}
    (tmp_path / "nan.yaml").write_text(yaml.safe_dump(spec))
    code, _, out = run_main("sweep", str(tmp_path / "nan.yaml"), "--quiet", "--no-report", "--storage",
                            str(tmp_path / "r"), "--tracking-uri", sqlite_uri, "--json")
    assert code == 1  # the CLI says so in its exit code
    assert out["trials"] == 2 and out["errored"] == 1
    assert "training loss is nan" in out["errors"][0]["error"] and "iteration 3" in out["errors"][0]["error"]
    runs = histories(sqlite_uri, "nan_sweep")
    assert sorted(r["status"] for r in runs.values()) == ["FAILED", "FINISHED"]
    assert all(r["end"] and r["end"] >= r["start"] for r in runs.values())  # the failed run ended too
    # quiet by default: a line of fractune's own for the error, Tune's traceback in the log file it names; with
    # --json the sweep's summary for people is on stderr too
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) <= 12, err
    assert len([x for x in lines if "errored:" in x]) == 1 and any("fractune.log" in x for x in lines), err
    assert f"full log lines: {out['log']}" in err and "nan" in Path(out["log"]).read_text()
    # the error names its trial as the progress lines and MLflow do: method label and run name
    failed = next(r for r in runs.values() if r["status"] == "FAILED")
    assert out["errors"][0]["label"] == f"{failed['tags'][store.METHOD_TAG]} [{failed['name']}]"
    assert f"trial {out['errors'][0]['label']} errored: " in err


@pytest.mark.slow
def test_a_killed_trial_is_retried_from_its_checkpoint_without_gaps(ray_local, tmp_path, sqlite_uri):
    pace = Pace(tmp_path)
    spec = {"name": "kill_trial", "base": {**SLOW, "optim": {"epochs": 4}, "debug": pace.debug},
            "parameters": {"schedule": {"grid": FOUR[:2]}},
            "budget": {"max_concurrent_trials": 1, "max_failures": 2}, "resources": {"cpu": 1}}
    killed: list[int] = []

    def killer():
        def logged_two_epochs():
            try:
                return any(len(h["steps"]) >= 2 for h in histories(sqlite_uri, "kill_trial").values())
            except Exception:
                return False

        wait_for(logged_two_epochs, timeout=120, what="two logged epochs")
        # a trial's process is titled ray::ImplicitFunc.train only while a train() call runs; between two calls
        # (a report handed over, a checkpoint saved) it is titled otherwise, so look until one is in a call
        pids = wait_for(lambda: our_ray_processes(b"ray::ImplicitFunc.train"), timeout=30, interval=0.05, what="a trial process inside train()")
        os.kill(pids[0], signal.SIGKILL)
        killed.append(pids[0])
        pace.release()  # the retry and the second trial run at full speed

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    out = run_sweep(parse_spec(spec), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "r"), progress=False))
    t.join(timeout=5)
    assert killed, "the trial process was never killed"
    assert out["errored"] == 0 and out["trials"] == 2
    runs = histories(sqlite_uri, "kill_trial")
    assert all(r["status"] == "FINISHED" for r in runs.values())
    for r in runs.values():
        assert r["steps"] == [1, 2, 3, 4]  # no gap, no repeated epoch
    assert any("fractune.retried" in r["tags"] for r in runs.values())


def test_a_killed_trials_checkpoint_folder_is_removed_and_a_live_ones_kept(tmp_path):
    """A trial or data-parallel worker killed while it held a temporary checkpoint folder leaves it; the next one
    that starts on the machine removes the folders of dead processes only."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"{scratch.PREFIX}{gone.pid}-k1"
    stale.mkdir()
    (stale / "state.pt").write_bytes(b"x")
    live = tmp_path / f"{scratch.PREFIX}{os.getpid()}-k2"  # a trial reporting right now
    live.mkdir()
    foreign = [tmp_path / f"{scratch.PREFIX}abc", tmp_path / f"{scratch.PREFIX}x-y", tmp_path / "other-1-2"]
    for folder in foreign:
        folder.mkdir()
    assert scratch.remove_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and all(f.exists() for f in foreign)


@pytest.mark.slow
def test_a_killed_driver_resumes_every_trial_exactly_once(ray_local, tmp_path, sqlite_uri):
    spec = tmp_path / "spec.yaml"
    pace = Pace(tmp_path)
    spec.write_text(yaml.safe_dump({"name": "kill_driver",
                                    "base": {**SLOW, "optim": {"epochs": 3}, "debug": pace.debug},
                                    "parameters": {"schedule": {"grid": FOUR[:3]}},
                                    "budget": {"max_concurrent_trials": 1}, "resources": {"cpu": 1}}))
    uri = sqlite_uri  # the tables exist: this test polls the store while the sweep writes it
    # the killed driver attaches to the session's Ray (a driver's death ends its trials' actors, as a local Ray's
    # would); the resume runs in this process, on the same Ray
    args = ("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri, "--quiet", "--no-report",
            "--address", ray_local.get_runtime_context().gcs_address)
    env = {"RAY_ADDRESS": ""}
    proc = start_cli(*args, cwd=tmp_path, env=env)
    try:
        def some_finished_and_some_running():
            try:
                h = histories(uri, "kill_driver")
            except Exception:  # nothing logged yet
                return None
            done = [k for k, v in h.items() if v["status"] == "FINISHED"]
            running = [k for k, v in h.items() if v["status"] == "RUNNING" and len(v["steps"]) >= 1]
            return (done, h) if done and running else None

        done, before = wait_for(some_finished_and_some_running, timeout=240, what="a finished and a running trial")
    finally:
        killed_at = time.time() * 1000
        kill_session(proc.pid)
        proc.wait(timeout=30)
        pace.release()  # the resume runs at full speed
    code, text, out = run_main(*args, "--resume", "--json")
    assert code == 0, text[-3000:]
    after = histories(uri, "kill_driver")
    assert len(after) == 3  # exactly one child run per trial
    assert len({r["parent"] for r in after.values()}) == 1
    assert all(r["status"] == "FINISHED" and r["steps"] == [1, 2, 3] for r in after.values())
    for trial in done:  # finished before the kill: not run again
        assert after[trial]["last_ts"] == before[trial]["last_ts"] < killed_at
    assert out["trials"] == 3 and out["errored"] == 0


@pytest.mark.slow
def test_a_sweep_folder_tune_cannot_restore_is_one_line_naming_resume(ray_local, tmp_path, sqlite_uri, capsys):
    """A ``tuner.pkl`` of bytes that are no pickle, and no complete copy to fall back on (``restore_state``):
    ``--resume`` says so in one line, exit 2, not Tune's traceback."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "garbled", "base": {**SLOW, "optim": {"epochs": 1}}}))
    folder = tmp_path / "runs" / "garbled-20260101-000000"
    folder.mkdir(parents=True)
    (folder / "tuner.pkl").write_bytes(bytes(range(7, 250)))
    code = run_main("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", sqlite_uri, "--quiet",
                    "--no-report", "--address", ray_local.get_runtime_context().gcs_address, "--resume")[0]
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("fractune sweep: error: --resume: got 'garbled'; allowed: a sweep "
                                                   f"folder Ray Tune can restore, not {folder} (UnpicklingError: ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tracking_store_unreachable_at_start_fails_before_any_trial(run_cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "no_store", "base": SLOW}))
    t = time.monotonic()
    r = run_cli("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri",
                f"http://127.0.0.1:{_free_port()}")
    assert r.returncode == 2 and time.monotonic() - t < 30
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tracking-uri" in lines[0] and "unreachable" in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing started



@needs_root
def test_full_or_unwritable_storage_is_a_clear_error(tmp_path, tiny_mount, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "disk", "base": {**SLOW, "optim": {"epochs": 1}, "debug": {}}}))
    full = tiny_mount("16k")
    subprocess.run(["dd", "if=/dev/zero", f"of={full / 'filler'}", "bs=1k", "count=64"], capture_output=True)
    cases = {full: "No space left on device", tiny_mount("1m", readonly=True): "Read-only file system",
             tmp_path / "s.yaml" / "sub": "Not a directory"}
    for storage, reason in cases.items():
        t = time.monotonic()
        code, _, _ = run_main("sweep", str(spec), "--storage", str(storage), "--tracking-uri",
                              f"sqlite:///{tmp_path}/m.db")
        assert code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--storage" in lines[0] and reason in lines[0], lines
        assert time.monotonic() - t < 60
