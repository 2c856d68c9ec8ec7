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


def emit(result: dict) -> None:
    """The last stdout line of every bench script: one JSON object."""
    print(json.dumps(result, sort_keys=True))
