"""The engine's module paths before it was split into subpackages, kept importable for code written against them.

``import engine.quant`` gives the module now at ``engine.numerics.quant`` (the same object, so state and
monkeypatches are shared) and ``from engine.config import ExperimentConfig`` finds the name in the module that
now holds it; both warn with a ``DeprecationWarning`` naming the new path. New code imports the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import sys
import warnings

# old module -> where it lives now
MOVED = {
    "engine.precision": "engine.numerics.precision", "engine.affine": "engine.numerics.affine",
    "engine.quant": "engine.numerics.quant", "engine.autograd": "engine.numerics.autograd",
    "engine.fused": "engine.numerics.fused", "engine.gpu_kernels": "engine.numerics.gpu_kernels",
    "engine.layers": "engine.numerics.layers", "engine.scratch": "engine.numerics.scratch",
    "engine.indicator": "engine.schedules.indicator", "engine.prt": "engine.schedules.prt",
    "engine.runners": "engine.schedules.runner", "engine.gate": "engine.dfq.gate",
    "engine.controller": "engine.dfq.controller", "engine.models.gated": "engine.dfq.gated",
    "engine.cost_models": "engine.cost.hardware", "engine.schedule_config": "engine.config.schedule",
    "engine.config_types": "engine.config.types", "engine.config_errors": "engine.config.problems",
    "engine.text": "engine.data.text",
}
# old modules whose name is now a subpackage: the package finds the old module's names in the new one
BECAME_PACKAGE = {
    "engine.config": "engine.config.experiment", "engine.data": "engine.data.datasets",
    "engine.schedules": "engine.schedules.progress", "engine.cost": "engine.cost.bitops",
    "engine.dfq": "engine.dfq.runner",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module that now lives at the new one."""

    def __init__(self) -> None:
        self._own_specs: dict = {}

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        _warn(spec.name, MOVED[spec.name])
        module = importlib.import_module(MOVED[spec.name])
        self._own_specs[spec.name] = module.__spec__  # the import system overwrites __spec__ on the module
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._own_specs.pop(module.__spec__.name)


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def package_getattr(package: str):
    """A subpackage's ``__getattr__``: a name of the old module of the same path, found in the new one."""
    target = BECAME_PACKAGE[package]

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        module = importlib.import_module(target)
        value = getattr(module, name, None)
        # only what the old module defined itself: tools that probe a package's attributes (torch.compile reads
        # ``torch`` off the modules it traces) must not find the new module's imports here
        imported = inspect.ismodule(value) or (hasattr(value, "__module__") and callable(value)
                                               and value.__module__ != target)
        if not hasattr(module, name) or imported:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn(f"{package}.{name}", f"{target}.{name}")
        setattr(sys.modules[package], name, value)  # found once, warned once
        return value

    return __getattr__
