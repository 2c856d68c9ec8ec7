"""`fractune ui` really starts `mlflow server` on 127.0.0.1 with one worker (the session's server is started this
way; the ``mlflow_server`` fixture checks at the end of the session that Ctrl-C stops all of it)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path


def test_ui_serves_a_loopback_server_with_one_worker(mlflow_server):
    info = mlflow_server["info"]
    base = info["tracking_uri"]
    port = int(base.rsplit(":", 1)[1])
    assert base.startswith("http://127.0.0.1:") and info["url"] == base + "/" and info["started"] is True
    with urllib.request.urlopen(base + "/health", timeout=10) as resp:
        assert resp.status == 200
    argv = Path(f"/proc/{info['pid']}/cmdline").read_bytes().split(b"\0")
    for flag, value in ((b"--host", b"127.0.0.1"), (b"--workers", b"1"), (b"--port", str(port).encode())):
        assert argv[argv.index(flag) + 1] == value
    db = mlflow_server["folder"] / "mlflow.db"
    assert argv[argv.index(b"--backend-store-uri") + 1] == f"sqlite:///{db}".encode()
    assert argv[argv.index(b"--artifacts-destination") + 1] == str(db.parent / "mlartifacts").encode()


def test_a_busy_port_is_refused(tmp_path, capsys):
    from tests.conftest import run_main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = run_main("ui", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--port", str(port))[0]
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (f"fractune ui: error: --port: got {port}; already in use: give a "
                                                  "free port, or --port 0 for any free one")
