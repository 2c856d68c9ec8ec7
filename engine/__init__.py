"""fractune's quantized-training engine: torch and pydantic only.

The public API, importable from here (``from engine import train_and_evaluate``); each name loads its module
on first use, so ``import engine`` stays cheap:

- configuration: ``ExperimentConfig``, ``load_config``, ``parse_config``
- training: ``train_and_evaluate``, ``RunResult``
- precision and layers: ``Precision``, ``FP32``, ``SKIP``, ``QConv2d``, ``QLinear``, ``QMatmul``
- models and cost: ``build_model``, ``BitOpsCounter``
- errors: ``FractuneError``, ``ConfigError``, ``DataError``, ``CheckpointError``, ``TrainingDiverged``

The subpackages, one per concept (docs/architecture.md): ``numerics`` (precision, quantizers, autograd,
layers), ``models``, ``cost`` (BitOPs, hardware cost models), ``data``, ``schedules`` (static, PFQ, CPT, the
runner), ``dfq`` (gate, controllers, gated model, DFQ/FracTrain runner), ``config``; ``train``, ``checkpoint``
and ``preview`` on top.
"""

from __future__ import annotations

import importlib

_API = {
    "ExperimentConfig": "engine.config.experiment", "load_config": "engine.config.experiment",
    "parse_config": "engine.config.experiment",
    "train_and_evaluate": "engine.train", "RunResult": "engine.train",
    "Precision": "engine.numerics.precision", "FP32": "engine.numerics.precision",
    "SKIP": "engine.numerics.precision",
    "QConv2d": "engine.numerics.layers", "QLinear": "engine.numerics.layers", "QMatmul": "engine.numerics.layers",
    "build_model": "engine.models", "BitOpsCounter": "engine.cost.bitops",
    "FractuneError": "engine.errors", "ConfigError": "engine.errors", "DataError": "engine.errors",
    "CheckpointError": "engine.errors", "TrainingDiverged": "engine.errors",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
