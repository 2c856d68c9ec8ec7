"""A real MLflow server (started by `fractune ui`, sqlite backend in a temp folder, one worker, 127.0.0.1)
and a small real sweep on digits logged into it over HTTP by `fractune sweep` (which also writes the report).
Session-scoped: the report, UI and browser tests share them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.conftest import ROOT

SWEEP = {
    "name": "served_sweep",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 2}},
    "parameters": {"schedule": {"grid": [
        {"kind": "static", "fw": 8, "bw": 8},
        {"kind": "pfq", "mode": "auto", "fw": [3, 4, 6, 8], "bw": [6, 6, 8, 8], "epsilon": 0.3, "alpha": 0.5,
         "eval_every": 2},
        {"kind": "dfq", "options": "paper", "target_cp": 3.0, "execution": "routed"}]}},
    "budget": {"max_concurrent_trials": 2},
    "resources": {"cpu": 1},
}


def start_ui(db: str, *extra: str, timeout: float = 180.0) -> tuple[subprocess.Popen, dict]:
    """`fractune ui --port 0 --json` in its own session; returns the process and its JSON line. The server's
    log (stderr) goes to a file next to the database: an unread pipe would fill up and stall the server."""
    log = open(f"{db}.ui.log", "w")  # noqa: SIM115  closed by stop_ui
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", "--tracking-uri", f"sqlite:///{db}",
                             "--port", "0", "--json", *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                            text=True, start_new_session=True)
    proc.log = log
    lines: queue.Queue = queue.Queue()  # a reader thread: select() cannot see lines already in Python's buffer
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        seen.append(line)
        if line.startswith("{"):
            return proc, json.loads(line)
    stop_ui(proc)
    pytest.fail(f"fractune ui did not report a running server within {timeout:.0f} s; stdout {seen}; "
                f"log {db}.ui.log: {open(f'{db}.ui.log').read()[-2000:]}")


def stop_ui(proc: subprocess.Popen) -> int:
    """Ctrl-C, as a person would; the command stops its server. Kill the group only if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    proc.stdout.close()
    proc.log.close()
    return proc.returncode


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlflow_server")
    proc, info = start_ui(str(folder / "mlflow.db"))
    yield {"uri": info["tracking_uri"], "folder": folder, "info": info}
    stop_ui(proc)


@pytest.fixture(scope="session")
def served_sweep(ray_local, mlflow_server, tmp_path_factory):
    """`fractune sweep --json` (in this process, on the session's Ray) into the server; its JSON line."""
    from orchestrator.cli import main

    folder = tmp_path_factory.mktemp("served_sweep")
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["sweep", str(spec), "--tracking-uri", mlflow_server["uri"], "--storage", str(folder / "runs"),
                     "--report-dir", str(folder / "report"), "--quiet", "--json"])
    out = buf.getvalue()
    assert code == 0, out
    return {**json.loads(out.strip().splitlines()[-1]), "stdout": out, "folder": folder}
