"""``fractune ui``: the MLflow UI for a sweep store, on 127.0.0.1, in the foreground until Ctrl-C.

For a sqlite store it starts ``mlflow server --backend-store-uri URI --host 127.0.0.1 --port N --workers 1``
(one worker: the default four compete for two cores), waits for ``/health`` and prints the URL (of the
sweep's runs page with ``--sweep``). The server runs in its own session and is stopped with its whole process
group on Ctrl-C or SIGTERM, so no uvicorn worker outlives the command. An http(s) URI is already a server:
the URL is printed and nothing is started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine.errors import ConfigError
from orchestrator import store
from orchestrator.output import emit_json, info

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def runs_url(base: str, experiment_id: str | None) -> str:
    """The runs table (the experiment's landing page in MLflow 3 is the GenAI overview)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs" if experiment_id else base.rstrip("/") + "/"


def experiment_id(uri: str, sweep: str | None) -> str | None:
    if not sweep:
        return None
    exp = store.client(uri).get_experiment_by_name(sweep)
    if exp is None:
        raise ConfigError.single("--sweep", sweep, f"no sweep (MLflow experiment) of that name in {store.redact(uri)}")
    return exp.experiment_id


def server_command(uri: str, host: str, port: int) -> list[str]:
    db = Path(uri[len("sqlite:///"):])
    # Artifacts uploaded through this server land next to the database, not in whatever cwd it started from.
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host, "--port", str(port),
            "--workers", "1", "--artifacts-destination", str(db.parent / "mlartifacts")]


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError.single("--tracking-uri", base, f"mlflow server exited with code {proc.returncode} "
                                     "(its log is above)")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise ConfigError.single("--tracking-uri", base, f"mlflow server not healthy after {timeout:.0f} s")


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace)
    except ProcessLookupError:
        pass


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def check_host(host: str) -> None:
    """``--host``: an IP address of this machine's interfaces or a name that resolves to one."""
    import ipaddress

    allowed = "allowed: 127.0.0.1 (default), ::1, localhost, or an address of one of this machine's interfaces"
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not host or any(c in host for c in " /[]@") or len(host) > 253:
        raise ConfigError.single("--host", host, allowed)
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        raise ConfigError.single("--host", host, f"does not resolve ({exc}); {allowed}") from None


def cmd_ui(args) -> int:
    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    problems = []
    for check in (lambda: store.check_uri(uri), lambda: check_host(args.host),
                  lambda: store.check_names(args.sweep) if args.sweep else None):
        try:
            check()
        except ConfigError as err:
            problems += err.problems
    if not 0 <= args.port <= 65535:
        problems.append(("--port", args.port, "allowed: 1..65535, or 0 for any free port"))
    if problems:
        raise ConfigError(problems)
    if uri.startswith(("http://", "https://")):
        store.preflight(uri)
        url = runs_url(store.without_credentials(uri), experiment_id(uri, args.sweep))
        print(f"MLflow UI (already served): {url}")
        if args.json:
            emit_json({"url": url, "tracking_uri": store.redact(uri), "started": False})
        return 0
    if not 0 <= args.port <= 65535:
        raise ConfigError.single("--port", args.port, "allowed: 1..65535, or 0 for any free port")
    if not uri.startswith("sqlite:///"):
        raise ConfigError.single("--tracking-uri", store.redact(uri), "allowed: sqlite:///PATH.db or http(s)://HOST:PORT")
    db = Path(uri[len("sqlite:///"):])
    missing = not db.exists()
    store.preflight(uri, mode="check")  # nothing is created before every check passed
    if missing and args.sweep:
        raise ConfigError.single("--sweep", args.sweep, f"no sweep of that name: {db} does not exist yet")
    if missing:
        info(f"note: {db} does not exist yet; the server starts on an empty store")
        store.preflight(uri)  # the checks passed: create the store's tables before the server reads it
    exp_id = experiment_id(uri, args.sweep)
    if args.host not in LOOPBACK:
        info(f"warning: binding {args.host}: the MLflow UI has no authentication; anyone who can reach it can "
             "read and delete runs")
    try:
        port = args.port or free_port("127.0.0.1" if args.host in LOOPBACK else args.host)
        busy = port_in_use("127.0.0.1" if args.host in LOOPBACK else args.host, port)
    except OSError as exc:
        raise ConfigError.single("--host", args.host, f"cannot bind there ({exc.strerror or exc}); allowed: an "
                                 "address of one of this machine's interfaces") from None
    if busy:
        raise ConfigError.single("--port", port, "already in use: give a free port, or --port 0 for any free one")
    # The server's own log goes to stderr: stdout carries only the URL (and the JSON line with --json).
    proc = subprocess.Popen(server_command(uri, args.host, port), stdout=sys.stderr, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the server like Ctrl-C does
    try:
        base = f"http://{'127.0.0.1' if args.host in LOOPBACK else args.host}:{port}"
        wait_healthy(base, proc)
        url = runs_url(base, exp_id)
        print(f"MLflow UI: {url}   (Ctrl-C stops it)", flush=True)
        if args.json:
            emit_json({"url": url, "tracking_uri": base, "backend_store_uri": uri, "pid": proc.pid, "started": True})
        return proc.wait()
    except KeyboardInterrupt:
        info("stopping the MLflow server")
        return 0
    finally:
        stop(proc)
        signal.signal(signal.SIGTERM, previous)
