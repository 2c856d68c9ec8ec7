"""The engine's public API (``from engine import ...``) and its subpackages' plain re-exports."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import engine
from tests.conftest import ROOT


def test_every_public_name_resolves_to_its_module():
    for name in engine.__all__:
        value = getattr(engine, name)
        assert value is getattr(sys.modules[engine._API[name]], name)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        engine.nonesuch  # noqa: B018


def test_importing_engine_loads_no_module_of_the_api():
    code = "import sys, engine; print(sorted(m for m in sys.modules if m.startswith(('engine.', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_the_config_package_exports_its_entry_points_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from engine.config import ExperimentConfig, load_config, parse_config
    from engine.config import experiment

    assert (ExperimentConfig, load_config, parse_config) == (
        experiment.ExperimentConfig, experiment.load_config, experiment.parse_config)


def test_no_old_module_path_imports():
    for old in ("engine.quant", "engine.layers", "engine.runners", "engine.cost_models"):
        with pytest.raises(ModuleNotFoundError):
            __import__(old)
