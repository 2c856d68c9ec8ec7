"""Safe defaults: loopback servers (and no port of the local Ray off loopback that answers without its token),
weights-only checkpoints, safe YAML, no code from user input, token auth left alone, secrets kept out of logs,
MLflow and artifacts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from results import store
from tests.conftest import ROOT, copy_store

SOURCES = [p for d in ("engine", "trainables", "search_spaces", "results", "orchestrator", "dashboards")
           for p in (ROOT / d).rglob("*.py")]


def _code(path):
    return "\n".join(line.split("#")[0] for line in path.read_text().splitlines())


def test_no_unsafe_loading_or_code_execution_in_sources():
    assert SOURCES
    for path in SOURCES:
        code = _code(path)
        rel = path.relative_to(ROOT)
        assert not re.search(r"yaml\.(load|unsafe_load|full_load)\(", code), rel
        assert not re.search(r"(?<![\w.])(eval|exec)\(", code), rel
        assert not re.search(r"pickle\.loads?\(|cloudpickle\.loads?\(", code), rel
        for call in re.findall(r"torch\.load\([^)]*\)", code, flags=re.S):
            assert "weights_only=True" in call, (rel, call)
        assert "RAY_AUTH_MODE" not in code or "disabled" not in code, rel  # token auth is never switched off


# the local Ray fractune starts, probed from inside: every port it listens on, and what each answers over HTTP
PROBE = r"""
import json, sys, urllib.request
import ray
import psutil  # Ray's vendored copy, on sys.path once ray is imported
from orchestrator.sweep.ray_cluster import init_ray
init_ray(None, dashboard=True)  # the default's services and the dashboard's
me = psutil.Process()
pids = {p.pid for p in me.children(recursive=True)} | {me.pid}
found = []
for c in psutil.net_connections(kind="inet"):
    if c.status != psutil.CONN_LISTEN or c.pid not in pids:
        continue
    ip, port = c.laddr.ip, c.laddr.port
    answer = None
    if ip not in ("127.0.0.1", "::1"):
        host = "127.0.0.1" if ip in ("0.0.0.0", "::") else ip
        host = f"[{host}]" if ":" in host else host
        for path in ("/", "/metrics", "/api/version"):
            try:
                with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=3) as r:
                    answer = r.status
                    break
            except urllib.error.HTTPError as e:
                answer = e.code
            except Exception as e:
                answer = type(e).__name__
    found.append([ip, port, psutil.Process(c.pid).name(), answer])
print(json.dumps({"ports": found, "webui": ray._private.worker.global_worker.node.address_info["webui_url"]}))
ray.shutdown()
"""


@pytest.mark.slow
def test_servers_default_to_loopback():
    """No server in the sources binds every interface; the local Ray a sweep starts (with its dashboard on, a
    superset of the default's services) serves its dashboard and Jobs API on 127.0.0.1, and off loopback only
    Ray's token-guarded services listen: gRPC (no HTTP answer at all) and HTTP that says 401."""
    for path in SOURCES:
        code = _code(path)
        assert "0.0.0.0" not in code, path.relative_to(ROOT)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=180,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "",
                              "RAY_USAGE_STATS_ENABLED": "0", "HOME": os.environ.get("HOME", "/root")})
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["webui"].startswith("127.0.0.1:")  # the dashboard and Jobs API
    ports = found["ports"]
    assert ports, "no listening port found: the probe is broken"
    exposed = [p for p in ports if p[0] not in ("127.0.0.1", "::1")]
    bad = [p for p in exposed if isinstance(p[3], int) and p[3] < 400]
    assert not bad, bad
    assert not any(p[3] == 200 for p in ports)


def test_uri_credentials_are_redacted():
    assert store.redact("http://alice:s3cret@mlflow:5000") == "http://***@mlflow:5000"
    assert store.redact("postgresql://u:p@db/mlflow") == "postgresql://***@db/mlflow"
    assert store.redact("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db"


@pytest.mark.slow
def test_secrets_never_reach_output_mlflow_or_storage(run_cli, tmp_path, store_template):
    secret = "tok_" + "9f3c" * 8
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "secrets", "base": {"model": {"name": "tiny"}, "optim": {"epochs": 1},
                                                                 "data": {"dataset": "digits"}}}))
    uri = copy_store(store_template, tmp_path / "m.db")
    r = run_cli("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri, "--json",
                "--report-dir", str(tmp_path / "reports"),
                env={"RAY_AUTH_TOKEN": secret, "MLFLOW_TRACKING_TOKEN": secret, "RAY_ADDRESS": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    assert secret not in r.stdout and secret not in r.stderr
    c = store.client(uri)
    parent = store.sweep_parent(c, "secrets")
    runs = [parent, *store.child_runs(c, parent)]
    for run in runs:
        values = list(run.data.params.values()) + list(run.data.tags.values())
        assert not any(secret in str(v) for v in values)
        for art in c.list_artifacts(run.info.run_id):
            local = Path(c.download_artifacts(run.info.run_id, art.path, str(tmp_path / "dl")))
            for f in ([local] if local.is_file() else [q for q in local.rglob("*") if q.is_file()]):
                assert secret not in f.read_text(errors="replace"), f
    for path in [*(tmp_path / "runs").rglob("*"), *(tmp_path / "reports").rglob("*")]:
        if path.is_file() and path.suffix in (".json", ".csv", ".yaml", ".txt", ".log", ".journal", ".html"):
            assert secret not in path.read_text(errors="replace"), path
