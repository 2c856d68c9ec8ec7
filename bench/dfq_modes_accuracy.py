"""Accuracy and wall time of DFQ's ``masked`` and ``routed`` execution on the same short Fashion-MNIST run
(ResNet-8, 4000 training images, 3 epochs, the paper's seven options, target cp 3 %), three seeds each, in
one process. Masked uses the reference's beta 0.128; routed uses beta 1.0, as the presets do (at 0.128 the
routed gate collapses to skip on runs this short). Last stdout line: one JSON object with per-mode mean/std accuracy, realised cp and seconds.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, machine  # noqa: E402
from engine.config import parse_config  # noqa: E402
from engine.train import train_and_evaluate  # noqa: E402

BETA = {"masked": 0.128, "routed": 1.0}
BASE = {"model": {"name": "resnet8"},
        "data": {"dataset": "fashion-mnist", "train_subset": 4000, "val_fraction": 0.05, "test_subset": 2000},
        "optim": {"epochs": 3, "lr": 0.1, "lr_schedule": "cosine"},
        "schedule": {"kind": "dfq", "options": "paper", "target_cp": 3.0}}


def main() -> None:
    out: dict = {"bench": "dfq_modes_accuracy", "seeds": [0, 1, 2], **machine()}
    for mode in ("routed", "masked"):
        runs = []
        for seed in out["seeds"]:
            cfg = parse_config({**BASE, "seed": seed, "schedule": {**BASE["schedule"], "execution": mode,
                                                                          "beta": BETA[mode]}})
            m = train_and_evaluate(cfg).metrics
            runs.append(m)
            print(f"{mode} seed {seed}: accuracy {m['accuracy']:.4f}, cp_last_epoch {m['cp_last_epoch']:.3f}, "
                  f"{m['wall_seconds']:.0f} s", flush=True)
        acc = [m["accuracy"] for m in runs]
        out[mode] = {"beta": BETA[mode], "accuracy_mean": statistics.mean(acc), "accuracy_std": statistics.stdev(acc),
                     "cp_last_epoch_mean": statistics.mean(m["cp_last_epoch"] for m in runs),
                     "seconds_mean": statistics.mean(m["wall_seconds"] for m in runs)}
    out["time_ratio_masked_vs_routed"] = out["masked"]["seconds_mean"] / out["routed"]["seconds_mean"]
    emit(out)


if __name__ == "__main__":
    main()
