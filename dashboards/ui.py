"""``fractune ui``: the MLflow UI for a sweep store, on 127.0.0.1, in the foreground until Ctrl-C.

For a sqlite store it starts ``mlflow server --backend-store-uri URI --host 127.0.0.1 --port N --workers 1``
(one worker: the default four compete for two cores; MLflow's GenAI job runner off unless
``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` says otherwise), waits for ``/health`` and prints the URL. With
``--sweep`` that is the sweep's view (``dashboards.mlflow_view``: its trials sorted by accuracy, or a language
model's test perplexity, with the swept values, objectives, cp and the Pareto tag as columns), and the charts
view under it; the view, the parent run's summary and note are (re)written first, so sweeps logged before they
existed get them too. Experiments of
fractune sweeps get MLflow's model-training kind tag; the printed URLs name the UI's model-training mode
(``workflowType=machine_learning``), since MLflow 3.17's UI picks the mode from its sidebar switch, not from the
tag: an experiment opened from MLflow's own list shows its runs once the browser's switch is on "Model
training" (docs/usage.md).

The server's own log (deprecation warnings, one access line per request) goes to ``mlflow-ui.log`` beside the
database, and its tail to stderr if the server fails; ``--verbose`` sends it to stderr as it comes. The server
runs in its own session and is stopped with its whole process group on Ctrl-C or SIGTERM, so no uvicorn worker
outlives the command. An http(s) URI is already a server: the same tags are written, the URL is printed and
nothing is started.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine.errors import ConfigError, FractuneError
from results import store, store_checks
from results.output import emit_json, info

LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOG_FILE = "mlflow-ui.log"  # the server's own log, beside the database (stderr with --verbose)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Whether the port is taken there: binding it fails as in use (what the server would meet), or a server
    answers on it. Raises ``OSError`` where ``host`` is no address of this machine (nothing can bind there;
    connecting to such an address tells nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: a closed port's TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def runs_url(base: str, experiment_id: str | None) -> str:
    """The runs table, in the UI's model-training mode (else MLflow 3.17 opens its GenAI mode)."""
    from dashboards.mlflow_view import TRAINING_MODE

    where = f"experiments/{experiment_id}/runs" if experiment_id else "experiments"
    return f"{base.rstrip('/')}/#/{where}?{TRAINING_MODE}"


def experiment_id(uri: str, sweep: str | None) -> str | None:
    if not sweep:
        return None
    exp = store.client(uri).get_experiment_by_name(sweep)
    if exp is None:
        raise ConfigError.single("--sweep", sweep, f"no sweep (MLflow experiment) of that name in {store.redact(uri)}")
    return exp.experiment_id


def prepare(uri: str, sweep: str | None) -> dict:
    """Before the UI opens: fractune's experiments in model-training mode; with ``sweep``, its latest sweep's
    view, summary metrics and note (re)written. Returns the experiment id and the sweep id (None without)."""
    from results import runs

    c = store.client(uri)
    exp_id = experiment_id(uri, sweep)
    if exp_id is not None:
        exps = [c.get_experiment(exp_id)]
    else:  # every experiment holding a fractune sweep
        exps = [e for e in c.search_experiments(max_results=1000)
                if c.search_runs([e.experiment_id], store.PARENTS_FILTER, max_results=1)]
    from dashboards.mlflow_view import VIEW_TAG, publish_sweep, view_key

    try:  # writes: a store that refuses them (a read-only server) still gets its UI, as the sweep left it
        for exp in exps:
            store.mark_training(c, exp)
        if exp_id is None or store.sweep_parent(c, sweep) is None:  # an experiment without a fractune sweep
            return {"experiment_id": exp_id, "sweep_id": None}
        data = runs.load(uri, sweep)
        publish_sweep(data)
        return {"experiment_id": exp_id, "sweep_id": data.sweep_id}
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001  mlflow raises many types; the UI opens anyway
        info(f"warning: could not update the sweep's view in MLflow ({store.one_line_error(exc)[:200]})")
        parent = store.sweep_parent(c, sweep) if exp_id is not None else None
        sweep_id = parent.data.tags.get(store.SWEEP_TAG) if parent is not None else None
        if sweep_id and VIEW_TAG + view_key(sweep_id) not in c.get_experiment(exp_id).tags:
            sweep_id = None  # no view to open: the runs table
        return {"experiment_id": exp_id, "sweep_id": sweep_id}


def urls(base: str, prepared: dict) -> dict:
    from dashboards.mlflow_view import view_url

    exp_id, sweep_id = prepared["experiment_id"], prepared["sweep_id"]
    if sweep_id is None:
        return {"url": runs_url(base, exp_id)}
    return {"url": view_url(base, exp_id, sweep_id), "charts_url": view_url(base, exp_id, sweep_id, charts=True),
            "sweep_id": sweep_id}


def _say(found: dict, prefix: str) -> None:
    print(f"{prefix}: {found['url']}", flush=True)
    if "charts_url" in found:
        print(f"  charts of every trial: {found['charts_url']}", flush=True)


def server_command(uri: str, host: str, port: int, quiet: bool = False) -> list[str]:
    db = Path(uri[len("sqlite:///"):])
    # Artifacts uploaded through this server land next to the database, not in whatever cwd it started from.
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host, "--port", str(port),
           "--workers", "1", "--artifacts-destination", str(db.parent / "mlartifacts")]
    if quiet:  # no access line per request (the UI makes dozens a page)
        cmd += ["--uvicorn-opts", "--no-access-log --log-level warning"]
    return cmd


def server_env(verbose: bool = False) -> dict:
    """The server's environment. MLflow 3's job execution (a job runner and seven huey consumers, each a Python
    process importing MLflow, for its GenAI scorers and trace jobs) is off unless the user's environment turns it
    on: fractune's runs never use it, and starting those processes costs CPU at every server start, which a
    two-core machine feels."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
                                                                               "false")}
    if not verbose:
        env["PYTHONWARNINGS"] = "ignore"
    return env


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 120.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            where = "its log is above"
            if log is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-20:] if log.is_file() else []
                sys.stderr.write("".join(f"  {line}\n" for line in tail))
                where = f"the end of its log {log} is above"
            raise ConfigError.single("--tracking-uri", base, f"mlflow server exited with code {proc.returncode} "
                                     f"({where})")
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


class ServerStopped(FractuneError):
    """The server `fractune ui` started ended while it served: the machine's trouble, not the user's input."""

    exit_code = 1


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


def check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError.single("--port", port, "allowed: 1..65535, or 0 for any free port")


def cmd_ui(args) -> int:
    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    ConfigError.check_all(lambda: store_checks.check_uri(uri), lambda: check_host(args.host),
                          lambda: store.check_names(args.sweep, name_field="--sweep") if args.sweep else None, lambda: check_port(args.port))
    if uri.startswith(("http://", "https://")):
        store_checks.preflight(uri)
        found = urls(store.without_credentials(uri), prepare(uri, args.sweep))
        _say(found, "MLflow UI (already served)")
        if args.json:
            emit_json({**found, "tracking_uri": store.redact(uri), "started": False})
        return 0
    if not uri.startswith("sqlite:///"):
        raise ConfigError.single("--tracking-uri", store.redact(uri), "allowed: sqlite:///PATH.db or http(s)://HOST:PORT")
    db = Path(uri[len("sqlite:///"):])
    missing = not db.exists()
    store_checks.preflight(uri, mode="check")  # nothing is created before every check passed
    if missing and args.sweep:
        raise ConfigError.single("--sweep", args.sweep, f"no sweep of that name: {db} does not exist yet")
    probe_host = "127.0.0.1" if args.host in LOOPBACK else args.host
    try:
        port = args.port or free_port(probe_host)
        busy = port_in_use(probe_host, port)
    except OSError as exc:
        raise ConfigError.single("--host", args.host, f"cannot bind there ({exc.strerror or exc}); allowed: an "
                                 "address of one of this machine's interfaces") from None
    if busy:
        raise ConfigError.single("--port", port, "already in use: give a free port, or --port 0 for any free one")
    if missing:
        info(f"note: {db} does not exist yet; the server starts on an empty store")
        store_checks.preflight(uri)  # the checks passed: create the store's tables before the server reads it
    prepared = prepare(uri, args.sweep)
    if args.host not in LOOPBACK:  # said once every check passed: a refused start prints only its error
        info(f"warning: binding {args.host}: the MLflow UI has no authentication; anyone who can reach it can "
             "read and delete runs")
    # stdout carries only the URLs (and the JSON line with --json); the server's own log goes to a file, or to
    # stderr with --verbose
    log = None if args.verbose else db.parent / LOG_FILE
    sink = sys.stderr if log is None else open(log, "w")  # noqa: SIM115  closed below
    env = server_env(verbose=args.verbose)
    # The server runs under a guard that stops it when this process is gone, even by SIGKILL: its stdin is a
    # pipe whose write end only this process holds (dashboards/server_guard.py)
    guard = [sys.executable, str(Path(__file__).with_name("server_guard.py"))]
    try:
        proc = subprocess.Popen(guard + server_command(uri, args.host, port, quiet=not args.verbose),
                                stdin=subprocess.PIPE, stdout=sink, stderr=sink, start_new_session=True, env=env)
    finally:
        if sink is not sys.stderr:
            sink.close()  # the child holds its own descriptor
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the server like Ctrl-C does
    # Ctrl-C stops it even where the shell started us with SIGINT ignored (a script's background job)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        base = f"http://{'127.0.0.1' if args.host in LOOPBACK else args.host}:{port}"
        wait_healthy(base, proc, log=log)
        found = urls(base, prepared)
        _say(found, "MLflow UI")
        print("(Ctrl-C stops it" + (f"; the server's log: {log})" if log else ")"), file=sys.stderr, flush=True)
        if args.json:
            emit_json({**found, "tracking_uri": base, "backend_store_uri": uri, "pid": proc.pid, "started": True,
                       "log": str(log) if log else None})
        code = proc.wait()  # only Ctrl-C or `kill` end this wait on purpose: the server stopped by itself
        where = f"its log: {log}" if log else "its log is above"
        raise ServerStopped(f"the MLflow server stopped by itself (exit code {code}); {where}")
    except KeyboardInterrupt:
        info("stopping the MLflow server")
        return 0
    finally:
        stop(proc)
        proc.stdin.close()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def ui_command(uri: str, sweep: str | None = None, view: tuple[str, str] | None = None) -> str:
    """How to look at the sweep: `fractune ui` for a sqlite store; a tracking server's URL of the sweep's view
    (``view``: experiment id, sweep id) or its home page."""
    if uri.startswith("http"):
        if view and "***@" not in uri:
            from dashboards.mlflow_view import view_url

            return f"open {view_url(uri, *view)}"
        return f"open {uri}"
    return f"fractune ui --tracking-uri {uri}" + (f" --sweep {sweep}" if sweep else "")
