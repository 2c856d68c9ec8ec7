"""Training cost: exact BitOPs per layer and pass, and the hardware cost models (docs/methods.md §2, §10)."""

from engine._moved import package_getattr

__getattr__ = package_getattr(__name__)  # the old module engine.cost's names, with a DeprecationWarning
