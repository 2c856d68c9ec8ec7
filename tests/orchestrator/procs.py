"""Process helpers for the fault tests: start a CLI sweep in its own session, kill a whole session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT


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
