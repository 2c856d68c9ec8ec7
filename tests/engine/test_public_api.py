"""The engine's public API (``from engine import ...``) and its old module paths, which still import."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import engine
from engine import _moved
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
    assert out.stdout.strip() == "['engine._moved']"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_module_path_is_the_new_module_with_a_warning(old):
    code = (f"import warnings, importlib; warnings.simplefilter('error', DeprecationWarning)\n"
            f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as w:\n    print(w)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == f"{old} moved to {_moved.MOVED[old]}; import it from there"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = __import__(old, fromlist=["_"])
    new = sys.modules[_moved.MOVED[old]]
    assert module is new and module.__spec__.name == new.__name__


@pytest.mark.parametrize("package", sorted(_moved.BECAME_PACKAGE))
def test_an_old_modules_names_are_found_in_its_package(package):
    target = __import__(_moved.BECAME_PACKAGE[package], fromlist=["_"])
    name = next(n for n, v in vars(target).items() if not n.startswith("_") and getattr(v, "__module__", "") ==
                target.__name__)
    code = (f"import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            f"try:\n    from {package} import {name}\nexcept DeprecationWarning as w:\n    print(w)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == (f"{package}.{name} moved to {target.__name__}.{name}; import it from there")
    with pytest.raises(AttributeError, match="has no attribute 'nonesuch'"):
        sys.modules[package].nonesuch  # noqa: B018
    # what the new module imports is not the old module's: torch.compile probes packages for ``torch``
    with pytest.raises(AttributeError, match="has no attribute 'torch'"):
        sys.modules[package].torch  # noqa: B018
