"""The Ray Tune function trainable: a thin adapter around ``engine.train_and_evaluate``.

The sampled trial dict becomes an ``ExperimentConfig`` (``search_spaces.trial.decode``); every epoch's
metrics (the engine's, whatever keys it reports) go out through ``ray.tune.report`` with a checkpoint; a
restarted or restored trial resumes from ``ray.tune.get_checkpoint()``. torch uses as many threads as the trial
has CPUs (and the GPU Ray gave the trial: ``device: auto`` sees only that one). Each result also carries where
the trial ran (``PLACEMENT_KEYS``: node id, torch device and threads), which the tracker keeps as tags, not
metrics. Only ``ray.tune`` APIs are used (``ray.train.*`` is deprecated inside Tune functions and fails in
Ray 2.60).

A result's checkpoint is written to a temporary folder named after the trial's process
(``fractune-ckpt-PID-...``) that Tune copies into the sweep's storage; a trial killed while reporting cannot
remove its folder, so every trial removes, when it starts, the folders of processes that no longer exist.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import ray
import torch
from ray import tune

from engine.train import pick_device, train_and_evaluate
from search_spaces import trial

PLACEMENT_KEYS = ("node_id", "device", "torch_threads")  # added to every result by this adapter, not the engine
CKPT_PREFIX = "fractune-ckpt-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_checkpoint_folders(where: str | None = None) -> list[str]:
    """Remove the temporary checkpoint folders of trial processes that no longer exist (killed while
    reporting); the folders of live processes are left alone. Returns the removed paths."""
    removed = []
    for folder in Path(where or tempfile.gettempdir()).glob(f"{CKPT_PREFIX}*-*"):
        pid = folder.name[len(CKPT_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) > 0 and folder.is_dir() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def trial_threads() -> int:
    resources = tune.get_context().get_trial_resources().required_resources
    return max(1, math.floor(resources.get("CPU", 1)))


class DependencyFailed(RuntimeError):
    """A staged trial whose earlier stage's run of the same seed failed: it fails too, naming that run."""


def train_trial(config: dict) -> None:
    if (reason := trial.init_error(config)) is not None:
        raise DependencyFailed(f"not run: {reason}")
    cfg = trial.decode(config)
    remove_stale_checkpoint_folders()
    threads = trial_threads()
    torch.set_num_threads(threads)
    # where it ran, with what: the node (in MLflow and pareto.json), the torch device (Ray exposes only the GPUs
    # it gave this trial, so `auto` picks one of those) and the CPU threads of its resources
    where = dict(zip(PLACEMENT_KEYS, (ray.get_runtime_context().get_node_id(), str(pick_device(cfg.device)),
                                      threads)))

    def report(metrics: dict, save) -> None:
        with tempfile.TemporaryDirectory(prefix=f"{CKPT_PREFIX}{os.getpid()}-") as d:
            save(d)
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(d))

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        train_and_evaluate(cfg, report=report)
        return
    with checkpoint.as_directory() as d:
        train_and_evaluate(cfg, report=report, resume_from=d)
