"""The MLflow store of sweeps, without Ray: tracking URIs, the preflight check and the run queries.

Split from ``tracking`` (the Tune callback, which needs ``ray.tune`` at import) so that the commands that
only read a store (``pareto``, ``report``, ``ui``) start without importing Ray.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.metrics import readable_companions

PARENT_TAG = "mlflow.parentRunId"
TRIAL_TAG = "ray_trial_id"
SWEEP_TAG = "fractune.sweep_id"
POINT_TAG = "fractune.point"  # JSON of the trial's swept values {dotted path: value} (search_spaces.trial)
METHOD_TAG = "fractune.method"  # the trial's method label (its schedule's ``label()``: FW4/BW8, PFQ auto ...)
PARENTS_FILTER = "tags.`fractune.kind` = 'sweep'"  # MLflow's filter of the sweeps' parent runs
STAGE_TAG = "fractune.stage"  # a staged sweep's trial: the stage it ran in (search_spaces.trial.staged)
PLANNED_TAG = "fractune.planned_epochs"  # the engine's run_length(cfg).epochs of the trial's resolved config
# An experiment's kind: "custom_model_development" is model training (runs table, metric charts). MLflow 3.17.2's
# UI does not read it to pick an experiment's first page: its switch (GenAI / Model training, the URL's
# workflowType, else the browser's last choice, GenAI at first) decides, because the bundle's workflow-based
# navigation flag is on (the tag is read only with it off). Set all the same: the kind MLflow's API and other
# clients see, and the one its UI reads where that flag is off.
KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
def with_readable(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` and beside them their readable companions (``engine.metrics.readable_companions``); a
    companion the metrics already hold is kept as it is."""
    out = dict(metrics)
    for key, value in metrics.items():
        out.update({k: v for k, v in readable_companions(key, value).items() if k not in metrics})
    return out


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or an absolute ``sqlite:///<cwd>/mlflow.db`` (trials run in another cwd)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def normalise_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        return f"sqlite:///{Path(rel).expanduser().resolve()}"
    if "://" not in uri:  # a bare path to a database file
        return f"sqlite:///{Path(uri).expanduser().resolve()}"
    return uri


def redact(uri: str) -> str:
    """A URI safe to print: credentials (user:password@) replaced by ***."""
    import re

    return re.sub(r"(?<=://)[^/?#\s]*@", "***@", uri)


def without_credentials(uri: str) -> str:
    """A URI to show or open: the ``user:password@`` part removed (a browser asks for it)."""
    return redact(uri).replace("://***@", "://")


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = "null" if value is None else str(value)
    return out


def artifact_root(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: beside a sqlite database (``<db folder>/mlartifacts/<name>``),
    never ``./mlruns`` of whatever folder the command ran in (MLflow's default for a client on sqlite); None
    for a server, which has its own artifact root."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / experiment).as_uri()


def client(uri: str):
    """MLflow's client, failing fast when a server stops answering: its default retries back off for minutes
    (a reader would hang, a sweep's Tune loop stall). Every fractune process reads its store through this; the
    sweep's tracker queues and retries its writes itself. The environment may still set other values."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    return MlflowClient(tracking_uri=uri)


SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks")
API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # the cheapest call every MLflow server answers


def check_uri(uri: str, field: str = "--tracking-uri") -> None:
    """Refuse a malformed tracking URI in one line (scheme, host, port), without contacting anything."""
    from urllib.parse import urlsplit

    from engine.errors import ConfigError

    shown = redact(uri)
    try:  # a file name's non-UTF-8 byte (argv gives it as a lone surrogate): MLflow's stores take UTF-8 text only
        uri.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError.single(field, shown, "holds a byte that is not UTF-8 text; allowed: a URI or path of "
                                 "UTF-8 text") from None
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme not in SCHEMES:
        raise ConfigError.single(field, shown, "allowed: http(s)://HOST:PORT, sqlite:///PATH.db, a path to a "
                                 f".db file, or another MLflow store ({', '.join(SCHEMES)})")
    if scheme in ("http", "https"):
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as exc:
            raise ConfigError.single(field, shown, f"malformed URL ({exc}); allowed: http(s)://HOST:PORT") from None
        if not parts.hostname:
            raise ConfigError.single(field, shown, "no host; allowed: http(s)://HOST:PORT")
        if port == 0:
            raise ConfigError.single(field, shown, "port 0; allowed: a port 1..65535")


def _server_request(uri: str, path: str = "/health"):
    """A GET of ``path`` on an MLflow server, with the URI's credentials (or ``MLFLOW_TRACKING_USERNAME``/
    ``_PASSWORD``, ``MLFLOW_TRACKING_TOKEN``) sent as authentication, never as part of the host name."""
    import base64
    import urllib.request
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(uri)
    netloc = parts.hostname if ":" not in (parts.hostname or "") else f"[{parts.hostname}]"
    netloc += f":{parts.port}" if parts.port else ""
    path, _, query = path.partition("?")
    url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + path, query, ""))
    req = urllib.request.Request(url)  # noqa: S310  http(s) only (check_uri)
    user = unquote(parts.username) if parts.username else os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = unquote(parts.password or "") if parts.username else os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
    if user:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        req.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    return req


def _tls_context(uri: str):
    """The TLS settings MLflow's own client uses for ``uri`` (``MLFLOW_TRACKING_INSECURE_TLS``,
    ``MLFLOW_TRACKING_SERVER_CERT_PATH``, ``MLFLOW_TRACKING_CLIENT_CERT_PATH``, else the CA bundle ``requests``
    reads from ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``), so that the preflight passes where MLflow can connect and
    refuses where it cannot; ``None`` for plain http."""
    import ssl

    if not uri.lower().startswith("https://"):
        return None
    env = os.environ.get
    if env("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1"):
        context = ssl._create_unverified_context()  # noqa: S323  the user turned verification off for MLflow
    else:
        cafile = env("MLFLOW_TRACKING_SERVER_CERT_PATH") or env("REQUESTS_CA_BUNDLE") or env("CURL_CA_BUNDLE")
        folder = bool(cafile) and os.path.isdir(cafile)
        context = ssl.create_default_context(cafile=None if folder else cafile, capath=cafile if folder else None)
    if env("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        context.load_cert_chain(env("MLFLOW_TRACKING_CLIENT_CERT_PATH"))
    return context


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def preflight(uri: str, timeout: float = 5.0, mode: str = "create") -> None:
    """Fail before any trial when the tracking store cannot be used. ``mode``: ``create`` (a missing sqlite
    database is created), ``check`` (nothing is created: a missing database only needs a writable folder) or
    ``read`` (the store must already exist: the readers ``pareto``, ``report``, ``results``)."""
    import stat

    from engine.errors import ConfigError, cut_middle

    check_uri(uri)
    shown = redact(uri)
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            tls = _tls_context(uri)
        except OSError as exc:  # a certificate file missing, unreadable or no PEM
            raise ConfigError.single("--tracking-uri", shown, f"its TLS settings cannot be loaded "
                                     f"({_one_line(str(exc))[:200]}); allowed: MLFLOW_TRACKING_SERVER_CERT_PATH (or "
                                     "REQUESTS_CA_BUNDLE) and MLFLOW_TRACKING_CLIENT_CERT_PATH naming readable PEM "
                                     "files") from None
        try:
            with urllib.request.urlopen(_server_request(uri), timeout=timeout, context=tls) as resp:  # noqa: S310
                if resp.status != 200:
                    raise OSError(f"/health answered {resp.status}")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            reason = _one_line(redact(str(getattr(exc, "reason", exc))))
            raise ConfigError.single("--tracking-uri", shown, f"MLflow server unreachable ({reason})") from None
        # /health answers on more than MLflow (a proxy, another service) and on a server whose store is broken:
        # one call of the tracking API itself, without MLflow's minutes of retries
        try:
            with urllib.request.urlopen(_server_request(uri, API_PROBE), timeout=timeout,  # noqa: S310
                                        context=tls) as resp:
                answer = json.loads(resp.read(1 << 20))
            # MLflow's answer: an object whose "experiments" is a list, the key left out where none is visible (an
            # empty list is not written; a user of an authenticated server who may read no experiment gets {})
            if not isinstance(answer, dict) or not isinstance(answer.get("experiments", []), list):
                raise TypeError(f"answered {cut_middle(repr(answer), 80)}")
        except urllib.error.HTTPError as exc:
            raise ConfigError.single("--tracking-uri", shown, f"the server answers /health, but its tracking API "
                                     f"answered HTTP {exc.code} (GET {API_PROBE}); allowed: an MLflow tracking server "
                                     "that works") from None
        except (OSError, ValueError, TypeError) as exc:
            reason = _one_line(redact(str(getattr(exc, "reason", exc))))[:200]
            raise ConfigError.single("--tracking-uri", shown, f"the server answers /health, but not as MLflow's "
                                     f"tracking API does (GET {API_PROBE}: {type(exc).__name__} {reason}); allowed: "
                                     "an MLflow tracking server") from None
        return
    db = sqlite_path(uri)
    if db is not None:
        try:
            st = os.stat(db)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise ConfigError.single("--tracking-uri", shown, f"cannot read {db} ({exc.strerror})") from None
        if st is None:
            if mode == "read":
                raise ConfigError.single("--tracking-uri", shown, f"no tracking store at {db} (nothing has been "
                                         "logged there); allowed: the store a sweep wrote")
            _probe_folder(db.parent, shown)
            if mode == "check":
                return
        elif not stat.S_ISREG(st.st_mode):
            raise ConfigError.single("--tracking-uri", shown, f"{db} is not a regular file; allowed: a sqlite "
                                     "database file")
        elif not _is_sqlite(db):
            raise ConfigError.single("--tracking-uri", shown, f"{db} is not a sqlite database")
        else:
            _check_mlflow_tables(db, shown, mode)
            if mode != "read":
                check_writable(uri)
    try:
        client(uri).search_experiments(max_results=1)
    except Exception as exc:  # mlflow raises many types; the message is what matters
        raise ConfigError.single("--tracking-uri", shown, f"tracking store unusable "
                                 f"({_one_line(redact(str(exc)))[:300]})") from None


MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}


def _check_mlflow_tables(db: Path, shown: str, mode: str) -> None:
    """An existing sqlite file is MLflow's store, or (for a writer) an empty database MLflow may fill. MLflow
    itself would write its schema into any sqlite file it is pointed at: a user's own database, or an empty
    file a reader was given by mistake. Read through a read-only connection, so nothing is changed."""
    import sqlite3

    from engine.errors import ConfigError

    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise ConfigError.single("--tracking-uri", shown, f"{db} cannot be read as a sqlite database "
                                 f"({_one_line(str(exc))[:200]})") from None
    if MLFLOW_TABLES <= tables or (not tables and mode != "read"):
        return
    what = "an empty database" if not tables else f"a database of other tables ({', '.join(sorted(tables)[:5])})"
    allowed = "the store a sweep wrote" if mode == "read" else "an MLflow store, or a new file"
    raise ConfigError.single("--tracking-uri", shown, f"{db} is {what}, not an MLflow tracking store; "
                             f"allowed: {allowed}")


def check_writable(uri: str, instead: str = "") -> None:
    """A sqlite store that commands will write to (a sweep's runs, the pages ``results`` and ``report`` log):
    the file opens for writing and its folder takes new files (sqlite's journal), checked before any work; a
    read-only store used to let a sweep run every trial untracked. A server's store cannot be checked here.
    ``instead``: what else the command allows (a reader's ``or --no-log``)."""
    from engine.errors import ConfigError

    db = sqlite_path(uri)
    if db is None or not db.exists():
        return
    try:
        with open(db, "r+b"):
            pass
    except OSError as exc:
        raise ConfigError.single("--tracking-uri", redact(uri), f"{db} cannot be written ({exc.strerror}); "
                                 f"allowed: a writable store{' ' + instead if instead else ''}") from None
    _probe_folder(db.parent, redact(uri))


def _probe_folder(folder: Path, shown: str) -> None:
    """The folder exists and a file can really be created in it (``os.access`` says yes to root on read-only
    or virtual file systems)."""

    from engine.errors import ConfigError

    if not folder.is_dir():
        raise ConfigError.single("--tracking-uri", shown, f"folder {folder} must exist and be writable")
    try:
        write_probe(folder)
    except OSError as exc:
        raise ConfigError.single("--tracking-uri", shown, f"folder {folder} must be writable ({exc.strerror})") from None


def _is_sqlite(db: Path) -> bool:
    try:
        with open(db, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return False
    return head == b"SQLite format 3\x00" or head == b""


def ensure_experiment(c, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        mark_training(c, exp)
        return exp.experiment_id
    return c.create_experiment(name, artifact_location=artifact_root(c.tracking_uri, name),
                               tags={KIND_TAG: TRAINING_KIND})


def mark_training(c, exp) -> bool:
    """Open ``exp`` in the UI's model-training mode: set its kind tag unless someone chose a kind (the UI's own
    guesses end in ``_inferred``). True when the tag was written."""
    kind = exp.tags.get(KIND_TAG, "")
    if kind and not kind.endswith("_inferred") and kind != "no_inferred_type":
        return False
    c.set_experiment_tag(exp.experiment_id, KIND_TAG, TRAINING_KIND)
    return True


def trial_error_text(trial) -> str:
    """The trial's error trace: the local error file Tune just wrote, else the synced copy."""
    path = trial.error_file
    if path and Path(path).is_file():
        return Path(path).read_text(errors="replace")
    err = trial.get_error()
    return str(err) if err else "trial failed (no error recorded)"


def one_line_error(err: BaseException | str) -> str:
    return _one_line(str(err))[:2000]


# what a store's failure ends with that is no cause (SQLAlchemy's footer and statement echo)
FOOTERS = ("(Background on this error at", "[SQL:", "[parameters:")
# the causes a user can act on, named wherever they appear in a failure's text
CAUSES = ("database or disk is full", "No space left on device", "Read-only file system",
          "attempt to write a readonly database", "database is locked", "unable to open database file",
          "disk I/O error", "Permission denied")


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip() and not x.strip().startswith(FOOTERS)]
    for cause in CAUSES:
        hit = [x for x in lines if cause in x]
        if hit:
            return hit[-1]
    errors = [x for x in lines if "Error" in x or "error" in x]
    return (errors[-1] if errors else (lines[-1] if lines else text))


def sweep_parent(c, experiment: str, sweep_id: str | None = None):
    """The parent run of ``sweep_id``, or of the latest sweep of the experiment."""
    check_names(experiment, sweep_id)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    flt = PARENTS_FILTER
    if sweep_id:
        flt += f" and tags.`{SWEEP_TAG}` = '{sweep_id}'"
    runs = c.search_runs([exp.experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"],
                         max_results=1)
    return runs[0] if runs else None


def check_names(sweep: str, sweep_id: str | None = None, name_field: str = "sweep") -> None:
    """A sweep name and sweep id as fractune makes them (``<name>-<timestamp>``): nothing else reaches an
    MLflow filter string. ``name_field``: how the command takes the name (a positional ``sweep``, ``ui --sweep``)."""
    import re

    from engine.config.experiment import NAME_PATTERN
    from engine.errors import ConfigError

    problems = [(field, value, "allowed: letters, digits, '.', '_' and '-', starting with a letter or digit, at "
                 "most 100 characters") for field, value in ((name_field, sweep), ("--sweep-id", sweep_id))
                if value is not None and not re.match(NAME_PATTERN, value)]
    if problems:
        raise ConfigError(problems)


def child_runs(c, parent) -> list:
    out, token = [], None
    while True:
        page = c.search_runs([parent.info.experiment_id],
                             filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'", max_results=1000,
                             page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def artifact_json(c, run_id: str, path: str):
    """A JSON (or YAML) artifact of a run, or None when the run has none of that name."""
    import tempfile

    from engine import safe_yaml

    parent_dir = str(Path(path).parent) if "/" in path else None
    if path not in {a.path for a in c.list_artifacts(run_id, parent_dir)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = c.download_artifacts(run_id, path, tmp)
        return safe_yaml.read_yaml_file(local, f"artifact {path} of run {run_id}")  # the guarded reader


def write_probe(folder) -> None:
    """Write and remove a few real bytes in ``folder`` (an empty file needs no space: a full disk would pass);
    raises OSError when it cannot."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=".fractune-probe-", dir=folder)
    try:
        os.write(fd, b"ok")
    finally:
        os.close(fd)
        os.unlink(name)
