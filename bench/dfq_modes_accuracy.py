"""Accuracy, held cp and wall time of DFQ's executions on the same short Fashion-MNIST run (ResNet-8, 4000
training images, 3 epochs at batch 64, the paper's seven options, target cp 3 %, the dual cp controller), seeds 0-2
each (``--seeds``), in one process: ``masked`` (the reference: every option on every sample), ``routed`` with the
``sampled`` gate estimator (the default: the chosen option against one sampled alternative per sample) and
``routed`` with the ``skip`` estimator (computing against skipping only). ``--options reference``: the
reference's five options instead (no skip), and ``masked``, ``routed`` (``sampled``) and ``conv`` (FracTrain's
ImageNet design, methods.md §6.3, which takes no skip option). Last stdout line: one JSON object
with per-mode mean/std accuracy, the last epoch's gated cp, wall and CPU seconds, and the time ratios, taken
from CPU seconds (this process's own, which other load on a shared machine does not inflate).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, machine  # noqa: E402
from engine.config.experiment import parse_config  # noqa: E402
from engine.train import train_and_evaluate  # noqa: E402

MODES = {"masked": {"execution": "masked"},
         "routed_sampled": {"execution": "routed", "routed_estimator": "sampled"},
         "routed_skip": {"execution": "routed", "routed_estimator": "skip"}}
NOSKIP_MODES = {"masked": {"execution": "masked"},
                "routed_sampled": {"execution": "routed", "routed_estimator": "sampled"},
                "conv": {"execution": "conv"}}
BASE = {"model": {"name": "resnet8"},
        "data": {"dataset": "fashion-mnist", "train_subset": 4000, "val_fraction": 0.05, "test_subset": 2000,
                 "batch_size": 64},
        "optim": {"epochs": 3, "lr": 0.1, "lr_schedule": "cosine"},
        "schedule": {"kind": "dfq", "options": "paper", "target_cp": 3.0}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--options", choices=("paper", "reference"), default="paper")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    modes = MODES if args.options == "paper" else NOSKIP_MODES
    out: dict = {"bench": "dfq_modes_accuracy", "options": args.options, "seeds": args.seeds, **machine()}
    for mode, overrides in modes.items():
        runs = []
        for seed in out["seeds"]:
            cfg = parse_config({**BASE, "seed": seed,
                                "schedule": {**BASE["schedule"], "options": args.options, **overrides}})
            m = train_and_evaluate(cfg).metrics
            runs.append(m)
            print(f"{mode} seed {seed}: accuracy {m['accuracy']:.4f}, cp_last_epoch {m['cp_last_epoch']:.3f}, "
                  f"{m['wall_seconds']:.0f} s ({m['cpu_seconds']:.0f} s CPU)", flush=True)
        acc = [m["accuracy"] for m in runs]
        out[mode] = {**overrides, "accuracy_mean": statistics.mean(acc), "accuracy_std": statistics.stdev(acc),
                     "cp_last_epoch_mean": statistics.mean(m["cp_last_epoch"] for m in runs),
                     "seconds_mean": statistics.mean(m["wall_seconds"] for m in runs),
                     "cpu_seconds_mean": statistics.mean(m["cpu_seconds"] for m in runs)}
    for mode in (m for m in modes if m != "masked"):
        out[f"time_ratio_masked_vs_{mode}"] = out["masked"]["cpu_seconds_mean"] / out[mode]["cpu_seconds_mean"]
        out[f"accuracy_delta_{mode}_vs_masked"] = out[mode]["accuracy_mean"] - out["masked"]["accuracy_mean"]
    emit(out)


if __name__ == "__main__":
    main()
