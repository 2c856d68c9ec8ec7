"""`make compose-test`: the compose cluster of docker/ run for real, on this machine, with no image registry.

Steps (each prints its elapsed time; any failure exits 1, and the stack and a daemon this script started are
always taken down):

 1. daemon    a Docker daemon: the running one, else ``dockerd --iptables=false --ip6tables=false --bridge=none``
              started here (overlay2 where the kernel mounts overlayfs, else vfs; $FRACTUNE_DOCKERD_STORAGE picks)
 2. build     docker/local-base.sh: the Debian base (debootstrap), PostgreSQL 15, fractune:$FRACTUNE_VARIANT
 3. ca        the host's CA bundle, given to pip as a build secret, is in no layer of the image
 4. up        compose.yaml + compose.local.yaml, two workers, free loopback ports, Ray token authentication on
              (RAY_AUTH_TOKEN alone, on the nodes and in the host's shell); waits for every health check
 5. backend   MLflow's backend store is the PostgreSQL service (its schema and runs are in the database); the
              mlflow container runs none of MLflow's GenAI job runner (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false)
 6. sweep     ``fractune submit search_spaces/demo.yaml --follow`` from the host (this checkout's .venv): every
              trial a FINISHED run in the MLflow server and in PostgreSQL, trials on more than one worker
 7. dp        docker/dp_sweep.yaml submitted: two trials on two Ray Train workers each, one worker a container;
              both trials FINISHED (every node reaches the run's checkpoints in the shared storage)
 8. kill      docker/kill_sweep.yaml submitted; once every trial has logged two epochs, the worker running most
              of them is killed (docker kill); its trials must be retried (tag fractune.retried) and the sweep
              must finish with every trial FINISHED and none errored
 9. down      ``docker compose down -v``; the daemon is stopped if this script started it

Run as root from the repository root with the project's venv: ``.venv/bin/python docker/compose_test.py``.
Logs (job logs, compose logs, the daemon's log) and summary.json go to a fresh folder under /tmp; no secret is
written there. The images are kept for the next run (``--rmi`` removes them at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER_DIR = ROOT / "docker"
BIN = Path(sys.executable).parent
PROJECT = "fractunect"
VARIANT = os.environ.get("FRACTUNE_VARIANT", "cuda")
WORKERS = 2
T0 = time.monotonic()


class Failed(Exception):
    pass


# ---------------------------------------------------------------------------------------------- helpers

def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


@contextlib.contextmanager
def step(name: str, times: dict):
    say(f"== {name}")
    t = time.monotonic()
    try:
        yield
    finally:
        times[name] = round(time.monotonic() - t, 1)
        say(f"== {name}: {times[name]}s")


def run(cmd: list[str], check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise Failed(f"{' '.join(cmd[:6])} ... exited {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def http(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


class Stack:
    """The docker client, compose and this run's settings."""

    def __init__(self, out: Path):
        self.out = out
        self.docker = shutil.which("docker") or "/usr/bin/docker"
        if run([self.docker, "compose", "version"], check=False).returncode == 0:
            self.compose_cmd = [self.docker, "compose"]
        elif shutil.which("docker-compose"):
            self.compose_cmd = ["docker-compose"]
        else:
            raise Failed("neither `docker compose` nor docker-compose: run `make docker-engine`")
        self.token = secrets.token_hex(32)
        self.ray_port, self.mlflow_port = free_port(), free_port()
        self.secret_dir = Path(tempfile.mkdtemp(prefix="fractune-ct-"))  # the env file: password and token
        self.env_file = self.secret_dir / "compose.env"
        self.env_file.write_text("\n".join([
            f"COMPOSE_PROJECT_NAME={PROJECT}", f"POSTGRES_PASSWORD={secrets.token_urlsafe(24)}",
            f"FRACTUNE_VARIANT={VARIANT}", "FRACTUNE_BIND=127.0.0.1", f"RAY_DASHBOARD_PORT={self.ray_port}",
            f"MLFLOW_PORT={self.mlflow_port}", "RAY_HEAD_CPUS=0", "RAY_WORKER_CPUS=2", "MLFLOW_WORKERS=2",
            f"RAY_AUTH_TOKEN={self.token}", ""]))  # no RAY_AUTH_MODE: the token alone turns token mode on
        self.env_file.chmod(0o600)
        self.dashboard = f"http://127.0.0.1:{self.ray_port}"
        self.tracking = f"http://127.0.0.1:{self.mlflow_port}"

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "POSTGRES_", "MLFLOW_", "FRACTUNE_"))}
        cmd = [*self.compose_cmd, "-p", PROJECT, "--env-file", str(self.env_file),
               "-f", str(DOCKER_DIR / "compose.yaml"), "-f", str(DOCKER_DIR / "compose.local.yaml"), *args]
        return run(cmd, check=check, timeout=timeout, cwd=DOCKER_DIR, env=env)

    def containers(self) -> dict[str, dict]:
        """name -> {service, state, health, ip} of this project's containers."""
        ids = run([self.docker, "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"]).stdout.split()
        if not ids:
            return {}
        out = {}
        for c in json.loads(run([self.docker, "inspect", *ids]).stdout):
            nets = c["NetworkSettings"]["Networks"] or {}
            out[c["Name"].lstrip("/")] = {
                "service": c["Config"]["Labels"].get("com.docker.compose.service"),
                "state": c["State"]["Status"], "health": (c["State"].get("Health") or {}).get("Status"),
                "ip": next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None),
                "restarts": c.get("RestartCount", 0)}
        return out

    def host_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
        env.update(RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0", PATH=f"{BIN}:{env.get('PATH', '')}")
        return env

    def submit(self, spec: str, log: Path, follow: bool = True) -> subprocess.Popen:
        cmd = [str(BIN / "fractune"), "submit", spec, "--address", self.dashboard, "--tracking-uri",
               "http://mlflow:5000", "--storage", "/shared/fractune_runs", "--json"]
        if follow:
            cmd.append("--follow")
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=ROOT,
                                env=self.host_env(), start_new_session=True)

    def ray_nodes(self) -> dict[str, str]:
        """node_id -> node IP, of the nodes alive now (the dashboard's state API, with the token)."""
        status, body = http(f"{self.dashboard}/api/v0/nodes?limit=100", self.token, timeout=20)
        if status != 200:
            raise Failed(f"Ray state API /api/v0/nodes: HTTP {status}")
        data = json.loads(body)
        while isinstance(data, dict) and not isinstance(data.get("result"), list):
            data = data.get("data") or data.get("result")
        return {n["node_id"]: n["node_ip"] for n in data["result"] if n.get("state") == "ALIVE"}

    def psql(self, sql: str) -> list[list[str]]:
        pg = next(n for n, c in self.containers().items() if c["service"] == "postgres")
        r = run([self.docker, "exec", pg, "psql", "-U", "fractune", "-d", "mlflow", "-tA", "-F", "\t", "-c", sql])
        return [line.split("\t") for line in r.stdout.splitlines() if line]


# ---------------------------------------------------------------------------------------------- the steps

def start_daemon(out: Path) -> tuple[subprocess.Popen | None, str]:
    docker = shutil.which("docker") or "/usr/bin/docker"
    if run([docker, "info"], check=False, timeout=30).returncode == 0:
        driver = run([docker, "info", "--format", "{{.Driver}}"]).stdout.strip()
        say(f"a Docker daemon is running already (storage driver {driver}): using it, leaving it running")
        return None, driver
    if not shutil.which("dockerd"):
        raise Failed("dockerd missing: run `make docker-engine` (Debian's docker.io)")
    driver = os.environ.get("FRACTUNE_DOCKERD_STORAGE") or ("overlay2" if overlay_works() else "vfs")
    log = (out / "dockerd.log").open("w")
    proc = subprocess.Popen(["dockerd", f"--storage-driver={driver}", "--iptables=false", "--ip6tables=false",
                             "--bridge=none"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    say(f"started dockerd (pid {proc.pid}, --storage-driver={driver}), log {out / 'dockerd.log'}")
    try:
        wait_for(lambda: proc.poll() is not None or run([docker, "info"], check=False, timeout=30).returncode == 0,
                 60, "dockerd to answer", 1.0)
        if proc.poll() is not None:
            raise Failed(f"dockerd exited {proc.returncode}: {(out / 'dockerd.log').read_text()[-1500:]}")
    except BaseException:
        stop_daemon(proc)
        raise
    return proc, driver


def overlay_works() -> bool:
    """Whether this kernel mounts overlayfs here (then dockerd's overlay2 shares image layers between containers;
    vfs copies the whole image for every layer and container)."""
    d = Path(tempfile.mkdtemp(prefix="fractune-ovl-"))
    try:
        for sub in ("l", "u", "w", "m"):
            (d / sub).mkdir()
        r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={d}/l,upperdir={d}/u,workdir={d}/w", str(d / "m")], capture_output=True)
        if r.returncode == 0:
            subprocess.run(["umount", str(d / "m")], capture_output=True)
        return r.returncode == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def stop_daemon(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    say(f"stopped the dockerd this run started (pid {proc.pid})")


def check_disk(driver: str) -> None:
    root = "/var/lib/docker" if Path("/var/lib/docker").exists() else "/"
    free_gb = shutil.disk_usage(root).free / 1e9
    need = 60 if driver == "vfs" else 15  # vfs: a full copy of the ~6 GB image per layer and per container
    say(f"{free_gb:.0f} GB free under {root} (storage driver {driver}; needs about {need} GB)")
    if free_gb < need:
        raise Failed(f"only {free_gb:.0f} GB free under {root}; the {driver} storage driver needs about {need} GB")


def build(out: Path, summary: dict) -> None:
    log = out / "build.log"
    with log.open("w") as f:
        proc = subprocess.Popen(["sh", str(DOCKER_DIR / "local-base.sh")], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "FRACTUNE_VARIANT": VARIANT})
        for line in proc.stdout:
            f.write(line)
            if line.startswith("== "):
                say("   " + line.strip())
        if proc.wait() != 0:
            raise Failed(f"docker/local-base.sh exited {proc.returncode}; see {log}")
    docker = shutil.which("docker") or "/usr/bin/docker"
    sizes = {}
    for image in ("fractune-base:bookworm", "fractune-postgres:15", f"fractune:{VARIANT}"):
        sizes[image] = round(int(run([docker, "image", "inspect", "-f", "{{.Size}}", image]).stdout) / 1e6)
        say(f"   image {image}: {sizes[image]} MB")
    summary["image_mb"] = sizes


def check_ca_not_in_image(summary: dict) -> None:
    """The certificates of the host's bundle that the image does not ship itself must be in none of its files,
    and no Dockerfile step may name the bundle."""
    docker = shutil.which("docker") or "/usr/bin/docker"
    image = f"fractune:{VARIANT}"
    host_file = os.environ.get("PIP_CA_FILE") or os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") \
        or "/etc/ssl/certs/ca-certificates.crt"
    host = Path(host_file).read_text() if Path(host_file).is_file() else ""
    own = run([docker, "run", "--rm", "--network", "none", "--entrypoint", "cat", image,
               "/etc/ssl/certs/ca-certificates.crt"], check=False).stdout
    extra = [c for c in pem_blocks(host) if c not in own]
    probes = [c.splitlines()[3] for c in extra if len(c.splitlines()) > 4]
    history = run([docker, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image]).stdout
    if any(("COPY" in line or "ADD" in line) and ("ca-certificates" in line or ".crt" in line or ".pem" in line)
           for line in history.splitlines()):
        raise Failed("a Dockerfile step copies a CA bundle into the image")
    if not probes:
        say(f"   the host's bundle {host_file} holds no certificate the image lacks: nothing to look for")
        summary["ca_certs_checked"] = 0
        return
    args = [a for p in probes for a in ("-e", p)]
    grep = [docker, "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "grep"]
    # the search finds the bundle where it is (the bundle mounted into a container of the image)...
    seen = run([*grep, "-v", f"{host_file}:/probe/bundle.crt:ro", image, "-rlIF", *args, "/probe"], check=False)
    if seen.stdout.split() != ["/probe/bundle.crt"]:
        raise Failed(f"the CA search does not find the bundle where it is: {seen.stdout!r} {seen.stderr[-300:]}")
    # ...and in no file of the image itself
    r = run([*grep, image, "-rlIF", *args, "/", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev"],
            check=False, timeout=900)
    if r.returncode == 0:
        raise Failed(f"the host's CA certificates are in the image: {r.stdout.split()[:5]}")
    if r.returncode != 1:
        raise Failed(f"grep over the image failed ({r.returncode}): {r.stderr[-500:]}")
    say(f"   {len(probes)} host-only CA certificate(s) of {host_file}: in no file of {image}; "
        "no step copies a bundle")
    summary["ca_certs_checked"] = len(probes)


def pem_blocks(text: str) -> list[str]:
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("-----BEGIN CERTIFICATE"):
            cur = [line]
        elif cur is not None:
            cur.append(line)
            if line.startswith("-----END CERTIFICATE"):
                blocks.append("\n".join(cur))
                cur = None
    return blocks


def up(stack: Stack, summary: dict) -> None:
    stack.compose("up", "-d", "--no-build", "--scale", f"ray-worker={WORKERS}", timeout=900)

    def all_healthy():
        cs = stack.containers()
        bad = {n: c for n, c in cs.items() if c["state"] != "running"}
        if bad:
            raise Failed(f"containers not running: {bad}")
        return len(cs) == 3 + WORKERS and all(c["health"] == "healthy" for c in cs.values())

    wait_for(all_healthy, 600, "every container to be healthy", 3.0)
    nodes = wait_for(lambda: len(stack.ray_nodes()) == 1 + WORKERS and stack.ray_nodes(), 120,
                     f"{1 + WORKERS} alive Ray nodes")
    for name, c in sorted(stack.containers().items()):
        say(f"   {name}: {c['state']}, {c['health']}, {c['ip']}")
    # token authentication is on: the Jobs API refuses a request without the token, takes one with it
    without, _ = http(f"{stack.dashboard}/api/jobs/")
    with_token, _ = http(f"{stack.dashboard}/api/jobs/", stack.token)
    if without not in (401, 403) or with_token != 200:
        raise Failed(f"Ray token authentication: HTTP {without} without the token, {with_token} with it")
    say(f"   Ray: {len(nodes)} nodes alive; Jobs API without the token: HTTP {without}, with it: {with_token}")
    summary["ray_nodes"] = len(nodes)


def check_backend(stack: Stack) -> None:
    mlflow = next(n for n, c in stack.containers().items() if c["service"] == "mlflow")
    cmd = " ".join(json.loads(run([stack.docker, "inspect", "-f", "{{json .Config.Cmd}}", mlflow]).stdout))
    if "--backend-store-uri postgresql" not in cmd:
        raise Failed(f"MLflow's backend store is not PostgreSQL: {cmd}")
    tables = {r[0] for r in stack.psql("select tablename from pg_tables where schemaname = 'public'")}
    if not {"runs", "experiments", "metrics", "alembic_version"} <= tables:
        raise Failed(f"MLflow's tables are not in PostgreSQL: {sorted(tables)}")
    version = stack.psql("show server_version")[0][0]
    say(f"   mlflow server --backend-store-uri postgresql+psycopg2://...; PostgreSQL {version} holds "
        f"{len(tables)} MLflow tables")
    # MLflow's GenAI job runner is off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION, compose.yaml): no huey consumers
    procs = run([stack.docker, "top", mlflow, "-o", "pid,args"]).stdout.splitlines()[1:]
    jobs = [p for p in procs if "huey" in p or "job_runner" in p]
    if jobs:
        raise Failed(f"the mlflow container runs MLflow's job runner: {jobs[:3]}")
    say(f"   the mlflow container runs {len(procs)} processes, none of MLflow's job runner")


def node_names(stack: Stack) -> dict[str, str]:
    """Ray node id -> container name (matched by IP)."""
    by_ip = {c["ip"]: n for n, c in stack.containers().items() if c["ip"]}
    return {nid: by_ip.get(ip, ip) for nid, ip in stack.ray_nodes().items()}


def trial_rows(stack: Stack, sweep: str) -> tuple[list[dict], str]:
    sys.path.insert(0, str(ROOT))
    from results import store

    c = store.client(stack.tracking)
    parent = store.sweep_parent(c, sweep)
    if parent is None:
        return [], ""
    rows = []
    for run_ in store.child_runs(c, parent):
        tags = run_.data.tags
        epochs = max((m.step for m in c.get_metric_history(run_.info.run_id, "accuracy")), default=0)
        rows.append({"run_id": run_.info.run_id, "trial": tags.get(store.TRIAL_TAG), "name": run_.info.run_name,
                     "status": run_.info.status, "node_id": tags.get("fractune.node_id"),
                     "retried": tags.get("fractune.retried"), "epochs": epochs,
                     "accuracy": run_.data.metrics.get("accuracy")})
    return sorted(rows, key=lambda r: r["name"] or ""), parent.info.run_id


def finish(proc: subprocess.Popen, timeout: float, what: str) -> dict:
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
        raise Failed(f"{what}: fractune submit --follow did not end within {timeout:.0f}s") from None
    lines = [x for x in stdout.strip().splitlines() if x.startswith("{")]
    if not lines:
        raise Failed(f"{what}: no JSON from fractune submit (exit {proc.returncode})")
    out = json.loads(lines[-1])
    if proc.returncode != 0 or out.get("status") != "SUCCEEDED":
        raise Failed(f"{what}: job {out.get('job_id')} ended {out.get('status')} (exit {proc.returncode})")
    return out


def check_runs(stack: Stack, sweep: str, result: dict, names: dict[str, str], expect_trials: int) -> list[dict]:
    rows, parent = trial_rows(stack, sweep)
    if result["result"]["trials"] != expect_trials or result["result"]["errored"] != 0:
        raise Failed(f"{sweep}: {result['result']['trials']} trials, {result['result']['errored']} errored")
    if len(rows) != expect_trials or any(r["status"] != "FINISHED" for r in rows):
        raise Failed(f"{sweep}: runs in MLflow {[(r['name'], r['status']) for r in rows]}")
    in_db = {r[0]: r[1] for r in stack.psql(
        f"select run_uuid, status from runs where run_uuid in ({','.join(repr(r['run_id']) for r in rows)}, "
        f"'{parent}')")}
    if len(in_db) != expect_trials + 1 or any(in_db[r["run_id"]] != "FINISHED" for r in rows):
        raise Failed(f"{sweep}: PostgreSQL holds {in_db} for the sweep's runs")
    for r in rows:
        r["node"] = names.get(r["node_id"], r["node_id"])
        acc = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "-"
        say(f"   {r['name']:<26} {r['status']:<9} accuracy {acc}  node {r['node']}"
            + (f"  retried {r['retried']}" if r["retried"] else ""))
    return rows


def sweep_demo(stack: Stack, out: Path, summary: dict) -> None:
    t = time.monotonic()
    proc = stack.submit("search_spaces/demo.yaml", out / "sweep_demo.log")
    result = finish(proc, 1800, "demo sweep")
    took = round(time.monotonic() - t, 1)
    names = node_names(stack)
    rows = check_runs(stack, "demo", result, names, 7)
    workers = {r["node"] for r in rows}
    if len(workers) < 2:
        raise Failed(f"demo: every trial ran on one node ({workers})")
    say(f"   job {result['job_id']}: SUCCEEDED in {took}s; 7 trials FINISHED in MLflow and PostgreSQL, "
        f"on {len(workers)} workers: " + ", ".join(f"{w} {sum(r['node'] == w for r in rows)}" for w in sorted(workers)))
    summary["demo"] = {"job_id": result["job_id"], "seconds": took, "trials": len(rows),
                       "errored": result["result"]["errored"],
                       "runs": [{k: r[k] for k in ("name", "status", "node", "accuracy")} for r in rows]}


def sweep_data_parallel(stack: Stack, out: Path, summary: dict) -> None:
    t = time.monotonic()
    proc = stack.submit("docker/dp_sweep.yaml", out / "sweep_dp.log")
    result = finish(proc, 1800, "data-parallel sweep")
    took = round(time.monotonic() - t, 1)
    rows = check_runs(stack, "compose_dp", result, node_names(stack), 2)
    say(f"   job {result['job_id']}: SUCCEEDED in {took}s; 2 trials on two workers each FINISHED, trials on "
        + ", ".join(sorted({r["node"] for r in rows})))
    summary["data_parallel"] = {"job_id": result["job_id"], "seconds": took, "errored": result["result"]["errored"],
                                "runs": [{k: r[k] for k in ("name", "status", "node", "accuracy")} for r in rows]}


def sweep_kill(stack: Stack, out: Path, summary: dict) -> None:
    t = time.monotonic()
    names_before = node_names(stack)
    proc = stack.submit("docker/kill_sweep.yaml", out / "sweep_kill.log")
    try:
        def two_epochs_everywhere():
            rows, _ = trial_rows(stack, "compose_kill")
            running = [r for r in rows if r["node_id"] and r["epochs"] >= 2 and r["status"] == "RUNNING"]
            return running if len(running) == 4 and len({r["node_id"] for r in running}) >= 2 else None

        running = wait_for(two_epochs_everywhere, 600, "four trials with two epochs each, on two workers", 2.0)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        raise
    per_node: dict[str, list[str]] = {}
    for r in running:
        per_node.setdefault(r["node_id"], []).append(r["name"])
    victim_id = max(per_node, key=lambda n: len(per_node[n]))
    victim = names_before[victim_id]
    victims = sorted(per_node[victim_id])
    say(f"   after {time.monotonic() - t:.0f}s: " + "; ".join(
        f"{names_before.get(n, n)} runs {', '.join(sorted(v))}" for n, v in per_node.items()))
    run([stack.docker, "kill", victim])
    killed_at = time.monotonic()
    say(f"   docker kill {victim} (trials {', '.join(victims)})")
    result = finish(proc, 1800, "kill sweep")
    took = round(time.monotonic() - t, 1)
    names = {**names_before, **node_names(stack)}
    rows = check_runs(stack, "compose_kill", result, names, 4)
    retried = sorted(r["name"] for r in rows if r["retried"])
    if not set(victims) <= set(retried):
        raise Failed(f"trials of the killed worker not retried: {victims}, retried: {retried}")
    state = stack.containers().get(victim, {})
    say(f"   job {result['job_id']}: SUCCEEDED in {took}s ({time.monotonic() - killed_at:.0f}s after the kill); "
        f"4 trials FINISHED, 0 errored; retried: {', '.join(retried)}; {victim} now {state.get('state')} "
        f"(restarts {state.get('restarts')})")
    summary["kill"] = {"job_id": result["job_id"], "seconds": took, "killed": victim, "killed_trials": victims,
                       "retried": retried, "errored": result["result"]["errored"],
                       "killed_container_after": state.get("state"),
                       "runs": [{k: r[k] for k in ("name", "status", "node", "retried")} for r in rows]}


# ---------------------------------------------------------------------------------------------- main

def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rmi", action="store_true", help="remove the three images at the end")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("compose-test: needs root (debootstrap, dockerd)", file=sys.stderr)
        return 1
    out = Path(tempfile.mkdtemp(prefix="fractune-compose-test-"))
    say(f"compose test: logs in {out}")
    signal.signal(signal.SIGTERM, _interrupt)
    times: dict[str, float] = {}
    summary: dict = {"times_s": times, "variant": VARIANT, "workers": WORKERS}
    daemon, stack, ok = None, None, False
    try:
        with step("daemon", times):
            daemon, driver = start_daemon(out)
            summary["storage_driver"] = driver
            check_disk(driver)
        with step("build", times):
            build(out, summary)
        with step("ca", times):
            check_ca_not_in_image(summary)
        stack = Stack(out)
        summary["compose"] = " ".join(Path(c).name for c in stack.compose_cmd) + " " + run(
            [*stack.compose_cmd, "version", "--short"], check=False).stdout.strip()
        stack.compose("down", "-v", "--remove-orphans", check=False)  # leftovers of an interrupted run
        with step("up", times):
            up(stack, summary)
        with step("backend", times):
            check_backend(stack)
        with step("sweep", times):
            sweep_demo(stack, out, summary)
        with step("dp", times):
            sweep_data_parallel(stack, out, summary)
        with step("kill", times):
            sweep_kill(stack, out, summary)
        ok = True
    except Failed as exc:
        say(f"FAILED: {exc}")
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        if stack is not None:
            with step("down", times):
                with contextlib.suppress(Exception):
                    (out / "compose.log").write_text(stack.compose("logs", "--no-color", check=False,
                                                                   timeout=120).stdout)
                r = stack.compose("down", "-v", "--remove-orphans", check=False, timeout=300)
                if r.returncode != 0:
                    say(f"compose down failed: {r.stderr.strip()[-500:]}")
                    ok = False
                shutil.rmtree(stack.secret_dir, ignore_errors=True)
            if args.rmi:
                run([stack.docker, "rmi", f"fractune:{VARIANT}", "fractune-postgres:15", "fractune-base:bookworm"],
                    check=False)
        stop_daemon(daemon)
        times["total"] = round(time.monotonic() - T0, 1)
        summary["ok"] = ok
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        say(f"times (s): {json.dumps(times)}")
        say(("PASSED" if ok else "FAILED") + f": compose test; summary {out / 'summary.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
