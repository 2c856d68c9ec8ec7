"""Fixtures of the orchestrator tests (``ray_local`` lives in tests/conftest.py: dashboards tests share it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def tiny_mount(tmp_path):
    """``mount(size, readonly=False)``: a tmpfs of that size under the test's folder (needs root), unmounted
    after the test."""
    mounts = []

    def mount(size: str, readonly: bool = False) -> Path:
        path = tmp_path / f"mnt{len(mounts)}"
        path.mkdir()
        opts = f"size={size}" + (",ro" if readonly else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)
