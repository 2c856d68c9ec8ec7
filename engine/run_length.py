"""How long a run is (``RunLength``): what the data's size and the config make of ``optim.epochs`` or
``optim.iterations`` (``ExperimentConfig.run_length``), and all a schedule may know about the run. Pure Python,
below the data and the schedules, which both use it."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RunLength:
    """How long a run is, in optimizer steps: what a schedule may know about the run."""

    total_iterations: int
    iterations_per_epoch: int

    @property
    def epochs(self) -> int:
        """Epochs started (the last one may be partial when ``optim.iterations`` does not divide)."""
        return math.ceil(self.total_iterations / self.iterations_per_epoch)
