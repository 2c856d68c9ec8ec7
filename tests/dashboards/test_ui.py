"""`fractune ui` really starts `mlflow server` on 127.0.0.1 with one worker (the session's server is started this
way; the ``mlflow_server`` fixture checks at the end of the session that Ctrl-C stops all of it)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.conftest import ROOT


def test_ui_serves_a_loopback_server_with_one_worker(mlflow_server):
    info = mlflow_server["info"]
    base = info["tracking_uri"]
    port = int(base.rsplit(":", 1)[1])
    assert base.startswith("http://127.0.0.1:") and info["started"] is True
    assert info["url"] == base + "/#/experiments?workflowType=machine_learning"  # the UI's model-training mode
    with urllib.request.urlopen(base + "/health", timeout=10) as resp:
        assert resp.status == 200
    argv = Path(f"/proc/{info['pid']}/cmdline").read_bytes().split(b"\0")
    for flag, value in ((b"--host", b"127.0.0.1"), (b"--workers", b"1"), (b"--port", str(port).encode())):
        assert argv[argv.index(flag) + 1] == value
    db = mlflow_server["folder"] / "mlflow.db"
    assert argv[argv.index(b"--backend-store-uri") + 1] == f"sqlite:///{db}".encode()
    assert argv[argv.index(b"--artifacts-destination") + 1] == str(db.parent / "mlartifacts").encode()
    # the server's whole session: the server and its uvicorn, no GenAI job runner or huey consumers
    from tests.orchestrator.procs import session_pids

    commands = [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p in session_pids(info["pid"])]
    assert len(commands) == 3 and not [c for c in commands if b"huey" in c or b"job_runner" in c], commands
    assert b"server_guard.py" in argv[1]  # the guard, which stops the server if fractune ui is killed


GUARDED = [sys.executable, str(ROOT / "dashboards" / "server_guard.py"), sys.executable, "-c",
           "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
           "time.sleep(300)"]  # a stand-in server with a worker of its own, as mlflow server has its uvicorn


def _live(pids: list[int]) -> list[int]:
    """``pids`` that are neither gone nor zombies (a reparented zombie waits for whoever reaps it)."""
    from tests.orchestrator.procs import _stat

    return [p for p in pids if (fields := _stat(Path(f"/proc/{p}"))) and fields[0] != "Z"]


def _wait_for_group(guard: int, count: int) -> None:
    from tests.orchestrator.procs import session_pids, wait_for

    wait_for(lambda: len(_live(session_pids(guard))) == count, timeout=30, what=f"{count} guarded processes")


def test_the_server_stops_when_fractune_ui_is_killed_or_its_guard_is_stopped():
    """`fractune ui` runs its server under dashboards/server_guard.py, in a session the guard leads. A starter
    that holds the guard's stdin pipe, as `fractune ui` does, is SIGKILLed: the guard, the server and the
    server's worker are all gone. SIGTERM to the guard alone (the pid `fractune ui --json` reports) stops the
    group the same way and exits 143, as the server does."""
    from tests.orchestrator.procs import session_pids, wait_for

    starter = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], "
                                "stdin=subprocess.PIPE, start_new_session=True); print(p.pid, flush=True); "
                                "time.sleep(300)", *GUARDED], stdout=subprocess.PIPE, text=True)
    guard = int(starter.stdout.readline())
    guarded = subprocess.Popen(GUARDED, stdin=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for_group(guard, 3)
        starter.kill()
        starter.wait()
        wait_for(lambda: not _live(session_pids(guard)), timeout=30, what="the guarded server to stop")

        _wait_for_group(guarded.pid, 3)
        guarded.terminate()
        assert guarded.wait(30) == 143
        wait_for(lambda: not _live(session_pids(guarded.pid)), timeout=30, what="the guarded server to stop")
    finally:  # whatever the verdict, leave no stand-in behind
        starter.kill()
        for group in (guard, guarded.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        guarded.stdin.close()
        starter.stdout.close()


def test_a_busy_port_or_a_foreign_host_is_refused_before_anything_is_made(tmp_path, capsys):
    """One line, exit 2, and the missing store not created: a port a server listens on, an address of no
    interface of this machine (a documentation address; no bound warning either), a non-UTF-8 byte in the
    store's path (what argv gives as a lone surrogate)."""
    from tests.conftest import run_main

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = run_main("ui", "--tracking-uri", uri, "--port", str(port))[0]
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"fractune ui: error: --port: got {port}; already in "
                                                            "use: give a free port, or --port 0 for any free one"]
    assert run_main("ui", "--tracking-uri", uri, "--host", "203.0.113.9")[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fractune ui: error: --host: got '203.0.113.9'; cannot bind there"), err
    assert run_main("ui", "--tracking-uri", f"sqlite:///{tmp_path}/\udcff.db")[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tracking-uri" in err[0] and "not UTF-8" in err[0], err
    assert not list(tmp_path.iterdir())


def test_ui_output_and_the_server_log(mlflow_server):
    from dashboards.ui import server_command

    log = mlflow_server["folder"] / "mlflow-ui.log"  # the server's own log, off the terminal
    assert mlflow_server["info"]["log"] == str(log) and log.is_file()
    assert " GET /" not in log.read_text()  # no access lines (the UI makes dozens a page)
    quiet = server_command("sqlite:////x/m.db", "127.0.0.1", 5000, quiet=True)
    assert quiet[-2:] == ["--uvicorn-opts", "--no-access-log --log-level warning"]
    assert "--uvicorn-opts" not in server_command("sqlite:////x/m.db", "127.0.0.1", 5000)  # --verbose


def test_a_sweep_opens_in_training_mode_with_its_summary(served_sweep, mlflow_server):
    import json

    from dashboards import mlflow_view
    from results import runs, store

    c = store.client(mlflow_server["uri"])
    exp = c.get_experiment(served_sweep["experiment_id"])
    assert exp.tags[store.KIND_TAG] == "custom_model_development"
    # trial runs named by what tells them apart (here the method alone) and the seed; Tune's trial id stays a tag
    parent = c.get_run(served_sweep["parent_run_id"])
    children = store.child_runs(c, parent)
    assert sorted(r.info.run_name for r in children) == ["dfq s0", "fp32 s0", "pfq s0", "static s0"]
    assert len({r.data.tags[store.TRIAL_TAG] for r in children}) == 4
    assert all(re.fullmatch(r"[0-9a-f]{5}_\d{5}", r.data.tags[store.TRIAL_TAG]) for r in children)
    # the parent's summary metrics, as the trial rows give them
    rows = runs.trial_rows(c, parent)[0]
    m = parent.data.metrics
    assert (m["sweep/trials"], m["sweep/finished"], m["sweep/errored"]) == (4, 4, 0)
    assert m["sweep/front_size"] == len(served_sweep["pareto"]) >= 1
    assert m["sweep/best_accuracy"] == max(r["accuracy"] for r in rows)
    # its note: the front as a table linking to each run, the views and the report artifact
    note = parent.data.tags["mlflow.note.content"]
    base = f"#/experiments/{exp.experiment_id}"
    for p in served_sweep["pareto"]:
        assert f"]({base}/runs/{p['run_id']}) | {p['accuracy']:.4f} |" in note
    assert f"[HTML report]({base}/runs/{parent.info.run_id}/artifacts/report/report.html)" in note
    assert mlflow_view.view_url("", exp.experiment_id, served_sweep["sweep_id"], charts=True) in note
    # the saved view the URL names: this sweep's trials, sorted by accuracy, the objectives and the front as columns
    view = json.loads(exp.tags["mlflow.sharedViewState." + mlflow_view.view_key(served_sweep["sweep_id"])])
    assert served_sweep["sweep_id"] in view["searchFilter"] and view["orderByKey"] == "metrics.`accuracy`"
    assert {"metrics.`accuracy`", "metrics.`train_tbitops`", "metrics.`cp_pct`", "params.`schedule.kind`",
            "tags.`pareto`"} <= set(view["selectedColumns"])
    # the scatter's cost axis is logarithmic: FP32 and the quantized trials each legible
    scatter = next(ch for ch in view["compareRunCharts"] if ch["type"] == "SCATTER")
    assert scatter["xaxis"]["key"] == "train_bitops_log10" and [ch["type"] for ch in view["compareRunCharts"]] == [
        "SCATTER", "PARALLEL", "LINE"]
    assert view["runsHiddenMode"] == "SHOW_ALL"  # every trial in the charts, not the first ten
    # `fractune sweeps` lists it from the server with the same summary, the best accuracy and its kind
    from tests.conftest import run_main

    code, out, listed = run_main("sweeps", "--tracking-uri", mlflow_server["uri"], "--json")
    (row,) = [s for s in listed["sweeps"] if s["sweep_id"] == served_sweep["sweep_id"]]
    assert code == 0 and served_sweep["sweep_id"] in out
    assert (row["kind"], row["status"], row["trials"], row["errored"], row["front_size"]) == (
        "sweep", "FINISHED", 4, 0, len(served_sweep["pareto"]))
    assert row["best"] == {"accuracy": m["sweep/best_accuracy"]} and row["parent_run_id"] == parent.info.run_id


def test_ui_brings_an_earlier_sweep_to_the_same_view(mlflow_server):
    """A sweep logged before any of this (no kind tag, no note, no view): `fractune ui --sweep` adds them."""
    import json

    from results import store
    from tests.conftest import hand_logged_sweep, run_main

    c = store.client(mlflow_server["uri"])
    exp_id, parent, child = hand_logged_sweep(c, "earlier_sweep", "earlier-1", {
        "accuracy": 0.5, "train_bitops": 1e9, "cum_cp": 6.25, "epoch": 1}, point='{"schedule.fw": 8}',
        run_name="0001-static")
    assert store.KIND_TAG not in c.get_experiment(exp_id).tags
    code, out, js = run_main("ui", "--tracking-uri", mlflow_server["uri"], "--sweep", "earlier_sweep", "--json")
    assert code == 0 and js["sweep_id"] == "earlier-1"
    assert js["url"] == (f"{mlflow_server['uri']}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
                         "&viewStateShareKey=fractune-earlier-1&compareRunsMode=TABLE")
    assert js["charts_url"] == js["url"].replace("TABLE", "CHART") and js["url"] in out
    exp = c.get_experiment(exp_id)
    assert exp.tags[store.KIND_TAG] == "custom_model_development" and "mlflow.sharedViewState.fractune-earlier-1" in exp.tags
    view = json.loads(exp.tags["mlflow.sharedViewState.fractune-earlier-1"])
    assert "metrics.`train_bitops`" in view["selectedColumns"]  # logged before the readable companion: the exact count
    run = c.get_run(parent.info.run_id)
    assert run.data.metrics["sweep/trials"] == 1 and run.data.metrics["sweep/best_accuracy"] == 0.5
    assert f"(#/experiments/{exp_id}/runs/{child.info.run_id})" in run.data.tags["mlflow.note.content"]


STAND_IN_SERVER = """
import http.server, os, sys, threading
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        threading.Timer(0.2, os._exit, (3,)).start()  # answered once: now stop, as a crashing server does
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_server_that_stops_by_itself_is_said_in_one_line(tmp_path, store_template, monkeypatch, capsys):
    """The server `fractune ui` serves stops while it serves (a stand-in answers /health once, then exits 3): one
    line names it, its exit code and its log, and the command exits 1, not with the server's code in silence."""
    from dashboards import ui
    from tests.conftest import copy_store, run_main

    uri = copy_store(store_template, tmp_path / "m.db")
    monkeypatch.setattr(ui, "server_command", lambda uri, host, port, quiet=False: [
        sys.executable, "-c", STAND_IN_SERVER, str(port)])
    code, out, _ = run_main("ui", "--tracking-uri", uri, "--port", "0")
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert code == 1 and "MLflow UI: http://127.0.0.1:" in out
    assert err == [f"fractune ui: error: the MLflow server stopped by itself (exit code 3); its log: "
                   f"{tmp_path / 'mlflow-ui.log'}"], err
