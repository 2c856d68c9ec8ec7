"""Shared fixtures. Real components, started once per test session where tests allow: one local Ray
(``ray_local``), one MLflow server started by `fractune ui` (``mlflow_server``) holding one small real sweep
logged over HTTP (``served_sweep``: the report, UI, tracker and browser tests read it), one headless Chromium
(``browser``)."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The suite trains tiny models on small batches: one torch/OpenMP thread per process (this one and the CLI
# subprocesses; a trial's threads follow its CPUs). Extra threads gain nothing there and, on two shared cores,
# spin against each other, so a tiny-model epoch runs far slower with two threads than with one.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Ray Train starts a preemption watcher (a process of its own) per worker group; the suite's Rays run on no
# preemptible node, so no Ray the suite starts (in this process or a CLI subprocess) starts one.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1800,1100")


# tests that mount tmpfs file systems (a full disk, a read-only one, a folder hidden in a mount namespace)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts tmpfs file systems "
                                "(mount, unshare --mount); run the suite as root to include it")


def _files_matching(pattern: str) -> set[str]:
    here = Path(__file__).parent
    return {str(f.relative_to(ROOT)) for f in here.rglob("test_*.py") if re.search(pattern, f.read_text())}


def _scope(nodeid: str) -> str:
    """The unit of work `make test` (``pytest -n 2``) hands to one worker: every test of the files that use the
    session's MLflow server (and so the sweep served from it and the browser) is one unit, so that server, its
    sweep and the browser start once per run; the tests of a file with a module-scoped fixture of its own are one
    unit too (built once); every other test is a unit of its own."""
    path = nodeid.split("::", 1)[0]
    return "mlflow_server" if path in _SHARED else path if path in _OWN_FIXTURE else nodeid


_SHARED = _files_matching(r"\b(mlflow_server|served_sweep)\b")  # the session server, directly or not
_OWN_FIXTURE = _files_matching(r"scope=\"(module|session)\"")  # a file's own shared fixture: built once


def pytest_collection_modifyitems(config, items):
    """The units holding a ``slow`` test first (stably, so a unit stays together and in order): the workers start
    on the long tests and the quick ones fill in at the end, instead of one worker finishing a long test alone."""
    slow = {_scope(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _scope(item.nodeid) not in slow)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units by ``_scope``; xdist hands them out largest first (``--loadscope-reorder``), then in collection
    order. (A scheduler of our own: xdist 3.8's ``--dist loadgroup`` marks node ids in a way pytest 9 no longer
    reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedServerScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return SharedServerScheduling(config, log)


def pytest_unconfigure(config):
    """The session's process ends next: its last garbage collections skip what the tests left, as the ``fractune``
    process's do (orchestrator.cli.main.run)."""
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that used a fixture with a ``diagnose`` callable (the two-node cluster) gets its output as
    a report section: which processes died and what they logged, in the CI log that shows the failure."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, dict) and callable(value.get("diagnose")):
                try:
                    report.sections.append((f"{name}: processes and logs", value["diagnose"]()))
                except Exception as err:  # the diagnosis must not hide the failure
                    report.sections.append((f"{name}: diagnosis failed", repr(err)))


@pytest.fixture
def run_cli(tmp_path):
    """Run the real ``fractune`` entry point in a subprocess; returns CompletedProcess."""

    def run(*args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None):
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=full_env, cwd=cwd or ROOT)

    return run


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1 (PEM files in ``folder``): a server no default CA trusts."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return folder / "cert.pem", folder / "key.pem"


def run_main(*args: str) -> tuple[int, str, dict | None]:
    """`fractune ARGS` in this process (on the session's Ray): exit code, stdout, the JSON line if any."""
    from orchestrator.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(args))
    out = buf.getvalue()
    lines = out.strip().splitlines()
    return code, out, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray (2 CPUs) started once for every test that runs sweeps, configured as fractune's own local
    Ray (orchestrator/sweep/ray_cluster.py ``init_ray``: no metrics exporters, no idle workers started ahead)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ray Train's controller looks at its workers every 2 s by default, which a run of a few one-second epochs
    # spends mostly waiting on; the processes of this Ray inherit a shorter interval
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    import ray

    from orchestrator.sweep.ray_cluster import RAY_SYSTEM_CONFIG

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 _system_config=RAY_SYSTEM_CONFIG)
    yield ray
    ray.shutdown()


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


SWEEP = {
    "name": "served_sweep",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 2}},
    "parameters": {"schedule": {"grid": [
        {"kind": "fp32"},
        {"kind": "static", "fw": 8, "bw": 8},
        {"kind": "pfq", "mode": "auto", "fw": [3, 4, 6, 8], "bw": [6, 6, 8, 8], "epsilon": 0.3, "alpha": 0.5,
         "eval_every": 2},
        {"kind": "dfq", "options": "paper", "target_cp": 3.0, "execution": "routed"}]}},
    "budget": {"max_concurrent_trials": 1},  # one trial process for the four trials
    "resources": {"cpu": 1},
}


def hand_logged_sweep(c, name: str, sweep_id: str, metrics: dict[str, float], point: str = "{}",
                      run_name: str = "static s0"):
    """A sweep of one trial written straight into a store through the MLflow client (as an older fractune, or
    another tool, left it): its experiment id, parent run and ended trial run."""
    from mlflow.entities import Metric

    from results import store

    exp_id = c.create_experiment(name)
    parent = c.create_run(exp_id, run_name=sweep_id, tags={"fractune.kind": "sweep", store.SWEEP_TAG: sweep_id})
    child = c.create_run(exp_id, run_name=run_name, tags={
        store.PARENT_TAG: parent.info.run_id, "fractune.kind": "trial", store.SWEEP_TAG: sweep_id,
        store.TRIAL_TAG: "0001", store.PLANNED_TAG: "1", store.POINT_TAG: point})
    c.log_batch(child.info.run_id, metrics=[Metric(k, v, 0, 1) for k, v in metrics.items()])
    c.set_terminated(child.info.run_id)
    return exp_id, parent, child


def snapshot(folder) -> dict:
    """What a refused command must leave as it was under ``folder``: every entry's name; files also by size,
    mtime and content."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st_ = p.lstat()
        rel = str(p.relative_to(folder))
        if p.is_file():
            out[rel] = (st_.st_size, st_.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            out[rel] = "entry"
    return out


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
def store_template(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store, created once per session. MLflow migrates a new database through its whole
    schema history (seconds of CPU in every process that opens it first); tests that only need an empty store
    copy this one. Creating a store from nothing stays covered by `fractune ablate`'s test, the full-disk test and
    the demo."""
    from results import store_checks

    path = tmp_path_factory.mktemp("store_template") / "mlflow.db"
    store_checks.preflight(f"sqlite:///{path}")
    return path


def copy_store(template: Path, dest: Path) -> str:
    """A copy of the empty session store at ``dest``; its sqlite URI."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, dest)
    return f"sqlite:///{dest}"


@pytest.fixture
def sqlite_uri(tmp_path, store_template):
    """A fresh, empty sqlite store (a copy of the session's template)."""
    return copy_store(store_template, tmp_path / "mlflow.db")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, store_template):
    """`fractune ui` serving a sqlite store on 127.0.0.1; at the end, Ctrl-C must stop all of it."""
    folder = tmp_path_factory.mktemp("mlflow_server")
    copy_store(store_template, folder / "mlflow.db")
    proc, info = start_ui(str(folder / "mlflow.db"))
    yield {"uri": info["tracking_uri"], "folder": folder, "info": info}
    code = stop_ui(proc)
    port, pid = int(info["tracking_uri"].rsplit(":", 1)[1]), info["pid"]
    server_gone = not Path(f"/proc/{pid}").exists() or b"Z" in Path(f"/proc/{pid}/stat").read_bytes()[:80]
    if not server_gone:  # leave no server behind for the next run, whatever the verdict
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    assert code == 0 and not listening(port) and server_gone, f"fractune ui did not stop cleanly (exit {code})"


@pytest.fixture(scope="session")
def served_sweep(ray_local, mlflow_server, tmp_path_factory):
    """`fractune sweep --json` (in this process, on the session's Ray) into the server; its JSON line."""
    folder = tmp_path_factory.mktemp("served_sweep")
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # with --json the lines for people are on stderr
        code, out, result = run_main("sweep", str(spec), "--tracking-uri", mlflow_server["uri"], "--storage",
                                     str(folder / "runs"), "--report-dir", str(folder / "report"), "--quiet", "--json")
    assert code == 0, err.getvalue()[-3000:]
    assert len(out.strip().splitlines()) == 1, out  # the JSON object alone
    return {**result, "stdout": out, "stderr": err.getvalue(), "folder": folder}


@pytest.fixture
def browser(chromium):
    """The session's Chromium, left on a blank page after the test: an MLflow page left open polls its server
    for the rest of the session, spending CPU in the browser and the server."""
    yield chromium
    chromium.get("about:blank")


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (Debian's chromium + chromium-driver) driven by Selenium, one per session."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(f"headless browser missing ({', '.join(missing)}): run `make browser` (apt-get install -y "
                    "chromium chromium-driver) or `make test`, which installs it", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="fractune-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (*BROWSER_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
