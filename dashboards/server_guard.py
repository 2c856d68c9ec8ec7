"""Runs a server command and stops it once the process that started it is gone, however that went (SIGKILL
included), so that no MLflow server outlives the ``fractune ui`` that started it.

``fractune ui`` runs ``python server_guard.py CMD...`` by path, in a session of its own (the guard leads the
process group the server and its workers join) with a pipe on the guard's stdin whose write end only
``fractune ui`` holds. End of file on stdin means that process has exited; the guard then stops the group:
SIGTERM, SIGKILL after ``GRACE`` seconds. SIGTERM or SIGINT sent to the guard alone is passed to the group the
same way. The guard exits with the server's exit status. Standard library only, so that it starts at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

GRACE = 10.0


def _stop_group(signum=None, frame=None) -> None:
    """SIGTERM to the guard's process group (the server and its workers), SIGKILL to what is left after GRACE."""
    for sig in (signal.SIGTERM, signal.SIGINT):  # the group's SIGTERM reaches this process too
        signal.signal(sig, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
    except ProcessLookupError:
        return
    threading.Timer(GRACE, lambda: os.killpg(0, signal.SIGKILL)).start()


def _watch_starter() -> None:
    sys.stdin.buffer.read()  # returns at end of file: the starter has exited
    os.kill(os.getpid(), signal.SIGTERM)  # stopped by the handler, in the main thread


def main(argv: list[str]) -> int:
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, _stop_group)
    signal.signal(signal.SIGINT, _stop_group)
    threading.Thread(target=_watch_starter, daemon=True).start()
    code = server.wait()
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # not sys.exit: the grace timer's thread must not hold the exit up
