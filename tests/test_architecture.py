"""The one dependency direction (docs/architecture.md): engine knows nothing of Ray, MLflow or Optuna."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _loaded_after(import_stmt: str, forbidden: tuple[str, ...]) -> list[str]:
    code = f"import sys; {import_stmt}; print(','.join(m for m in {forbidden!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_engine_imports_no_service_libraries():
    stmt = ("import engine, engine.train, engine.config, engine.data, engine.cost, engine.models, "
            "engine.schedules, engine.checkpoint")
    assert _loaded_after(stmt, ("ray", "mlflow", "optuna")) == []


def test_engine_cli_commands_import_no_ray():
    # `fractune train` and `fractune cost` run in-process and must stay light.
    assert _loaded_after("import orchestrator.cli, orchestrator.commands_engine", ("ray", "mlflow", "optuna")) == []


def test_engine_sources_never_name_service_libraries():
    for path in (ROOT / "engine").rglob("*.py"):
        text = path.read_text()
        for lib in ("import ray", "from ray", "import mlflow", "from mlflow", "import optuna", "from optuna"):
            assert lib not in text, f"{path.relative_to(ROOT)} contains {lib!r}"


def test_store_readers_import_no_ray():
    # `fractune pareto`, `report` and `ui` only read the MLflow store: Ray's 1-2 s import is not theirs to pay.
    stmt = ("import orchestrator.store, orchestrator.ablation_analysis, orchestrator.commands_ablate, dashboards.report, "
            "dashboards.ui, dashboards.data")
    assert _loaded_after(stmt, ("ray",)) == []
