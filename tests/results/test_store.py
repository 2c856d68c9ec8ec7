"""A tracking URI whose server answers ``/health`` but is no working MLflow server (another service behind the
port, a server whose store is broken) is refused before any work, in one line naming --tracking-uri; a server
that starts failing after that check gives one line and exit 1, never a traceback."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, hand_logged_sweep, run_main, self_signed_cert


def _serve(api_status: int, other_status: int, api_body: bytes = b'{"experiments": []}', tls=None):
    """A real HTTP server on 127.0.0.1: ``/health`` 200, the tracking API's experiment search ``api_status``
    (200: ``api_body``), every other path ``other_status`` with an HTML body."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's name)
            if self.path.startswith("/health"):
                status, body = 200, b"OK"
            elif "/experiments/search" in self.path:
                status, body = api_status, api_body if api_status == 200 else b"<html>down</html>"
            else:
                status, body = other_status, b"<html>\nnot here\n</html>"
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def serve():
    servers = []

    def start(api_status: int, other_status: int = 404, api_body: bytes = b'{"experiments": []}', tls=None) -> str:
        servers.append(_serve(api_status, other_status, api_body, tls))
        return f"{'https' if tls else 'http'}://127.0.0.1:{servers[-1].server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("api_status", [404, 500, 401])
def test_a_server_answering_health_but_not_the_tracking_api_is_refused_in_one_line(serve, api_status, capsys,
                                                                                    tmp_path):
    uri = serve(api_status)
    for args in (("pareto", "demo"), ("results", "demo", "--out", str(tmp_path / "r.md"))):
        code = run_main(*args, "--tracking-uri", uri)[0]
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1, err
        assert f"--tracking-uri: got '{uri}'; the server answers /health, but its tracking API answered HTTP " \
               f"{api_status}" in err[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("status", [404, 503])
def test_a_store_failing_after_its_check_gives_one_line_and_exit_1_at_once(serve, capsys, status, tmp_path):
    """503 is an answer MLflow's client retries, backing off for minutes by default: a reader fails at once."""
    uri = serve(200, other_status=status)  # the probe passes; reading the sweep fails
    started = time.monotonic()
    for args in (("pareto", "demo", "--json"), ("results", "demo", "--out", str(tmp_path / "r.md"))):
        code = run_main(*args, "--tracking-uri", uri)[0]
        err = capsys.readouterr().err.splitlines()
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(f"fractune {args[0]}: error: the tracking store failed: ") and str(status) in err[0]
    assert time.monotonic() - started < 30


def test_the_probe_takes_any_answer_mlflow_gives_and_refuses_any_other(serve):
    """MLflow leaves an empty list out of its JSON: a server where this user may read no experiment (MLflow's
    authentication filters them) answers the search with ``{}`` and is a working server; a body that is no such
    object is not."""
    from engine.errors import ConfigError
    from results import store_checks

    for body in (b'{}', b'{"experiments": [{"experiment_id": "0", "name": "Default"}]}'):
        store_checks.preflight(serve(200, api_body=body), mode="check")
    for body in (b'[]', b'{"experiments": 3}', b"<html>MLflow</html>", b"null"):
        uri = serve(200, api_body=body)
        with pytest.raises(ConfigError) as err:
            store_checks.preflight(uri, mode="check")
        assert "the server answers /health, but not as MLflow's tracking API does" in str(err.value), body


def test_an_https_server_is_checked_with_the_tls_settings_mlflow_uses(serve, tmp_path, monkeypatch):
    """MLflow's client trusts a server's certificate through MLFLOW_TRACKING_SERVER_CERT_PATH (or skips the check
    with MLFLOW_TRACKING_INSECURE_TLS): the preflight passes exactly where MLflow can connect, and a certificate
    file that cannot be loaded is named in one line."""
    import ssl

    from engine.errors import ConfigError
    from results import store_checks

    cert, key = self_signed_cert(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    uri = serve(200, tls=tls)
    for var in ("MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_CLIENT_CERT_PATH",
                "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="MLflow server unreachable .*certificate verify failed"):
        store_checks.preflight(uri, mode="check")  # no CA of this machine signed it, as MLflow would find too
    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert))
    store_checks.preflight(uri, mode="check")
    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="its TLS settings cannot be loaded .*MLFLOW_TRACKING_SERVER_CERT_PATH"):
        store_checks.preflight(uri, mode="check")
    monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # the bundle requests (so MLflow) reads by default
    store_checks.preflight(uri, mode="check")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="its TLS settings cannot be loaded .*REQUESTS_CA_BUNDLE"):
        store_checks.preflight(uri, mode="check")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
    store_checks.preflight(uri, mode="check")


def _sqlite_file(path, *tables: str):
    con = sqlite3.connect(path)
    for t in tables:
        con.execute(f"CREATE TABLE {t} (x)")
    con.commit()
    con.close()
    return path


def test_a_sqlite_file_that_is_no_mlflow_store_is_refused_and_left_as_it_was(tmp_path, capsys):
    """MLflow writes its schema into any sqlite file it is given: a user's own database, or an empty file."""
    foreign = _sqlite_file(tmp_path / "people.db", "people")
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {model: {name: tiny}, data: {dataset: digits}}\n")
    cases = [(foreign, ("sweeps",), "a database of other tables (people)"),
             (foreign, ("pareto", "demo"), "a database of other tables (people)"),
             (foreign, ("sweep", str(spec), "--storage", str(tmp_path / "runs")), "a database of other tables"),
             (empty, ("results", "demo", "--out", str(tmp_path / "r.md")), "an empty database"),
             (empty, ("sweeps", "--json"), "an empty database")]
    for db, args, what in cases:
        before = db.read_bytes()
        code = run_main(*args, "--tracking-uri", f"sqlite:///{db}")[0]
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1 and f"{db} is {what}" in err[0] and "not an MLflow tracking store" in err[0], err
        assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "people.db", "s.yaml"]


@contextlib.contextmanager
def _read_only_copy(source: Path, folder: Path):
    """The files of the folder ``source`` copied to ``folder``, a tmpfs mounted read-only (root ignores file
    modes)."""
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        for f in source.iterdir():
            shutil.copy(f, folder / f.name)
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)  # lazily: the client may hold it open


@pytest.fixture
def read_only_store(tmp_path, store_template):
    """A copy of a real store on a file system mounted read-only."""
    from results import store

    written = tmp_path / "w" / "mlflow.db"
    written.parent.mkdir()
    shutil.copy(store_template, written)
    hand_logged_sweep(store.client(f"sqlite:///{written}"), "demo", "demo-20261129-000000",
                      {"accuracy": 0.8, "train_bitops": 1e9})
    with _read_only_copy(written.parent, tmp_path / "ro") as folder:
        yield f"sqlite:///{folder / 'mlflow.db'}"


def test_a_read_only_store_is_refused_before_any_work_by_whatever_writes_to_it(read_only_store, tmp_path, capsys):
    """A sweep on it once ran every trial untracked; report left its folder behind, then failed with tracebacks.
    Readers that only read still read it; --no-log reads it for the pages."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {model: {name: tiny}, data: {dataset: digits}}\n")
    for args, allowed in [(("sweep", str(spec), "--storage", str(tmp_path / "runs")), "a writable store"),
                          (("report", "demo", "--out", str(tmp_path / "rep")), "a writable store or --no-log"),
                          (("results", "demo", "--out", str(tmp_path / "r.md")), "a writable store or --no-log")]:
        code = run_main(*args, "--tracking-uri", read_only_store)[0]
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1 and "cannot be written (Read-only file system)" in err[0], err
        assert err[0].endswith(f"allowed: {allowed}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro", "s.yaml", "w"]
    code, _, front = run_main("pareto", "demo", "--tracking-uri", read_only_store, "--json")
    assert code == 0 and front["sweep_id"] == "demo-20261129-000000", capsys.readouterr().err
    code = run_main("results", "demo", "--out", str(tmp_path / "r.md"), "--no-log", "--tracking-uri", read_only_store)[0]
    assert code == 0 and (tmp_path / "r.md").is_file(), capsys.readouterr().err


_CUT_OFF_WRITER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size = 2")  # the transaction's pages reach the file before it commits
con.execute("BEGIN")
con.execute("CREATE TABLE scratch (x, y)")
con.executemany("INSERT INTO scratch VALUES (?, ?)", ((i, "x" * 200) for i in range(20000)))
print("written", flush=True)
time.sleep(600)
"""


def _cut_off_mid_write(db) -> None:
    """A real sqlite writer killed inside its transaction (as a sweep's driver may be while it logs): its journal
    stays beside the file, which holds pages of the transaction until someone rolls it back."""
    proc = subprocess.Popen([sys.executable, "-c", _CUT_OFF_WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "written\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert db.with_name(db.name + "-journal").stat().st_size > 0


def test_a_store_left_mid_write_by_a_killed_process_reads_as_it_was_last_committed(tmp_path, store_template, capsys):
    """A read-only connection cannot roll back the transaction a killed writer left; the readers' check used to
    refuse such a store as no sqlite database until a writer opened it."""
    from results import store

    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    hand_logged_sweep(store.client(f"sqlite:///{db}"), "demo", "demo-20261129-000000",
                      {"accuracy": 0.8, "train_bitops": 1e9})
    _cut_off_mid_write(db)
    code, _, listed = run_main("sweeps", "--tracking-uri", f"sqlite:///{db}", "--json")
    assert code == 0 and [s["sweep_id"] for s in listed["sweeps"]] == ["demo-20261129-000000"], capsys.readouterr()
    assert not db.with_name("mlflow.db-journal").exists()  # rolled back: the killed transaction's table is gone
    con = sqlite3.connect(db)
    assert "scratch" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    con.close()


def test_a_store_left_mid_write_on_a_read_only_file_system_is_named_so(tmp_path, store_template, capsys):
    written = tmp_path / "w" / "mlflow.db"
    written.parent.mkdir()
    shutil.copy(store_template, written)
    _cut_off_mid_write(written)
    with _read_only_copy(written.parent, tmp_path / "ro") as folder:
        code = run_main("sweeps", "--tracking-uri", f"sqlite:///{folder / 'mlflow.db'}")[0]
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and "holds a transaction its writer never ended" in err[0], err
    assert err[0].endswith("allowed: a store this user may write"), err


def test_a_store_that_fails_a_write_after_the_checks_gives_one_line_not_mlflows_traceback(
        read_only_store, tmp_path, capsys, monkeypatch):
    from results import store_checks

    monkeypatch.setattr(store_checks, "check_writable", lambda *a, **k: None)  # as if it turned read-only after
    code = run_main("report", "demo", "--out", str(tmp_path / "rep"), "--tracking-uri", read_only_store)[0]
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 1 and "attempt to write a readonly database" in err[0], err


def test_a_sweep_id_the_sweep_does_not_have_is_named_as_the_flag(tmp_path, store_template, capsys):
    from results import store

    shutil.copy(store_template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    hand_logged_sweep(store.client(uri), "demo", "demo-20261129-000000", {"accuracy": 0.8, "train_bitops": 1e9})
    for args, line in [(("demo", "--sweep-id", "demo-20990101-000000"), "--sweep-id: got 'demo-20990101-000000'; "
                        "no run of sweep 'demo' with that id"),
                       (("nosuch",), "sweep: got 'nosuch'; no sweep of that name")]:
        code = run_main("pareto", *args, "--tracking-uri", uri)[0]
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1 and line in err[0], err


def test_a_sweep_whose_experiment_was_renamed_opens_by_its_sweep_id(tmp_path, store_template, capsys):
    """MLflow's UI renames an experiment: the sweep id ``fractune sweeps`` lists still opens the sweep."""
    from results import store

    shutil.copy(store_template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = store.client(uri)
    exp_id, _, child = hand_logged_sweep(c, "demo", "demo-20261129-000000",
                                         {"accuracy": 0.8, "train_bitops": 1e9, "epoch": 1})
    c.rename_experiment(exp_id, "demo (kept)")
    code, _, out = run_main("pareto", "demo", "--sweep-id", "demo-20261129-000000", "--tracking-uri", uri, "--json")
    assert code == 0 and out["experiment_id"] == exp_id and out["trials"] == 1
    assert [p["run_id"] for p in out["pareto"]] == [child.info.run_id]
    code = run_main("pareto", "other", "--sweep-id", "demo-20261129-000000", "--tracking-uri", uri)[0]
    assert code == 2 and "sweep: got 'other'; no sweep of that name" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="drops root's file-access capabilities")
def test_a_store_this_user_may_not_read_is_named_so(tmp_path, store_template):
    """A store file of mode 000: the line says it cannot be read, not that it is no sqlite database. Run without
    root's capability to read any file (``setpriv``), as a user's process is."""
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    db.chmod(0)
    r = subprocess.run(["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                        "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m", "orchestrator.cli",
                        "sweeps", "--tracking-uri", f"sqlite:///{db}"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"fractune sweeps: error: --tracking-uri: got 'sqlite:///{db}'; cannot read {db} (Permission denied); "
        "allowed: a store this user may read"], r.stderr
