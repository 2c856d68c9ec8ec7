"""The sweep's progress on stderr: a Tune callback printing one line per epoch result and per ended trial, each
naming its trial by method label and short run name (``FW4/BW8 [static fw4/bw8 s0]``).

Imports ``ray.tune`` at import time: ``orchestrator.sweep.driver`` imports it lazily, when a sweep starts.
"""

from __future__ import annotations

import math
import sys

from ray import tune

from results.objectives import Objective
from search_spaces import trial


class ProgressPrinter(tune.Callback):
    """``total``: the trials planned; ``task``: the sweep's objective (what each epoch line reports);
    ``variation``: what tells the sweep's trials apart (``search_spaces.naming.variation``), for their names."""

    def __init__(self, total: int | None, task: Objective, variation: dict):
        self.total = total
        self.done = 0
        self.task = task
        self.variation = variation
        self.labels: dict[str, str] = {}

    def label(self, t) -> str:
        """``METHOD [RUN NAME]`` (``search_spaces.trial.label``); Tune's id for a config it cannot read."""
        if t.trial_id not in self.labels:
            self.labels[t.trial_id] = trial.label(t.config, self.variation) or t.trial_id
        return self.labels[t.trial_id]

    def on_trial_result(self, iteration, trials, trial, result, **info):
        quality = self.task.value_text(result.get(self.task.key, math.nan))
        print(f"  {self.label(trial)} epoch {result.get('epoch')}: {quality} "
              f"cp {result.get('cp', float('nan')):.2f}% fw {result.get('fw_bits', 0):.2f} "
              f"bw {result.get('bw_bits', 0):.2f}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        from orchestrator.tracking.tracker import stopped_at  # a Tune callback's module: imported where used

        at = stopped_at(trial)  # ASHA or the time limit ended it before its planned epochs
        self._ended(trial, f"stopped early ({at})" if at else "finished")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial, "ERRORED")

    def _ended(self, trial, how: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total or '?'}] {self.label(trial)} {how}", file=sys.stderr, flush=True)
