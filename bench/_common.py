"""Helpers shared by the bench scripts: interleaved timing and machine facts."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the architecture: step-time ratios depend on it (an AVX-512
    Xeon runs FP32 convolutions relatively faster than an AMD EPYC of the same class, docs/benchmarks.md)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    import torch

    from engine.numerics import fused, gpu_kernels

    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fused_kernels": fused.status(),
        "gpu_kernels": gpu_kernels.status(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }


def inside(context: Callable, step: Callable[[], None]) -> Callable[[], None]:
    """``step`` run inside a fresh ``context()`` at every call."""

    def run() -> None:
        with context():
            step()
    return run


def fused_off(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with the quantizers' torch passes instead of the fused CPU kernels (engine/numerics/fused.py): the same
    numbers, the speed of the engine without the kernels, for side-by-side figures."""
    from engine.numerics import fused

    return inside(fused.disabled, step)


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


def plain_train_step(model_name: str, x, y, prec) -> Callable[[], None]:
    """One training step of an ungated ``model_name`` on ``x``'s device at precision ``prec`` (FP32, FW8/BW8,
    ...): CE, SGD at lr 0.01 with momentum 0.9, as dfq_step.py and gpu_sharing.py time it. The model is built
    from the global RNG's current state."""
    import torch
    import torch.nn.functional as F

    from engine.models import build_model

    model = build_model(model_name, 3, 10).to(x.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        loss = F.cross_entropy(model(x, prec), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def dfq_train_step(model_name: str, x, y, execution: str = "routed", estimator: str = "sampled",
                   fraction: float | None = None, statistics: str | None = None, channels: int = 3,
                   classes: int = 10, options: str = "paper") -> Callable[[], None]:
    """One DFQ training step of a gated ``model_name`` on ``x``'s device, as dfq_step.py and gpu_sharing.py time
    it: the ``options`` preset (the paper's seven) at 4-bit weights, the choices drawn uniformly per sample and block (fixed
    seed), CE + 0.128 * cost, SGD; ``option_state`` and (where None) ``routed_sample_fraction`` and
    ``routed_statistics`` the config's defaults. A language model (``channels`` 1, ``classes`` its vocabulary)
    takes token rows ``x`` and decides per sequence."""
    import torch
    import torch.nn.functional as F

    from engine.config.gated_schedule import (
        OPTION_PRESETS,
        default_option_state,
        default_routed_sample_fraction,
        default_routed_statistics,
        parse_option,
    )
    from engine.dfq.gate import cost_per_sample, option_kappa
    from engine.dfq.gated import GatedModel
    from engine.models import LayerMap, build_model
    from engine.numerics.precision import Precision

    dev = x.device
    statistics = statistics or default_routed_statistics(execution)
    fraction = default_routed_sample_fraction(execution, estimator) if fraction is None else fraction
    options = [parse_option(o, 4) for o in OPTION_PRESETS[options]]
    torch.manual_seed(1)
    backbone = build_model(model_name, channels, classes)
    backbone.set_layer_map(LayerMap(stem=False, fc=False, head=False, depthwise=Precision.fwbw(8, 16)))
    model = GatedModel(backbone, options, execution, routed_estimator=estimator, sample_fraction=fraction,
                       option_state=default_option_state(execution), routed_statistics=statistics).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(2)
    forced = torch.randint(0, len(options), (len(x), len(backbone.blocks)), generator=gen).to(dev)
    kappa, omega = option_kappa(options).to(dev), torch.ones(len(backbone.blocks), device=dev)

    def step() -> None:
        logits, trace = model(x, forced)
        loss = F.cross_entropy(logits, y) + 0.128 * cost_per_sample(trace, kappa, omega).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


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
