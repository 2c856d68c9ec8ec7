"""Whether a tracking store can be used, checked before any work: the URI's form (``check_uri``), a server that
answers as MLflow does or a sqlite file that is MLflow's store (``preflight``), a store and folder that take
writes (``check_writable``, ``write_probe``). Each refusal is one line naming ``--tracking-uri``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from results.store import client, one_line_error, redact

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
                                     f"({one_line_error(str(exc))[:200]}); allowed: MLFLOW_TRACKING_SERVER_CERT_PATH (or "
                                     "REQUESTS_CA_BUNDLE) and MLFLOW_TRACKING_CLIENT_CERT_PATH naming readable PEM "
                                     "files") from None
        try:
            with urllib.request.urlopen(_server_request(uri), timeout=timeout, context=tls) as resp:  # noqa: S310
                if resp.status != 200:
                    raise OSError(f"/health answered {resp.status}")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            reason = one_line_error(redact(str(getattr(exc, "reason", exc))))
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
            reason = one_line_error(redact(str(getattr(exc, "reason", exc))))[:200]
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
        elif not os.access(db, os.R_OK):
            raise ConfigError.single("--tracking-uri", shown, f"cannot read {db} (Permission denied); allowed: a "
                                     "store this user may read")
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
                                 f"({one_line_error(redact(str(exc)))[:300]})") from None


MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}


def _check_mlflow_tables(db: Path, shown: str, mode: str) -> None:
    """An existing sqlite file is MLflow's store, or (for a writer) an empty database MLflow may fill. MLflow
    itself would write its schema into any sqlite file it is pointed at: a user's own database, or an empty
    file a reader was given by mistake. Read through a read-only connection, so nothing is changed, unless the
    file holds a transaction its writer never ended (a sweep's driver killed as it logged, say): its journal
    must be rolled back before anyone reads, which a read-only connection cannot do. A writable one does it,
    restoring the last committed state, as MLflow's own connection would the moment it opened the file."""
    import sqlite3

    from engine.errors import ConfigError

    try:
        tables = _table_names(db, "ro")
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
            raise ConfigError.single("--tracking-uri", shown, f"{db} cannot be read as a sqlite database "
                                     f"({one_line_error(str(exc))[:200]})") from None
        try:
            tables = _table_names(db, "rw")
        except sqlite3.Error as again:
            raise ConfigError.single("--tracking-uri", shown, f"{db} holds a transaction its writer never ended (the "
                                     f"journal beside it), which cannot be rolled back here "
                                     f"({one_line_error(str(again))[:200]}); allowed: a store this user may "
                                     "write") from None
    if MLFLOW_TABLES <= tables or (not tables and mode != "read"):
        return
    what = "an empty database" if not tables else f"a database of other tables ({', '.join(sorted(tables)[:5])})"
    allowed = "the store a sweep wrote" if mode == "read" else "an MLflow store, or a new file"
    raise ConfigError.single("--tracking-uri", shown, f"{db} is {what}, not an MLflow tracking store; "
                             f"allowed: {allowed}")


def _table_names(db: Path, mode: str) -> set[str]:
    import sqlite3

    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode={mode}", uri=True)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()


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
