"""DFQ: the gate, the cp controllers, the gated model with its masked and routed execution, and the runner of
one DFQ or FracTrain iteration (docs/methods.md §6, §7)."""

from engine._moved import package_getattr

__getattr__ = package_getattr(__name__)  # the old module engine.dfq's names, with a DeprecationWarning
