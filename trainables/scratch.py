"""The temporary folders in which a trial's process, a data-parallel worker and a ``fractune train --workers`` run
write checkpoints before Ray copies them into storage. Each is named after the process that made it
(``fractune-ckpt-PID-...``): a process killed while one exists cannot remove it (a model's weights and optimizer
state, left in the machine's temporary folder), so every process that makes one first removes the folders of
processes that no longer exist on this machine, and leaves the live ones alone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "fractune-ckpt-"


def prefix() -> str:
    """The name prefix of this process's folders (for ``tempfile.mkdtemp`` and ``TemporaryDirectory``)."""
    return f"{PREFIX}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale(where: str | None = None) -> list[str]:
    """Remove the folders of processes that no longer exist (killed while one existed); the folders of live
    processes are left alone. Returns the removed paths."""
    removed = []
    for folder in Path(where or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) > 0 and folder.is_dir() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed
