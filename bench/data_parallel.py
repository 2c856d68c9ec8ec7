"""Data-parallel runs on Ray Train (docs/methods.md §12), side by side in one process on one local Ray:

* ``direct``: one experiment in this process (engine.train_and_evaluate), the one-worker path of today;
* ``train_1``: the same experiment on one Ray Train worker (the overhead of the Train path);
* ``train_2``: two Ray Train workers at half the batch each, the same global batch (the scaling).

Steps per second are the engine's own (iterations over the run's wall seconds, evaluation included, Ray's
start-up excluded); each arm runs ``--repeats`` times, interleaved, and the median counts. One CPU thread per
worker. Prints one JSON object as its last line.

    python bench/data_parallel.py [--epochs 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = {"model": {"name": "resnet8"}, "data": {"dataset": "fashion-mnist", "batch_size": 128, "train_subset": 2560},
        "schedule": {"kind": "static", "fw": 8, "bw": 8}, "device": "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch

    from bench._common import machine
    from engine.config.experiment import ExperimentConfig
    from engine.train import train_and_evaluate
    from orchestrator.sweep.ray_cluster import init_ray
    from trainables.data_parallel import train_data_parallel

    torch.set_num_threads(1)
    init_ray(None)
    tree = {**BASE, "optim": {"epochs": args.epochs}}
    one = ExperimentConfig.model_validate(tree)
    two = ExperimentConfig.model_validate({**tree, "workers": 2, "data": {**tree["data"], "batch_size": 64}})

    def direct():
        return train_and_evaluate(one).metrics

    def on_train(cfg):
        def run():
            with tempfile.TemporaryDirectory() as storage:
                return train_data_parallel(cfg, storage, f"bench-{time.monotonic_ns()}")[0]
        return run

    arms = {"direct": direct, "train_1": on_train(one), "train_2": on_train(two)}
    rates: dict[str, list[float]] = {k: [] for k in arms}
    walls: dict[str, list[float]] = {k: [] for k in arms}
    bitops: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, run in arms.items():
            started = time.perf_counter()
            m = run()
            walls[name].append(time.perf_counter() - started)
            rates[name].append(m["iterations"] / m["wall_seconds"])
            bitops[name] = m["train_bitops"]
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {
        "bench": "data_parallel",
        "config": {**tree, "global_batch": 128},
        "steps_per_s": {k: round(v, 3) for k, v in med.items()},
        "end_to_end_s": {k: round(statistics.median(v), 2) for k, v in walls.items()},
        "train_path_overhead": round(med["direct"] / med["train_1"], 3),  # >1: the Train path is slower
        "speedup_2_workers": round(med["train_2"] / med["train_1"], 3),
        "scaling_efficiency": round(med["train_2"] / (2 * med["train_1"]), 3),
        "same_bitops": bitops["train_2"] == bitops["train_1"] == bitops["direct"],
        "machine": machine(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
