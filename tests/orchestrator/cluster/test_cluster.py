"""Cluster execution against a real two-node Ray cluster started on this machine (issue 7).

The head (`ray start --head`, dashboard and Jobs API on 127.0.0.1) and a second node (`ray start --address`,
its own CPU and a GPU it declares, which no process can use: a resource this machine lacks) each run with `--block` in their own session, so the test stops exactly
what it started (never `ray stop`, which would also stop the suite's own local Ray). The second node runs in
a private mount namespace where one folder, ``blind/``, is covered by a tmpfs: a storage folder that node
cannot see, as on a real cluster without a shared filesystem. Token authentication is on, with the token in
``RAY_AUTH_TOKEN`` only; it must appear in no output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from results import store
from tests.conftest import ROOT, needs_root
from tests.orchestrator.procs import Pace, kill_session, wait_for

BIN = Path(sys.executable).parent
TOKEN = "ftk" + "5e7a" * 10
SPEC = {"name": "cluster_sweep", "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64},
                                     "optim": {"epochs": 2}},
        # two one-CPU trials at once on two one-CPU nodes: one runs on each node
        "parameters": {"schedule": {"grid": [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8}]}},
        "seeds": [0], "budget": {"max_concurrent_trials": 2}, "resources": {"cpu": 1}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER", "MLFLOW_"))}
    env.update({"PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)})
    env.update(extra)
    return env


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    """GET with the cluster's token: (HTTP status, body)."""
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=timeout) as r:  # noqa: S310 (loopback test server)
        return r.status, r.read()


def _http_ok(url: str) -> bool:
    try:
        return _get(url, timeout=2)[0] == 200
    except OSError:
        return False


def _cli(*args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=cwd)


def _alive_nodes(dashboard: str) -> set[str]:
    """The ids of the cluster's alive nodes, from its dashboard's state API: one GET, where ``ray.nodes()`` takes a
    Python process that imports Ray and joins the cluster."""
    try:
        body = json.loads(_get(f"{dashboard}/api/v0/nodes?limit=100", timeout=10)[1])
    except (OSError, ValueError):  # not serving yet
        return set()
    if body.get("result") is not True:  # the state API not ready yet
        return set()
    return {n["node_id"] for n in body["data"]["result"]["result"] if n["state"] == "ALIVE"}


def _ray(code: str, gcs: str) -> str:
    out = subprocess.run([sys.executable, "-c", f"import json, ray; ray.init(address={gcs!r}, "
                          f"logging_level='ERROR'); {code}"], capture_output=True, text=True, timeout=120,
                         env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(line[:300] for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"({err.strerror})"


class Cluster:
    """A head and a second node, each ``ray start --block`` in its own session, own temp dir and own ports.

    ``ray start --block`` ends its whole node when any one of its processes exits unexpectedly; ``diagnose()``
    says which did and why (the nodes' process-exit logs and log tails), and a failing test's report carries it
    (tests/conftest.py). ``ensure()`` starts a fresh cluster if the last one has died, so one crash fails one
    test, not every test after it."""

    # lenient GCS health checks: on two loaded cores a node can miss a few 3 s checks without being dead
    RAY_ENV = {"RAY_health_check_failure_threshold": "20", "RAY_health_check_timeout_ms": "30000"}

    def __init__(self, folder: Path, tracking: str):
        self.folder, self.tracking = folder, tracking
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        self.tmps: list[str] = []
        self.info: dict = {}
        self.starts = 0

    def _start(self, cmd: list[str], name: str) -> None:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115
        self.logs.append(log)
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(**self.RAY_ENV),
                                           cwd=self.folder, start_new_session=True))

    @staticmethod
    def _own_ports() -> str:
        # fixed defaults (agent HTTP 52365, metrics, runtime-env agent, Ray client 10001) would clash with the
        # suite's own local Ray and between the two nodes: every node gets free ports of its own
        return (f"--dashboard-agent-listen-port={_free_port()} --dashboard-agent-grpc-port={_free_port()} "
                f"--runtime-env-agent-port={_free_port()} --metrics-export-port={_free_port()} "
                "--object-store-memory=200000000")  # two tiny trials: not 30 % of the machine's memory per node

    def start(self) -> dict:
        self.starts += 1
        folder = self.folder
        gcs_port, dash_port = _free_port(), _free_port()
        gcs, dashboard = f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash_port}"
        # the second node keeps its own temp dir, as a separate machine would (a shared one lets its runtime-env
        # agent delete the job's unpacked working dir under the head's driver); short, for Unix socket paths
        node_tmp = tempfile.mkdtemp(prefix="rn", dir="/tmp")
        # the head's temp dir is its own too: `ray start --head` records the cluster there (ray_current_cluster),
        # where no address-less `ray.init()` of the rest of the suite (or of this machine's user) will find it
        head_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp")
        self.tmps = [head_tmp, node_tmp]
        self._start([str(BIN / "ray"), "start", "--head", *self._own_ports().split(),
                     f"--ray-client-server-port={_free_port()}", "--block", f"--port={gcs_port}",
                     "--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=true",
                     "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}", f"--temp-dir={head_tmp}",
                     "--disable-usage-stats"], "head")
        wait_for(lambda: _http_ok(f"{dashboard}/api/version"), timeout=120, what="ray head dashboard")
        worker = (f"mount -t tmpfs tmpfs {folder / 'blind'} && exec {BIN / 'ray'} start --block --address={gcs} "
                  f"--node-ip-address=127.0.0.1 --num-cpus=1 --num-gpus=1 --temp-dir={node_tmp} {self._own_ports()} "
                  "--disable-usage-stats")
        self._start(["unshare", "--mount", "--propagation", "private", "sh", "-c", worker], "worker")
        wait_for(lambda: len(_alive_nodes(dashboard)) == 2, timeout=120, what="two alive Ray nodes")
        spec = folder / "spec.yaml"
        spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
        self.info.update({"folder": folder, "gcs": gcs, "dashboard": dashboard, "spec": spec,
                          "tracking": self.tracking, "diagnose": self.diagnose})
        return self.info

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def ensure(self) -> None:
        if not self.alive():
            self.stop()
            self.start()

    def diagnose(self) -> str:
        """Which node processes are alive, and the tails of what the nodes logged."""
        out = [f"cluster start #{self.starts}; " + ", ".join(
            f"{name}: {'alive' if p.poll() is None else f'exited {p.returncode}'}"
            for name, p in zip(("head", "worker"), self.procs))]
        for name in ("head", "worker"):
            out += [f"--- {name}.log", _tail(self.folder / f"{name}.log")]
        for tmp in self.tmps:
            logs = Path(tmp) / "session_latest" / "logs"
            for log in ("ray_process_exit.log", "gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err",
                        "dashboard.log", "dashboard.err"):
                if (logs / log).exists() and (logs / log).stat().st_size:
                    out += [f"--- {logs / log}", _tail(logs / log, 8)]
        with contextlib.suppress(OSError):
            out.append("--- " + next(line for line in Path("/proc/meminfo").read_text().splitlines()
                                     if line.startswith("MemAvailable")))
        return "\n".join(out)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            kill_session(proc.pid)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        survivors = [p.pid for p in self.procs if p.poll() is None]
        for log in self.logs:
            log.close()
        self.procs, self.logs = [], []
        for tmp in self.tmps:
            shutil.rmtree(tmp, ignore_errors=True)
        assert not survivors, f"cluster processes survived: {survivors}"


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory, mlflow_server):
    folder = tmp_path_factory.mktemp("cluster")
    (folder / "shared").mkdir()
    (folder / "blind").mkdir()
    c = Cluster(folder, mlflow_server["uri"])
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster(_cluster):
    """A head and a second node (own temp dirs and ports), tracking into the session's MLflow server; a cluster
    that an earlier test left dead is started afresh."""
    _cluster.ensure()
    return _cluster.info


@pytest.mark.slow
@needs_root  # the second node runs in its own mount namespace
def test_submit_follow_runs_the_sweep_on_both_nodes_into_the_mlflow_server(cluster):
    shared = cluster["folder"] / "shared"
    # the trials are slow until both have trained an epoch: the second trial's actor must start on the other node
    # before the first ends, even on a loaded machine (Tune would otherwise run it on the first trial's freed CPU)
    pace = Pace(cluster["folder"], 0.3)
    spec = cluster["folder"] / "paced.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "base": {**SPEC["base"], "debug": pace.debug}}, sort_keys=False))

    ended = threading.Event()

    def release_once_both_trained_an_epoch():
        def both():
            if ended.is_set():  # the submit returned (or failed) first: nothing left to release
                return True
            try:
                c = store.client(cluster["tracking"])
                runs = store.child_runs(c, store.sweep_parent(c, "cluster_sweep"))
            except Exception:  # nothing logged yet
                return False
            return len(runs) == 2 and all(c.get_metric_history(r.info.run_id, "accuracy") for r in runs)

        try:
            wait_for(both, timeout=400, interval=1, what="both trials' first epochs")
        finally:
            pace.release()

    pacer = threading.Thread(target=release_once_both_trained_an_epoch, daemon=True)
    pacer.start()
    try:
        r = _cli("submit", str(spec), "--address", cluster["dashboard"], "--tracking-uri",
                 cluster["tracking"], "--storage", str(shared), "--follow", "--json", timeout=420)
    finally:
        ended.set()
        pacer.join(timeout=10)
    assert TOKEN not in r.stdout + r.stderr
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "SUCCEEDED" and out["job_id"].startswith("raysubmit_")
    assert out["result"]["trials"] == 2 and out["result"]["errored"] == 0

    nodes = _alive_nodes(cluster["dashboard"])
    c = store.client(cluster["tracking"])
    parent = store.sweep_parent(c, "cluster_sweep")
    children = store.child_runs(c, parent)
    assert len(children) == 2
    for run in children:
        assert run.info.status == "FINISHED"
        assert [m.step for m in c.get_metric_history(run.info.run_id, "accuracy")] == [1, 2]
    assert all(run.data.tags["fractune.torch_threads"] == "1" and run.data.tags["fractune.device"] == "cpu"
               for run in children)  # the trial's resources (1 CPU, no GPU) reached torch
    ran_on = {run.data.tags["fractune.node_id"] for run in children}
    assert ran_on == nodes  # both nodes of the cluster ran trials
    summary = json.loads((Path(out["result"]["storage"]) / "pareto.json").read_text())
    assert {t["node_id"] for t in summary["trials"]} == nodes
    assert Path(out["result"]["storage"]).parent == shared  # Tune's storage is the shared folder

    listed = _cli("jobs", "--address", cluster["dashboard"], "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = {j["job_id"]: j for j in json.loads(listed.stdout.strip().splitlines()[-1])["jobs"]}
    assert jobs[out["job_id"]]["status"] == "SUCCEEDED" and jobs[out["job_id"]]["sweep"] == "cluster_sweep"


@pytest.mark.slow
@needs_root  # the second node runs in its own mount namespace
def test_stop_ends_a_running_job(cluster):
    slow = {**SPEC, "name": "cluster_slow", "base": {**SPEC["base"], "optim": {"epochs": 50},
                                                      "debug": {"sleep_per_iteration": 0.2}}}
    spec = cluster["folder"] / "slow.yaml"
    spec.write_text(yaml.safe_dump(slow, sort_keys=False))
    r = _cli("submit", str(spec), "--address", cluster["dashboard"], "--tracking-uri", cluster["tracking"],
             "--storage", str(cluster["folder"] / "shared"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    job_id = json.loads(r.stdout.strip().splitlines()[-1])["job_id"]

    def status():  # polled over the Jobs REST API (`fractune jobs` itself is checked in the submit test)
        return json.loads(_get(f"{cluster['dashboard']}/api/jobs/{job_id}", timeout=10)[1])["status"]

    wait_for(lambda: status() == "RUNNING", timeout=120, interval=1, what="the job to run")
    stopped = _cli("stop", job_id, "--address", cluster["dashboard"], "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout.strip().splitlines()[-1])["stop_requested"] is True
    wait_for(lambda: status() == "STOPPED", timeout=120, interval=1, what="the job to stop")
    unknown = _cli("stop", "raysubmit_nosuchjob", "--address", cluster["dashboard"])
    assert unknown.returncode == 2 and "job_id" in unknown.stderr and "no such job" in unknown.stderr


@needs_root  # the second node runs in its own mount namespace
def test_attaching_refuses_storage_that_a_node_cannot_see(cluster):
    blind = cluster["folder"] / "blind"
    r = _cli("sweep", str(cluster["spec"]), "--address", cluster["gcs"], "--storage", str(blind),
             "--tracking-uri", cluster["tracking"], cwd=cluster["folder"])
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--storage" in lines[0] and "not shared by every node" in lines[0], lines
    assert TOKEN not in r.stdout + r.stderr
    assert not list(blind.glob("cluster_sweep-*"))  # no sweep started


@pytest.mark.slow
@needs_root
def test_a_sweep_attached_through_ray_address_is_checked_against_the_cluster_not_this_machine(cluster):
    """As a Ray job's driver is (``fractune submit``): no --address, ``RAY_ADDRESS`` naming the cluster. A trial
    asking for a GPU, which this machine lacks and the cluster's second node has, runs there: the resources are
    the cluster's to refuse, not this machine's."""
    spec = cluster["folder"] / "gpu.yaml"
    spec.write_text(yaml.safe_dump({"name": "gpu_node", "base": {"model": {"name": "tiny"}, "optim": {"epochs": 1},
                                                                 "data": {"dataset": "digits", "batch_size": 64}},
                                    "resources": {"cpu": 1, "gpu": 1}}))
    shared = cluster["folder"] / "shared"
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec), "--storage", str(shared),
                        "--tracking-uri", cluster["tracking"], "--quiet", "--no-report", "--json"],
                       capture_output=True, text=True, timeout=300, env=_env(RAY_ADDRESS=cluster["gcs"]),
                       cwd=cluster["folder"])
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert json.loads(r.stdout.strip().splitlines()[-1])["trials"] == 1
    gpu_node = json.loads(_ray("print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive'] and "
                               "n['Resources'].get('GPU')]))", cluster["gcs"]))
    c = store.client(cluster["tracking"])
    (run,) = store.child_runs(c, store.sweep_parent(c, "gpu_node"))
    assert run.info.status == "FINISHED" and [run.data.tags["fractune.node_id"]] == gpu_node
    assert run.data.tags["fractune.device"] == "cpu"  # the declared GPU is no CUDA device: device auto used the CPU


def test_train_on_workers_attached_to_a_cluster_counts_only_its_own_nodes_cpus(cluster):
    """`fractune train --workers N` keeps its run's checkpoints on this machine's disk, so its workers run on this
    process's node: attached to the two one-CPU nodes, two workers are refused, although the cluster has two CPUs
    (spread over both nodes, rank 0 would write checkpoints to a disk this process never sees)."""
    cfg = cluster["folder"] / "dp.yaml"
    cfg.write_text("model: {name: tiny}\ndata: {dataset: digits, batch_size: 32}\noptim: {epochs: 1}\n")
    ck = cluster["folder"] / "dp_ck"
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", str(cfg), "--workers", "2",
                        "--checkpoint-dir", str(ck)], capture_output=True, text=True, timeout=300,
                       env=_env(RAY_ADDRESS=cluster["gcs"]), cwd=cluster["folder"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.stdout[-2000:], r.stderr[-2000:])
    assert lines[0].startswith("fractune train: error: --workers: got 2; allowed: <= 1 (CPUs of this process's "
                               "node"), lines
    assert not ck.exists() and TOKEN not in r.stdout + r.stderr


def test_a_token_without_auth_mode_is_enough(cluster):
    """Only RAY_AUTH_TOKEN in the shell (no RAY_AUTH_MODE): fractune's Jobs client turns token mode on, as the
    image's entry point does for the nodes (found with docker/compose_test.py against the compose cluster)."""
    env = {k: v for k, v in _env().items() if k != "RAY_AUTH_MODE"}
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "jobs", "--address", cluster["dashboard"], "--json"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "jobs" in json.loads(r.stdout.strip().splitlines()[-1])
    assert TOKEN not in r.stdout + r.stderr
    # an explicit mode is left alone: disabled sends no token, and the cluster refuses the client
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "jobs", "--address", cluster["dashboard"]],
                       capture_output=True, text=True, timeout=120, env={**env, "RAY_AUTH_MODE": "disabled"}, cwd=ROOT)
    assert r.returncode == 2 and "token" in r.stderr.lower(), r.stderr[-2000:]


def test_submit_to_an_address_where_nothing_listens_fails_fast(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    t = time.monotonic()
    r = _cli("submit", str(spec), "--address", f"http://127.0.0.1:{_free_port()}", timeout=60)
    elapsed = time.monotonic() - t
    assert r.returncode == 2 and elapsed < 15, (r.returncode, elapsed)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--address" in lines[0] and "no Ray dashboard reachable" in lines[0], lines


def test_an_address_where_something_listens_but_never_answers_is_refused(tmp_path, capsys, monkeypatch):
    """Ray's Jobs client sets no timeout on its requests, and Ray's driver retries a GCS that never answers
    forever: a silent listener (a hung dashboard or head, another service) made `jobs`, `stop`, `submit` and
    `sweep --address` wait without end. `jobs` (every Jobs command builds its client the same way) and `sweep`
    each end with one line naming --address once the answer is overdue; a regression fails here instead of
    hanging the suite. (The answer is due within a second here, not the default ten.)"""
    import threading

    from orchestrator.cluster import jobs
    from tests.conftest import run_main

    monkeypatch.setattr(jobs, "ANSWER_TIMEOUT_S", 1.0)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    for command, address, said in (
            (("jobs",), "http://127.0.0.1:{port}", "no answer from a Ray dashboard there"),
            (("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"),
             "127.0.0.1:{port}", "something listens there but does not answer as a Ray cluster")):
        result = {}
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)  # accepts connections, never reads or answers
            address = address.format(port=silent.getsockname()[1])
            run = threading.Thread(target=lambda c=command, a=address, r=result: r.update(
                code=run_main(*c, "--address", a)[0]), daemon=True)  # a regression's stuck thread ends with pytest
            run.start()
            run.join(timeout=60)
        assert not run.is_alive(), f"fractune {command[0]} still waiting on a silent address after 60 s"
        lines = capsys.readouterr().err.strip().splitlines()
        assert result["code"] == 2 and len(lines) == 1, lines
        assert f"--address: got '{address}'; {said}" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # no store, no storage


def test_a_grpc_service_that_is_not_ray_is_refused_before_ray_retries_it(tmp_path, capsys):
    """A gRPC (or HTTP/2) service on the port answers the channel check, but not Ray's own calls: Ray's driver
    would retry it for minutes, logging a line per try; ``sweep --address`` refuses it in one line at once."""
    from concurrent import futures

    import grpc

    from tests.conftest import run_main

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # serves no method at all
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            code = run_main("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri",
                            f"sqlite:///{tmp_path}/m.db", "--address", address)[0]
            lines = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and lines == [f"fractune sweep: error: --address: got '{address}'; a gRPC service "
                                           "there, but not a Ray cluster's (it does not know Ray's calls); allowed: "
                                           "auto, or a running cluster's HOST:PORT (its GCS, port 6379 by default) "
                                           "or ray://HOST:PORT"], lines
    finally:
        server.stop(0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # no store, no storage


def test_a_dashboard_behind_tls_this_machine_does_not_trust_is_left_to_rays_client(tmp_path):
    """The answer check takes a TLS handshake as an answer: the certificate is Ray's Jobs client's to check, with
    its own settings (``verify``, ``REQUESTS_CA_BUNDLE``), not this machine's default CAs; a listener that never
    answers the handshake is still refused."""
    import http.server
    import ssl
    import threading

    from engine.errors import ConfigError
    from orchestrator.cluster import jobs
    from tests.conftest import self_signed_cert

    cert, key = self_signed_cert(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        jobs.check_reachable(f"https://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        with pytest.raises(ConfigError, match="no answer from a Ray dashboard there within 1 s"):
            jobs.check_reachable(f"https://127.0.0.1:{silent.getsockname()[1]}", answer_timeout=1)


def test_a_submitted_sweep_records_the_spec_file_submitted(tmp_path, monkeypatch):
    """The job runs a copy of the spec (``spec.yaml`` in its working_dir): the file the submitter named reaches
    the sweep in FRACTUNE_SPEC_FILE, for the parent run's ``spec_file`` param."""
    from orchestrator.cluster import jobs

    submitted = {}

    class FakeJobs:
        def submit_job(self, **kw):
            submitted.update(kw)
            return "job-1"

        def get_address(self):
            return "http://127.0.0.1:8265"

    monkeypatch.setattr(jobs, "client", lambda address: FakeJobs())
    monkeypatch.delenv("FRACTUNE_SPEC_FILE", raising=False)
    out, _ = jobs.submit(str(ROOT / "search_spaces" / "demo.yaml"), "http://127.0.0.1:8265", None, None,
                         upload=False)
    assert out["job_id"] == "job-1"
    assert submitted["runtime_env"]["env_vars"]["FRACTUNE_SPEC_FILE"] == "search_spaces/demo.yaml"
    assert submitted["entrypoint"].split()[4] == "spec.yaml"
