"""``train(workers=N)``: one experiment on N data-parallel workers (Ray Train) of a local Ray, or of this
process's node of the Ray it runs on, refused before anything starts where that has too few CPUs (or GPUs, for
GPU workers) for them."""

from __future__ import annotations

from engine.errors import ConfigError, FractuneError


class TrainingFailed(FractuneError):
    """A data-parallel run that failed in its workers: one line, exit 1."""

    exit_code = 1


def check_workers(cfg) -> dict:
    """The resources of each of ``cfg``'s workers, refused where this node cannot hold them all: one CPU each, and
    one GPU each where the config's device asks for GPUs (``cuda``, or ``auto`` on a node that has any). The node
    is this machine (a local Ray starts here) or this process's node of the Ray it runs on or attaches to
    (``RAY_ADDRESS``): the run keeps its checkpoints on this node's disk, so its workers run here."""
    import ray

    from orchestrator.sweep.ray_cluster import attaches, init_ray, local_cpus, local_gpus

    if ray.is_initialized() or attaches(None):
        init_ray(None)
        node = ray.get_runtime_context().get_node_id()
        have = next((n["Resources"] for n in ray.nodes() if n["NodeID"] == node), {})
        cpus, gpus = int(have.get("CPU", 0)), int(have.get("GPU", 0))
        where = "of this process's node of the running Ray, which keeps the run's checkpoints"
    else:
        # torch only where GPUs may be used: a CPU run's driver never needs it
        cpus, gpus = local_cpus(), local_gpus() if cfg.device != "cpu" else 0
        where = "of this machine, where a local Ray starts"
    workers = cfg.workers
    gpu = 1 if cfg.device == "cuda" or (cfg.device == "auto" and gpus > 0) else 0
    if gpu and workers > gpus:
        raise ConfigError.single("workers", workers, f"allowed: <= {gpus} (GPUs {where}: one a worker for device "
                                 f"{cfg.device}; device: cpu runs the workers on CPUs)")
    if workers > cpus:
        raise ConfigError.single("workers", workers, f"allowed: <= {cpus} (CPUs {where}: one a worker)")
    return {"cpu": 1, "gpu": gpu}


def train_on_workers(cfg, resources: dict, resume, report) -> tuple[dict, list[dict]]:
    """``cfg`` on its ``workers`` data-parallel workers (``resources`` each, as ``check_workers`` gave them) of a
    local Ray or of this process's node (Ray Train), each epoch handed to
    ``report(metrics, save)`` as it ends (``save(folder)`` copies that epoch's checkpoint there), as the engine
    hands its epochs to ``train``'s reporter; returns the summary metrics and the per-epoch history."""
    import tempfile
    from pathlib import Path

    from orchestrator.sweep.ray_cluster import init_ray
    from results.output import write_atomic

    init_ray(None)
    from trainables import scratch
    from trainables.data_parallel import train_epoch_by_epoch

    def report_epoch(metrics: dict, folder: str | None) -> None:
        def save(dest) -> None:
            if folder is None:
                return
            # each file written beside its place, then moved into it: a copy killed midway never leaves a
            # half-written checkpoint where --resume looks
            for src in Path(folder).rglob("*"):
                if src.is_file():
                    target = Path(dest) / src.relative_to(folder)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(target, src.read_bytes())

        report(metrics, save)

    # Ray Train's storage for the run, named after this process: a run killed here leaves it, and the next
    # fractune process that makes such a folder on this machine removes it (trainables/scratch.py)
    scratch.remove_stale()
    with tempfile.TemporaryDirectory(prefix=scratch.prefix()) as storage:
        try:
            return train_epoch_by_epoch(cfg, {**resources, "max_failures": 0, "this_node": True}, storage,
                                        report_epoch, resume)
        except RuntimeError as err:  # a worker's error past its restarts: the run failed, not its input
            raise TrainingFailed(f"the run on {cfg.workers} workers failed: {err}") from None
