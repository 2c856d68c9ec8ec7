"""Ray Jobs: submit a sweep to a running cluster, list jobs, stop one (the Jobs SDK over the dashboard's HTTP API).

A submitted sweep is ``python -m orchestrator.cli sweep spec.yaml ...`` run as the job's driver on the head node.
Its runtime environment carries what the cluster needs and nothing more:

- a staged working directory: the spec, made self-contained (its ``base`` file and ``set`` overrides resolved
  here, so the cluster needs no other file of the user's), plus fractune's own packages unless the cluster's
  image has fractune installed (``upload=False``);
- ``env_vars``: the tracking URI (as the cluster sees it) and the storage folder. The Ray token is never put
  there: Ray's own clients read it from ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` / ``~/.ray/auth_token``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import yaml

from engine.errors import ConfigError, FractuneError

PACKAGES = ("engine", "trainables", "search_spaces", "results", "orchestrator", "dashboards")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: orchestrator/cluster/jobs.py
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
AGENT_WAIT_S = 60.0  # how long a submission waits for a just-started head's job agent


def dashboard_address(address: str | None) -> str:
    """``--address``, else ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS`` when it is an HTTP URL, else the
    local dashboard; a bare HOST:PORT gets ``http://``."""
    raw = address or os.environ.get("RAY_API_SERVER_ADDRESS") or ""
    if not raw:
        env = os.environ.get("RAY_ADDRESS", "")
        raw = env if env.startswith(("http://", "https://")) else DEFAULT_ADDRESS
    if "://" not in raw:
        raw = "http://" + raw
    allowed = "allowed: the Ray dashboard's URL, http://HOST:PORT (default port 8265)"
    from results.store import redact

    try:
        url = urlparse(raw)
        port = url.port
    except ValueError as exc:
        raise ConfigError.single("--address", redact(address or raw), f"malformed ({exc}); {allowed}") from None
    if url.scheme not in ("http", "https") or not url.hostname or port == 0:
        raise ConfigError.single("--address", redact(address or raw), allowed)
    return raw.rstrip("/")


# how long an --address check waits for an answer, here a Ray dashboard's and in orchestrator.sweep.ray_cluster a
# GCS's; read at each call, so a caller (a test) can shorten it for a whole command
ANSWER_TIMEOUT_S = 10.0


def check_reachable(address: str, timeout: float = 3.0, answer_timeout: float | None = None) -> None:
    """Fail in seconds, with one line, when nothing listens at the dashboard's address or nothing answers there
    within ``answer_timeout`` (``ANSWER_TIMEOUT_S`` unless given)."""
    import ssl
    import urllib.error
    import urllib.request

    from results.store import redact

    answer_timeout = ANSWER_TIMEOUT_S if answer_timeout is None else answer_timeout
    shown = redact(address)
    url = urlparse(address)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            pass
    except UnicodeError as exc:  # a host name that cannot be encoded (IDNA): too long a label, a control character
        raise ConfigError.single("--address", shown, f"not a valid host name ({exc}); allowed: the Ray "
                                 "dashboard's URL, http://HOST:PORT") from None
    except OSError as exc:
        raise ConfigError.single("--address", shown, f"no Ray dashboard reachable there ({exc.strerror or exc}); "
                                 "start the cluster (ray start --head / docker compose up) or give its "
                                 "http://HOST:8265") from None
    # something may listen there and never answer (a hung dashboard, another service): Ray's Jobs client sets no
    # timeout on its requests and would wait forever; any HTTP answer, an error status included, will do here, and
    # so does a TLS handshake this machine's CAs refuse (Ray's client checks certificates with its own settings)
    try:
        urllib.request.urlopen(address.rstrip("/") + "/api/version", timeout=answer_timeout).close()  # noqa: S310
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if not isinstance(reason, ssl.SSLError):
            raise ConfigError.single("--address", shown, f"no answer from a Ray dashboard there within "
                                     f"{answer_timeout:g} s ({reason}); allowed: the Ray dashboard's URL, "
                                     "http://HOST:8265") from None


def token_mode_from_token() -> None:
    """A Ray token given without ``RAY_AUTH_MODE`` means token mode, as the image's entry point does for the nodes:
    Ray's clients otherwise send no token (their auth mode is off by default) and a cluster that requires one
    refuses them. Only an explicit token (``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``) counts; an explicit mode
    is left alone. Before Ray reads its configuration, i.e. before the Jobs client is imported."""
    if os.environ.get("RAY_AUTH_MODE") is None and (os.environ.get("RAY_AUTH_TOKEN")
                                                    or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_MODE"] = "token"


def client(address: str | None):
    import logging

    token_mode_from_token()
    from ray.job_submission import JobSubmissionClient

    logging.getLogger("ray").setLevel(logging.WARNING)  # no INFO lines on package uploads: stderr stays errors only

    url = dashboard_address(address)
    check_reachable(url)
    try:
        return JobSubmissionClient(url)
    except Exception as exc:  # HTTP errors, version mismatch, token rejected
        from results.store import one_line_error

        raise ConfigError.single("--address", url, f"the Ray Jobs API refused the connection: "
                                 f"{one_line_error(exc)}") from None


def self_contained_spec(path: str) -> tuple[dict, object]:
    """The spec's tree with its base file and ``set`` overrides resolved, validated here first."""
    from engine.config.experiment import read_yaml
    from search_spaces.spec import load_spec

    loaded = load_spec(path)
    tree = read_yaml(path)
    tree["base"] = loaded.base_tree
    tree.pop("set", None)
    return tree, loaded


def stage(tree: dict, upload: bool) -> Path:
    """A temporary folder to ship as the job's working_dir: ``spec.yaml`` (+ fractune's packages)."""
    folder = Path(tempfile.mkdtemp(prefix="fractune-job-"))
    (folder / "spec.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    if upload:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for pkg in PACKAGES:
            shutil.copytree(ROOT / pkg, folder / pkg, ignore=ignore)
    return folder


def entrypoint(storage: str | None, resume: bool = False) -> str:
    parts = ["python", "-m", "orchestrator.cli", "sweep", "spec.yaml", "--json"]
    if storage:
        parts += ["--storage", storage]
    if resume:
        parts.append("--resume")
    return shlex.join(parts)  # the job's entry point runs in a shell on the head node: quote every argument


def job_id_problem(job_id: str, field: str) -> tuple[str, object, str] | None:
    """A job id as ``submit --job-id`` takes it and ``stop`` names it: checked here, before any request carries
    it into a URL path (``../../x``)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", job_id):
        return None
    return field, job_id, "allowed: letters, digits, '_', '.', '-', at most 100 characters"


class ClusterError(FractuneError):
    """The cluster's Jobs API failed after it passed its checks (an HTTP 500, a dropped connection): the
    cluster's trouble, one line and exit 1, as a tracking store's failure is."""

    exit_code = 1


@contextmanager
def answering(jc):
    """Calls on a connected ``JobSubmissionClient``, their failures as one line: Ray's client raises a bare
    ``RuntimeError`` for an HTTP error and a ``JSONDecodeError`` for an answer that is not JSON."""
    from results.store import one_line_error

    try:
        yield jc
    except FractuneError:
        raise
    except ValueError as exc:  # JSONDecodeError: something other than Ray's dashboard answers there
        raise ConfigError.single("--address", jc.get_address(), f"answers, but not as Ray's Jobs API does "
                                 f"({one_line_error(exc)[:200]}); allowed: a Ray dashboard's address") from None
    except (RuntimeError, OSError) as exc:  # HTTP errors; requests' connection errors are OSErrors
        raise ClusterError(f"the Ray Jobs API at {jc.get_address()} failed: {one_line_error(exc)[:300]}") from None


def submit(spec_path: str, address: str | None, tracking_uri: str | None, storage: str | None,
           upload: bool = True, resume: bool = False, submission_id: str | None = None) -> tuple[dict, object]:
    """Submit the sweep; its summary and the connected client (for following the job). The spec, the job id,
    the tracking URI and the address are checked, every problem at once, before anything is contacted."""
    from results.provenance import SPEC_FILE_ENV, spec_file
    from results.store_checks import check_uri

    problems: list = []
    tree = loaded = None
    for check in (lambda: self_contained_spec(spec_path), lambda: check_uri(tracking_uri) if tracking_uri else None,
                  lambda: dashboard_address(address)):
        try:
            result = check()
            if isinstance(result, tuple):
                tree, loaded = result
        except ConfigError as err:
            problems += [(f"{err.source}: {f}" if err.source else f, v, m) for f, v, m in err.problems]
    if submission_id is not None and (problem := job_id_problem(submission_id, "--job-id")):
        problems.append(problem)
    if storage is not None and (not storage.startswith("/") or "\x00" in storage):
        problems.append(("--storage", storage, "allowed: an absolute path that every node of the cluster mounts"))
    if problems:
        raise ConfigError(problems)
    jc = client(address)
    env = {"RAY_AIR_NEW_OUTPUT": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    if storage:
        env["FRACTUNE_STORAGE"] = storage
    if named := spec_file(spec_path):  # the job runs a copy: the sweep records the file submitted
        env[SPEC_FILE_ENV] = named
    folder = stage(tree, upload)
    deadline = time.monotonic() + AGENT_WAIT_S
    try:
        while True:
            try:
                job_id = jc.submit_job(entrypoint=entrypoint(storage, resume), submission_id=submission_id,
                                       runtime_env={"working_dir": str(folder), "env_vars": env},
                                       metadata={"fractune.sweep": loaded.name, "fractune.spec": Path(spec_path).name})
                break
            except Exception as exc:
                from results.store import one_line_error

                # a head that has just started has no job agent registered yet: Ray says to try again later
                if "try again later" in str(exc) and time.monotonic() < deadline:
                    time.sleep(2.0)
                    continue
                raise ConfigError.single("--address", jc.get_address(),
                                         f"job submission failed: {one_line_error(exc)}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out = {"job_id": job_id, "sweep": loaded.name, "trials": loaded.num_trials(), "address": jc.get_address(),
           "dashboard": f"{jc.get_address()}/#/jobs/{job_id}"}
    return out, jc


def follow(jc, job_id: str, out, poll_s: float = 1.0) -> str:
    """Stream the job's logs to ``out`` until it ends; its final status."""
    import asyncio

    async def tail() -> None:
        async for lines in jc.tail_job_logs(job_id):
            out.write(lines)
            out.flush()

    try:
        asyncio.run(tail())
    except Exception:  # the log stream closed early (dashboard restart): fall back to polling
        pass
    while True:
        status = str(jc.get_job_status(job_id).value)
        if status in TERMINAL:
            return status
        time.sleep(poll_s)


def describe(job) -> dict:
    meta = job.metadata or {}
    return {"job_id": job.submission_id or job.job_id, "status": str(job.status.value),
            "sweep": meta.get("fractune.sweep"), "entrypoint": job.entrypoint,
            "start_time": job.start_time, "end_time": job.end_time, "message": (job.message or "")[:200]}


def last_json_line(logs: str) -> dict | None:
    import json

    for line in reversed(logs.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None
