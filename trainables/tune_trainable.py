"""The Ray Tune function trainable: a thin adapter around ``engine.train_and_evaluate``.

The sampled trial dict becomes an ``ExperimentConfig`` (``search_spaces.trial.decode``); every epoch's
metrics (the engine's, whatever keys it reports) go out through ``ray.tune.report`` with a checkpoint; a
restarted or restored trial resumes from the furthest readable checkpoint of ``ray.tune.get_checkpoint()`` and
the ones beside it (``resume_point``: damaged ones passed over), and one that had finished reports its last
epoch instead of training again. torch uses as many threads as the trial
has CPUs (and the GPU Ray gave the trial: ``device: auto`` sees only that one). Each result also carries where
the trial ran (``PLACEMENT_KEYS``: node id, torch device and threads), which the tracker keeps as tags, not
metrics. Only ``ray.tune`` APIs are used (``ray.train.*`` is deprecated inside Tune functions and fails in
Ray 2.60).

A result's checkpoint is written to a temporary folder named after the trial's process (``trainables.scratch``)
that Tune copies into the sweep's storage; every trial removes, when it starts, the folders of processes killed
while they had one.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import tempfile
from pathlib import Path

import ray
from ray import tune

from search_spaces import trial
from trainables import scratch

PLACEMENT_KEYS = ("node_id", "device", "torch_threads")  # added to every result by this adapter, not the engine
RAY_TRAIN_DIR = "data_parallel"  # in a data-parallel trial's folder of the sweep's storage: its Ray Train run


def remove_ray_train_runs(experiment: Path) -> None:
    """The Ray Train runs data-parallel trials left in the sweep's folder ``experiment``: a trial removes its own
    as it ends, but not one whose process was killed and never ran again; called once every trial has ended."""
    for folder in experiment.glob(f"*/{RAY_TRAIN_DIR}"):
        shutil.rmtree(folder, ignore_errors=True)


def trial_threads() -> int:
    resources = tune.get_context().get_trial_resources().required_resources
    return max(1, math.floor(resources.get("CPU", 1)))


class DependencyFailed(RuntimeError):
    """A staged trial whose earlier stage's run of the same seed failed: it fails too, naming that run."""


def train_trial(config: dict) -> None:
    # torch and the engine load here, in the trial's process: the driver that passes this function to Tune
    # (orchestrator.sweep.driver, by reference) then runs a whole sweep without importing torch.
    import torch

    from engine.train import pick_device, train_and_evaluate

    # what the imports made lives as long as the process: frozen, the garbage collections of training and of the
    # actor's exit skip it (orchestrator.cli.main.run); once, so a reused actor's later trials are collected whole
    if not gc.get_freeze_count():
        gc.freeze()
    if (reason := trial.init_error(config)) is not None:
        raise DependencyFailed(f"not run: {reason}")
    cfg = trial.decode(config)
    scratch.remove_stale()
    workers = config.get(trial.WORKERS)
    threads = max(1, math.floor(workers["cpu"])) if workers else trial_threads()
    torch.set_num_threads(threads)
    # where it ran, with what: the node (in MLflow and pareto.json), the torch device (Ray exposes only the GPUs
    # it gave this trial, so `auto` picks one of those) and the CPU threads of its resources (of each worker)
    where = dict(zip(PLACEMENT_KEYS, (ray.get_runtime_context().get_node_id(), str(pick_device(cfg.device)),
                                      threads)))

    def report(metrics: dict, save) -> None:
        with tempfile.TemporaryDirectory(prefix=scratch.prefix()) as d:
            save(d)
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(d))

    def train(resume_from: str | None) -> None:
        if cfg.workers == 1:
            train_and_evaluate(cfg, report=report, resume_from=resume_from)
            return
        from trainables.data_parallel import STOP_S, train_epoch_by_epoch

        # A trial Tune stops (ASHA, a time budget) aborts its Ray Train run before its thread ends; Tune, reusing
        # this actor for the next trial, waits for that thread TUNE_FUNCTION_THREAD_TIMEOUT_S (2 s by default)
        # and otherwise kills the actor, which would cut the abort short and leave the workers' CPUs held.
        os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(int(STOP_S) + 5))

        def report_epoch(metrics: dict, folder: str | None) -> None:
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(folder) if folder else None)

        # Ray Train's run lives in the sweep's storage, which every node sees (the sweep checks it): rank 0 writes
        # its checkpoints there from whichever node it runs on, and this trial reads them from its own. (The
        # trial's own folder is a path on this node's disk alone.) A new attempt of the trial restarts from
        # Tune's checkpoint, so an earlier attempt's run is removed, and this one once it ends.
        storage = Path(tune.get_context().get_storage().trial_fs_path) / RAY_TRAIN_DIR
        shutil.rmtree(storage, ignore_errors=True)
        try:
            train_epoch_by_epoch(cfg, workers, str(storage), report_epoch, resume_from)
        finally:
            shutil.rmtree(storage, ignore_errors=True)

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        train(None)
        return
    with checkpoint.as_directory() as given:
        start = resume_point(Path(given))
        if start is None:  # every checkpoint damaged: the trial starts over
            train(None)
            return
        path, state, seen = start
        # the epochs the furthest checkpoint holds beyond Tune's: reported again from its history (the tracker
        # writes each epoch once), so a trial that ended before the saved state caught up does not train again
        missed = [h for h in state.get("history") or [] if h.get("epoch", 0) > seen]
        for i, metrics in enumerate(missed):
            last = i == len(missed) - 1
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(str(path)) if last else None)
        if finished(cfg, state):
            return
        train(str(path))


def resume_point(given: Path) -> tuple[Path, dict, int] | None:
    """Where a restored trial continues: of the checkpoint Tune gives and the trial's other checkpoints beside
    it, the readable one that got furthest (Tune's saved state may lag the trial's last checkpoint by an epoch or
    more after an abrupt stop), with the epoch of Tune's own (0 when it is damaged). A damaged checkpoint is named
    on stderr and passed over; None when none is readable (the trial starts over)."""
    import sys

    from engine import checkpoint as ckpt
    from engine.errors import CheckpointError

    candidates = {given, *(p for p in given.parent.glob("checkpoint_*") if p.is_dir())}
    best, seen = None, 0
    for path in sorted(candidates, key=lambda p: p.name, reverse=True):
        try:
            state = ckpt.load(path)
        except CheckpointError as err:
            print(f"fractune: {err}; passed over", file=sys.stderr)
            continue
        if path == given:
            seen = int(state.get("epoch", 0))
        if best is None or state.get("iteration", 0) > best[1].get("iteration", 0):
            best = (path, state)
    return None if best is None else (*best, seen)


def finished(cfg, state: dict) -> bool:
    """Whether a checkpoint's run had trained all its iterations."""

    run = cfg.run_length()
    return state.get("iteration", 0) >= run.total_iterations or state.get("epoch", 0) >= run.epochs
