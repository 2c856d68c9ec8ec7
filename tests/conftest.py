"""Shared fixtures. Tests that need Ray share one real local Ray per session (``ray_local``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture
def run_cli(tmp_path):
    """Run the real ``fractune`` entry point in a subprocess; returns CompletedProcess."""

    def run(*args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None):
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=full_env, cwd=cwd or ROOT)

    return run


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray (2 CPUs) started once for every test that runs sweeps."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
