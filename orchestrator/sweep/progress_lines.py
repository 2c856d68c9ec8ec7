"""The sweep's progress on stderr: a Tune callback printing one line per epoch result and per ended trial.

Imports ``ray.tune`` at import time: ``orchestrator.sweep.driver`` imports it lazily, when a sweep starts.
"""

from __future__ import annotations

import sys

from ray import tune

from engine.metrics import ACCURACY, PERPLEXITY


class ProgressPrinter(tune.Callback):
    def __init__(self, total: int | None):
        self.total = total
        self.done = 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        quality = (f"perplexity {result[PERPLEXITY]:.2f}" if PERPLEXITY in result  # a language model
                   else f"accuracy {result.get(ACCURACY, float('nan')):.4f}")
        print(f"  {trial.trial_id} epoch {result.get('epoch')}: {quality} "
              f"cp {result.get('cp', float('nan')):.2f}% fw {result.get('fw_bits', 0):.2f} "
              f"bw {result.get('bw_bits', 0):.2f}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial, "finished")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial, "ERRORED")

    def _ended(self, trial, how: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total or '?'}] {trial.trial_id} {how}", file=sys.stderr, flush=True)
