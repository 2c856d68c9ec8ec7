"""The Ray Tune function trainable: a thin adapter around ``engine.train_and_evaluate``.

The sampled trial dict becomes an ``ExperimentConfig`` (``search_spaces.trial.decode``); every epoch's
metrics (the engine's, whatever keys it reports) go out through ``ray.tune.report`` with a checkpoint; a
restarted or restored trial resumes from ``ray.tune.get_checkpoint()``. torch uses as many threads as the trial
has CPUs (and the GPU Ray gave the trial: ``device: auto`` sees only that one). Each result also carries where
the trial ran (``PLACEMENT_KEYS``: node id, torch device and threads), which the tracker keeps as tags, not
metrics. Only ``ray.tune`` APIs are used (``ray.train.*`` is deprecated inside Tune functions and fails in
Ray 2.60).
"""

from __future__ import annotations

import math
import tempfile

import ray
import torch
from ray import tune

from engine.train import pick_device, train_and_evaluate
from search_spaces import trial

PLACEMENT_KEYS = ("node_id", "device", "torch_threads")  # added to every result by this adapter, not the engine


def trial_threads() -> int:
    resources = tune.get_context().get_trial_resources().required_resources
    return max(1, math.floor(resources.get("CPU", 1)))


class DependencyFailed(RuntimeError):
    """A staged trial whose earlier stage's run of the same seed failed: it fails too, naming that run."""


def train_trial(config: dict) -> None:
    if (reason := trial.init_error(config)) is not None:
        raise DependencyFailed(f"not run: {reason}")
    cfg = trial.decode(config)
    threads = trial_threads()
    torch.set_num_threads(threads)
    # where it ran, with what: the node (in MLflow and pareto.json), the torch device (Ray exposes only the GPUs
    # it gave this trial, so `auto` picks one of those) and the CPU threads of its resources
    where = dict(zip(PLACEMENT_KEYS, (ray.get_runtime_context().get_node_id(), str(pick_device(cfg.device)),
                                      threads)))

    def report(metrics: dict, save) -> None:
        with tempfile.TemporaryDirectory(prefix="fractune-ckpt-") as d:
            save(d)
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(d))

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        train_and_evaluate(cfg, report=report)
        return
    with checkpoint.as_directory() as d:
        train_and_evaluate(cfg, report=report, resume_from=d)
