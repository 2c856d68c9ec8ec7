"""Helpers of the fault tests: start a CLI sweep in its own session, kill a whole session, cut a server off, read
what a sweep logged."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from results import store
from tests.conftest import ROOT

SLOW = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 6},
        "debug": {"sleep_per_iteration": 0.04}}


class Pace:
    """Runs slowed until the test releases them: ``debug`` makes each iteration sleep while the file exists, so a
    sweep is still running when the test's fault lands; ``release()`` once it has, and the rest (the retry, the
    resume) runs at full speed instead of sleeping."""

    def __init__(self, folder: Path, seconds: float = 0.04):
        self.file = folder / "pace"
        self.file.touch()
        self.debug = {"sleep_per_iteration": seconds, "sleep_while": str(self.file)}

    def release(self) -> None:
        self.file.unlink(missing_ok=True)


def histories(uri: str, name: str) -> dict[str, dict]:
    c = store.client(uri)
    parent = store.sweep_parent(c, name)
    out = {}
    for run in store.child_runs(c, parent):
        hist = c.get_metric_history(run.info.run_id, "accuracy")
        out[run.data.tags[store.TRIAL_TAG]] = {"status": run.info.status, "steps": [m.step for m in hist],
                                                 "name": run.info.run_name,
                                                 "start": run.info.start_time, "end": run.info.end_time,
                                                 "last_ts": max((m.timestamp for m in hist), default=0),
                                                 "tags": run.data.tags, "parent": parent.info.run_id}
    return out


def start_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    out = open(cwd / "stdout.log", "a")  # noqa: SIM115
    err = open(cwd / "stderr.log", "a")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, stdout=out, stderr=err,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, start_new_session=True)


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry)
        if fields and int(fields[3]) == sid:  # field 6 of /proc/PID/stat: the session id
            pids.append(int(entry.name))
    return pids


def _stat(entry: Path) -> list[str] | None:
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    """Every process below ``root`` in the parent tree (field 4 of /proc/PID/stat: the parent's pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry)):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def our_ray_processes(title: bytes) -> list[int]:
    """The processes of this test's own Ray (started by this process, so its workers are our descendants) whose
    command line holds ``title`` (a Ray actor's, e.g. ``ray::ImplicitFunc.train``), never another Ray's."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            if title in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of a session: the sweep driver and the local Ray cluster it started."""
    for _ in range(3):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Relay:
    """A TCP relay on 127.0.0.1 in front of a server: ``cut()`` makes the server unreachable exactly as a dead
    one is (the port refuses connections, open ones are reset), ``restore()`` listens again on the same port."""

    def __init__(self, target_port: int):
        self.target = target_port
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.port = 0
        self.restore()

    def restore(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener, self.port = s, s.getsockname()[1]
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def cut(self) -> None:
        with contextlib.suppress(OSError):  # already cut
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            c.close()  # linger 0: the peer gets a reset, as from a killed process

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
