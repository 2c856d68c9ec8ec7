"""Fixtures of the orchestrator tests (``ray_local`` lives in tests/conftest.py: dashboards tests share it)."""

from __future__ import annotations

import pytest


@pytest.fixture
def sqlite_uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
