"""Helpers shared by the bench scripts: interleaved timing and machine facts."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable


def machine() -> dict:
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }


def interleaved(fns: dict[str, Callable[[], None]], rounds: int, steps: int, warmup: int = 2,
                sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median seconds per call of each fn, measured in alternating blocks so drift hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t) / steps)
    return {k: statistics.median(v) for k, v in samples.items()}


def host_syncs(fns: dict[str, Callable[[], None]], device) -> dict[str, int] | None:
    """How often one call of each fn makes the host wait for the GPU (torch's CUDA sync debug mode: reading a
    value, a blocking copy, ``nonzero``, ...); None off CUDA. A step of a small network on a GPU is bound by how
    fast the host issues kernels, and every wait drains the queue the host had built up."""
    if device.type != "cuda":
        return None
    import warnings

    import torch

    counts = {}
    for name, fn in fns.items():
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[name] = sum("synchroniz" in str(w.message) for w in caught)
    return counts


def emit(result: dict) -> None:
    """The last stdout line of every bench script: one JSON object."""
    print(json.dumps(result, sort_keys=True))
