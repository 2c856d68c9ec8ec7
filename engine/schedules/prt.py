"""CPT's precision range test (docs/methods.md §5.2): pick ``fw_min`` before cyclic training starts.

Not in either reference repo; the CPT paper describes it. From a fresh model (the run's own seed), train
``iterations_per_bit`` iterations at each candidate forward precision in ascending order (backward at
``prt.bw``), record the mean training accuracy over the last ``window`` iterations of each, and take as
``fw_min`` the first candidate whose gain over the previous candidate exceeds ``threshold`` (the "switching
point" of the paper's PRT figure). When no gain exceeds it, the lowest candidate already trains and is kept.
The test's iterations are real training and their BitOPs are counted in the run's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.numerics.precision import Precision


@dataclass
class PRTResult:
    fw_min: int
    fw_max: int
    accuracies: dict[int, float] = field(default_factory=dict)  # bits -> mean training accuracy (window)
    gains: dict[int, float] = field(default_factory=dict)  # bits -> gain over the previous candidate
    iterations: int = 0
    bitops: int = 0
    costs: dict[str, float] = field(default_factory=dict)  # the test's cost under every cost model

    def as_dict(self) -> dict:
        return {"fw_min": self.fw_min, "fw_max": self.fw_max, "iterations": self.iterations, "bitops": self.bitops,
                "accuracies": {str(k): v for k, v in self.accuracies.items()},
                "gains": {str(k): v for k, v in self.gains.items()}}


def choose_fw_min(accuracies: dict[int, float], threshold: float) -> tuple[int, dict[int, float]]:
    """The first bit width whose accuracy gain over the previous one exceeds ``threshold``."""
    bits = sorted(accuracies)
    gains = {b: accuracies[b] - accuracies[a] for a, b in zip(bits, bits[1:])}
    for b in bits[1:]:
        if gains[b] > threshold:
            return b, gains
    return bits[0], gains


def precision_range_test(prt, fw_max: int, weight_bits: int | None, batches, step, counter) -> PRTResult:
    """Run the test. ``batches()`` yields training batches forever; ``step(x, y, prec) -> (loss, correct)``
    trains one iteration; ``counter`` prices it."""
    accuracies: dict[int, float] = {}
    it = iter(batches())
    bitops = iterations = 0
    costs: dict[str, float] = {}
    for bits in prt.candidates:
        prec = Precision.fwbw(bits, prt.bw, weight_bits)
        recent: list[float] = []
        for _ in range(prt.iterations_per_bit):
            x, y = next(it)
            _, correct = step(x, y, prec)
            recent.append(correct / len(y))
            bitops += len(y) * counter.per_sample(prec)
            for name, value in counter.costs(prec, len(y)).items():
                costs[name] = costs.get(name, 0) + value
            iterations += 1
        tail = recent[-prt.window:]
        accuracies[bits] = float(torch.tensor(tail).mean())
    fw_min, gains = choose_fw_min(accuracies, prt.threshold)
    return PRTResult(min(fw_min, fw_max), fw_max, accuracies, gains, iterations, bitops, costs)
