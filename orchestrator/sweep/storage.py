"""A sweep's storage folder: the root checked or created, the latest sweep to resume under it, and on a cluster
a folder every node sees (Tune syncs nothing between nodes since Ray 2.7)."""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import ConfigError


def storage_root(storage: str | None, create: bool = True) -> Path:
    """The absolute storage folder; ``create=False`` only checks that it is (or can become) a writable folder."""
    field = "--storage"
    root = Path(storage or os.environ.get("FRACTUNE_STORAGE") or "fractune_runs").expanduser().resolve()
    if not create:
        from results.output import check_output_folder

        return check_output_folder(field, str(root))
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError.single(field, str(root), f"must be a writable folder ({exc.strerror})") from None
    return root


def storage_problem(root: Path) -> str | None:
    """A one-line description when the storage folder is full or no longer writable, else None."""
    import shutil

    try:
        free = shutil.disk_usage(root).free
        probe = root / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return f"--storage {root}: not writable any more ({exc.strerror}); free space and rerun with --resume"
    if free < 1 << 20:
        return (f"--storage {root}: No space left on device ({free} bytes free); free space and rerun with "
                "--resume")
    return None


def latest_sweep_id(root: Path, name: str) -> str:
    candidates = sorted(p.name for p in root.glob(f"{name}-*")
                        if (p / "tuner.pkl").is_file() or (p / "stages.json").is_file())  # staged: stages.json
    if not candidates:
        raise ConfigError.single("--resume", name, f"no sweep named {name!r} to resume under {root}")
    return candidates[-1]


def check_shared_storage(root: Path, timeout_s: float = 60.0) -> None:
    """On a multi-node cluster, refuse a storage folder that some node cannot see (Tune syncs nothing since
    Ray 2.7: a node-local path loses that node's checkpoints). A probe file written here is read on every
    alive node by a zero-CPU task pinned to it."""
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2:
        return
    token = uuid.uuid4().hex
    probe = root / f".shared-probe-{token}"
    probe.write_text(token)

    @ray.remote(num_cpus=0, max_retries=0)
    def sees(path: str, expected: str) -> bool:
        from pathlib import Path

        try:
            return Path(path).read_text() == expected
        except OSError:
            return False

    try:
        refs = [sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            str(probe), token) for node in nodes]
        seen = ray.get(refs, timeout=timeout_s)
    finally:
        probe.unlink(missing_ok=True)
    blind = [node for node, ok in zip(nodes, seen) if not ok]
    if blind:
        raise ConfigError.single("--storage", str(root), f"not shared by every node: {len(blind)} of {len(nodes)} "
                                 f"nodes (e.g. {blind[0][:12]}) cannot see it; give a folder every node mounts "
                                 "(NFS, the compose volume /shared/fractune_runs)")
