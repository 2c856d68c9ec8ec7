"""Fixtures of the orchestrator tests (``ray_local`` lives in tests/conftest.py: dashboards tests share it)."""

from __future__ import annotations

import pytest

from tests.conftest import copy_store


@pytest.fixture
def sqlite_uri(tmp_path, store_template):
    """A fresh, empty sqlite store (a copy of the session's template)."""
    return copy_store(store_template, tmp_path / "mlflow.db")
