"""A sweep's identity and lifecycle around Tune's ``fit()`` (docs/reliability.md).

* **Identity.** ``claim_sweep_id`` gives every start its own id, ``<name>-<YYYYmmdd-HHMMSS>`` and a two-digit
  suffix where another start of the same second (in this storage, or any storage writing to the same tracking
  store) holds it: the id's storage folder is created exclusively, so two processes cannot both take it.
* **One process per sweep.** ``hold_sweep`` takes an exclusive lock on the sweep's folder for the life of the
  process, so a second ``--resume`` of a running sweep is refused instead of running its trials twice.
* **Interruption.** ``interruptible`` turns SIGINT and SIGTERM into Tune's own graceful stop (its SIGUSR1
  handler: trials stopped, experiment state saved, the tracker's queue flushed) and remembers the signal; a
  second signal stops at once. ``reconcile`` ends every run of the sweep left RUNNING as KILLED (after an
  interruption, and before a resume after SIGKILL), and never touches a FINISHED run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import time
from pathlib import Path

from engine.errors import ConfigError, FractuneError

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
LOCK_FILE = ".fractune.lock"
_held: dict[str, object] = {}  # this process's sweep folder -> its open, locked lock file


class SweepInterrupted(FractuneError):
    """The sweep stopped on SIGINT or SIGTERM; its state is saved and ``--resume`` continues it."""

    def __init__(self, signum: int, sweep_id: str, finished: int, total: int):
        self.signum, self.sweep_id, self.finished, self.total = signum, sweep_id, finished, total
        self.signal_name = signal.Signals(signum).name
        self.exit_code = EXIT_CODES.get(signum, 130)
        super().__init__(f"sweep {sweep_id} interrupted by {self.signal_name}: {finished} of {total} "
                         "trials finished")


def claim_sweep_id(root: Path, name: str, taken=None) -> str:
    """A new sweep id no other sweep holds, its storage folder created (exclusively) under ``root``.
    ``taken(sweep_id)`` says whether the tracking store already has a sweep of that id (another storage's)."""
    stamp = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 100):
        sweep_id = stamp if n == 1 else f"{stamp}-{n:02d}"
        try:
            (root / sweep_id).mkdir()
        except FileExistsError:
            continue
        if taken is not None and taken(sweep_id):
            continue  # the folder stays: it marks the id as used
        return sweep_id
    raise ConfigError.single("--storage", str(root), f"no free sweep id for {name!r} in this second; retry")


def hold_sweep(exp_path: Path, sweep_id: str) -> None:
    """Lock the sweep's folder for this process (until ``release_sweep`` or its exit); refused (exit 2) while
    another process runs the sweep."""
    if str(exp_path.resolve()) in _held:  # this process holds it already (a sweep run again in one session)
        return
    exp_path.mkdir(parents=True, exist_ok=True)
    handle = open(exp_path / LOCK_FILE, "a+")  # noqa: SIM115  held open until the process exits
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.seek(0)
        pid = handle.read().strip() or "?"
        handle.close()
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
            raise ConfigError.single("--resume", sweep_id, f"the sweep is running in another process (pid {pid}); "
                                     "wait for it or stop it first") from None
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    _held[str(exp_path.resolve())] = handle


def release_sweep(exp_path: Path) -> None:
    """Give up this process's lock on the sweep's folder (the sweep ended)."""
    handle = _held.pop(str(exp_path.resolve()), None)
    if handle is not None:
        handle.close()  # closing the file releases its lock


@contextlib.contextmanager
def interruptible():
    """SIGINT and SIGTERM during ``fit()`` stop Tune gracefully; yields a dict whose ``signal`` is set when one
    came. Before Tune's handler is in place (or on a second signal) the process stops as the signal says."""
    got: dict = {}
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # this handler forwards SIGINT to Tune's SIGUSR1 one

    def handler(signum, frame):
        tune_handler = signal.getsignal(signal.SIGUSR1)
        if got or tune_handler in (signal.SIG_DFL, signal.SIG_IGN, None):
            got.setdefault("signal", signum)
            raise KeyboardInterrupt  # a second signal, or no Tune loop yet to stop gracefully
        got["signal"] = signum
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def reconcile(uri: str, experiment: str, sweep_id: str, parent_status: str | None = "KILLED") -> int:
    """Every child run of the sweep still RUNNING becomes KILLED (a FINISHED or FAILED run is left as it is);
    the parent too when ``parent_status`` is given and it is RUNNING. Returns how many runs changed; a store that
    cannot be reached changes nothing (the next resume reconciles)."""
    from results import store

    try:
        c = store.client(uri)
        parent = store.sweep_parent(c, experiment, sweep_id)
        if parent is None:
            return 0
        changed = 0
        for run in store.child_runs(c, parent):
            if run.info.status == "RUNNING":
                c.set_terminated(run.info.run_id, "KILLED")
                changed += 1
        if parent_status and c.get_run(parent.info.run_id).info.status == "RUNNING":
            c.set_terminated(parent.info.run_id, parent_status)
            changed += 1
        return changed
    except Exception:  # noqa: BLE001  the store is down: the runs stay as they are until the next resume
        return 0


def recorded_parents(exp_path: Path) -> list[str]:
    """The parent runs a sweep's folder records (its tracker's file; a staged sweep's, one per stage folder).
    A tracker that never reached its store records none: it creates the parent run once it does."""
    from orchestrator.tracking.tracker import REPORT_FILE, read_report

    found = []
    for folder in [exp_path, *sorted(p.parent for p in exp_path.glob(f"*/{REPORT_FILE}"))]:
        try:
            parent = read_report(folder).get("parent_run_id")
        except (OSError, ValueError, AttributeError):  # unreadable or cut: nothing recorded
            continue
        if isinstance(parent, str) and parent:
            found.append(parent)
    return found


def check_resume_store(uri: str, exp_path: Path, sweep_id: str) -> None:
    """Refuse to resume into a store that does not hold the sweep's parent runs: another ``--tracking-uri`` than
    the one it started with (or none, where it started with one). Resumed there, the trials would be logged
    beside runs they are not part of and the front named without them. Nothing is created: a store that does not
    exist is refused as the readers refuse it."""
    from mlflow.exceptions import MlflowException

    from results import store, store_checks

    parents = recorded_parents(exp_path)
    if not parents:
        return
    store_checks.preflight(uri, mode="read")
    c = store.client(uri)
    for parent in parents:
        try:
            c.get_run(parent)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # a store that fails now: the tracker's backlog keeps it
                return
            raise ConfigError.single("--tracking-uri", store.redact(uri), f"sweep {sweep_id} was not tracked here "
                                     f"(its parent run {parent} is not in this store); allowed: the tracking URI the "
                                     "sweep started with") from None


def resume_command(spec: str, storage: str | None, tracking_uri: str | None) -> str:
    """The exact command that continues a sweep, with the storage and tracking store it used."""
    import shlex

    parts = ["fractune", "sweep", spec, "--resume"]
    if storage:
        parts += ["--storage", storage]
    if tracking_uri:
        parts += ["--tracking-uri", tracking_uri]
    return " ".join(shlex.quote(p) for p in parts)
