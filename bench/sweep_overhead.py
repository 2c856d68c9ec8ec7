"""Sweep overhead: 8 trials of fixed work through Ray Tune (via fractune's sweep path, MLflow tracking
included) against the same 8 trainings run one after another in this process.

efficiency = (sequential time / concurrency) / Tune wall time; 1.0 means Tune adds nothing. Trials get one
CPU each and run two at a time on two cores; the sequential runs use one torch thread each, like a trial.
Ray's start and the first creation of the MLflow tables happen before the clock starts; the sweep's own
start-up (parent run, worker start, imports) is inside it, so trials must be long enough to amortise it.
Target >= 0.9 on 2 CPUs. Last stdout line: one JSON object with ``efficiency``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

from bench._common import emit, machine  # noqa: E402

BASE = {"model": {"name": "resnet20"}, "data": {"dataset": "digits", "batch_size": 64, "test_subset": 200},
        "optim": {"epochs": 2, "iterations": 500}, "schedule": {"kind": "static", "fw": 8, "bw": 8}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=BASE["optim"]["iterations"])
    ap.add_argument("--concurrency", type=int, default=2)
    args = ap.parse_args()
    base = {**BASE, "optim": {**BASE["optim"], "iterations": args.iterations}}

    import torch

    from engine.config.experiment import parse_config
    from engine.train import train_and_evaluate

    torch.set_num_threads(1)
    t = time.perf_counter()
    for seed in range(args.trials):
        train_and_evaluate(parse_config({**base, "seed": seed}))
    sequential = time.perf_counter() - t
    torch.set_num_threads(os.cpu_count() or 1)

    from orchestrator.sweep.driver import SweepOptions
    from orchestrator.sweep.launch import run_sweep
    from orchestrator.sweep.ray_cluster import init_ray
    from results import store_checks
    from search_spaces.spec import parse_spec

    spec = parse_spec({"name": "bench_overhead", "base": base, "seeds": list(range(args.trials)),
                       "budget": {"max_concurrent_trials": args.concurrency}, "resources": {"cpu": 1}})
    with tempfile.TemporaryDirectory() as tmp:
        # Ray's start and the one-off creation of the MLflow tables are not per-sweep costs: done first.
        init_ray(None)
        store_checks.preflight(f"sqlite:///{tmp}/mlflow.db")
        t = time.perf_counter()
        out = run_sweep(spec, SweepOptions(tracking_uri=f"sqlite:///{tmp}/mlflow.db", storage=f"{tmp}/runs",
                                           progress=False))
        tune_wall = time.perf_counter() - t
    assert out["errored"] == 0, out["errors"]
    efficiency = (sequential / args.concurrency) / tune_wall
    print(f"{args.trials} trials: sequential {sequential:.1f} s, through Tune ({args.concurrency} at a time) "
          f"{tune_wall:.1f} s, efficiency {efficiency:.3f} (target >= 0.9)")
    emit({"bench": "sweep_overhead", "trials": args.trials, "concurrency": args.concurrency,
          "sequential_s": sequential, "tune_wall_s": tune_wall, "efficiency": efficiency, "target": 0.9,
          **machine()})


if __name__ == "__main__":
    main()
