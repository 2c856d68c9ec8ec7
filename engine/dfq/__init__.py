"""DFQ: the gate, the cp controllers, the gated model with its masked and routed execution, and the runner of
one DFQ or FracTrain iteration (docs/methods.md §6, §7)."""
