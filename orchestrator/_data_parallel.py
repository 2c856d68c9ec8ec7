"""``train(workers=N)``: one experiment on N data-parallel workers (Ray Train) of a local Ray, or of this
process's node of the Ray it runs on, refused before anything starts where that has too few CPUs for them."""

from __future__ import annotations

from engine.errors import ConfigError, FractuneError


class TrainingFailed(FractuneError):
    """A data-parallel run that failed in its workers: one line, exit 1."""

    exit_code = 1


def check_workers(workers: int) -> None:
    """Workers of a local run: one CPU each, on this machine, or on this process's node of the Ray it runs on or
    attaches to (``RAY_ADDRESS``): the run keeps its checkpoints on this node's disk, so its workers run here."""
    import ray

    from orchestrator.sweep.ray_cluster import attaches, init_ray, local_cpus

    if ray.is_initialized() or attaches(None):
        init_ray(None)
        node = ray.get_runtime_context().get_node_id()
        cpus = int(next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0))
        where = "CPUs of this process's node of the running Ray, which keeps the run's checkpoints"
    else:
        cpus = local_cpus()
        where = "one CPU per worker on this machine, where a local Ray starts"
    if workers > cpus:
        raise ConfigError.single("workers", workers, f"allowed: <= {cpus} ({where})")


def train_on_workers(cfg, resume, report) -> tuple[dict, list[dict]]:
    """``cfg`` on its ``workers`` data-parallel workers of a local Ray (Ray Train), each epoch handed to
    ``report(metrics, save)`` as it ends (``save(folder)`` copies that epoch's checkpoint there), as the engine
    hands its epochs to ``train``'s reporter; returns the summary metrics and the per-epoch history."""
    import shutil
    import tempfile

    from orchestrator.sweep.ray_cluster import init_ray

    init_ray(None)
    from trainables import scratch
    from trainables.data_parallel import train_epoch_by_epoch

    def report_epoch(metrics: dict, folder: str | None) -> None:
        def save(dest) -> None:
            if folder is not None:
                shutil.copytree(folder, dest, dirs_exist_ok=True)

        report(metrics, save)

    # Ray Train's storage for the run, named after this process: a run killed here leaves it, and the next
    # fractune process that makes such a folder on this machine removes it (trainables/scratch.py)
    scratch.remove_stale()
    with tempfile.TemporaryDirectory(prefix=scratch.prefix()) as storage:
        try:
            return train_epoch_by_epoch(cfg, {"cpu": 1, "gpu": 0, "max_failures": 0, "this_node": True}, storage,
                                        report_epoch, resume)
        except RuntimeError as err:  # a worker's error past its restarts: the run failed, not its input
            raise TrainingFailed(f"the run on {cfg.workers} workers failed: {err}") from None
