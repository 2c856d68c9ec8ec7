"""Trials sharing one device: training throughput of 1, 2, 4, ... processes on one GPU, side by side in one run.

A trial of the CIFAR-size ResNets leaves a GPU mostly idle: its step is bound by how fast the host issues
kernels (docs/benchmarks.md, ``engine_overhead.py --device cuda``), so several trials on one GPU, each with its
own CPU, may train faster together than one alone. This measures it, to size a sweep's ``resources`` (``gpu:
0.25`` puts four trials on a GPU, docs/cluster.md). Each process trains ResNet-38 (``--model``) at batch
``--batch`` for ``--seconds`` with ``--threads`` torch threads, at FW8/BW8 (``--schedule static``, what static,
PFQ and CPT trials run) or routed DFQ with random choices (``--schedule routed``); all processes start their
timed loop together. Figures per process count: steps per second of all processes together, and the speedup
over one process. Last stdout line: one JSON object with ``throughput`` and ``speedup`` (process count -> value)
and ``peak_memory_gib`` (one process's peak of allocated device memory, CUDA).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import dfq_train_step, emit, machine, plain_train_step  # noqa: E402


def _worker(args: argparse.Namespace, rank: int, barrier, results) -> None:
    import torch

    from engine.numerics.precision import Precision

    torch.set_num_threads(args.threads)
    torch.manual_seed(rank)
    dev = torch.device(args.device)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if args.schedule == "routed":
        step = dfq_train_step(args.model, x, y)
    else:
        step = plain_train_step(args.model, x, y, Precision.fwbw(8, 8))

    for _ in range(3):
        step()
    sync()
    barrier.wait()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        step()
        steps += 1
    sync()
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    results.put((rank, steps, time.perf_counter() - start, peak))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (the point of it) or cpu")
    ap.add_argument("--model", default="resnet38")
    ap.add_argument("--batch", type=int, default=128, help="the papers' CIFAR batch")
    ap.add_argument("--schedule", choices=["static", "routed"], default="static")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4], help="process counts to compare")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (a trial's CPUs)")
    ap.add_argument("--seconds", type=float, default=15.0, help="timed loop per process")
    args = ap.parse_args()
    if any(n < 1 for n in args.procs):
        ap.error(f"--procs {args.procs}: every count must be >= 1")
    for flag, value, least in (("--batch", args.batch, 1), ("--threads", args.threads, 1)):
        if value < least:
            ap.error(f"{flag} {value}: must be >= {least}")
    if not args.seconds > 0:
        ap.error(f"--seconds {args.seconds}: must be > 0")
    import torch

    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r}: allowed: cuda, cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible here; allowed here: cpu")
    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    throughput = {}
    for n in args.procs:
        barrier, results = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(args, r, barrier, results)) for r in range(n)]
        for p in procs:
            p.start()
        try:
            got = [results.get(timeout=args.seconds + 600) for _ in procs]
        except queue.Empty:
            got = None
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if got is None or any(p.exitcode for p in procs):
            sys.exit(f"gpu_sharing: a worker of the {n}-process run failed (exit codes {[p.exitcode for p in procs]})")
        throughput[n] = sum(steps / secs for _, steps, secs, _ in got)
        peak_gib = max(peak for *_, peak in got) / 2**30
        print(f"{n} process(es): {throughput[n]:.2f} steps/s together "
              f"({', '.join(f'{steps / secs:.2f}' for _, steps, secs, _ in sorted(got))} each)"
              + (f", peak device memory {peak_gib:.2f} GiB per process" if peak_gib else ""), flush=True)
    base = throughput[args.procs[0]]
    emit({"bench": "gpu_sharing", "device": args.device, "model": args.model, "batch": args.batch,
          "schedule": args.schedule, "threads_per_process": args.threads, "seconds": args.seconds,
          "throughput": throughput, "speedup": {n: t / base for n, t in throughput.items()},
          "peak_memory_gib": peak_gib, **machine()})


if __name__ == "__main__":
    main()
