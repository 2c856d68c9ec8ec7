"""DFQ's two cp controllers on the same run: gated cp over iterations, per-epoch means, accuracy.

The same config (the study_fmnist setting by default: ResNet-14, 8000 Fashion-MNIST images, 3 epochs at batch
64, the paper's seven options, routed execution) is trained once with ``controller: reference`` (the papers'
bang-bang sign rule, at the beta the old routed presets used) and once with ``controller: dual`` (the
default), for each target; every iteration's gated cp is recorded. Writes docs/dfq_controllers.png (cp over
iterations, a moving average of 20 iterations over the raw values) unless ``--no-plot``. Last stdout line: one
JSON object with per-controller, per-target epoch means, their relative errors, accuracy and seconds.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import emit, machine  # noqa: E402
from engine.config.experiment import parse_config  # noqa: E402
from engine.cost.bitops import CostTotals  # noqa: E402
from engine.data.datasets import load_data  # noqa: E402
from engine.train import Trainer, pick_device  # noqa: E402

BASE = {"model": {"name": "resnet14"},
        "data": {"dataset": "fashion-mnist", "train_subset": 8000, "val_fraction": 0.05, "test_subset": 2000,
                 "batch_size": 64},
        "optim": {"epochs": 3, "lr": 0.1, "lr_schedule": "cosine"},
        "schedule": {"kind": "dfq", "options": "paper", "weight_bits": 4, "execution": "routed"}}
CONTROLLERS = {"reference": {"controller": "reference", "beta": 1.0}, "dual": {"controller": "dual"}}


def run(tree: dict) -> dict:
    """Train one config, recording the gated cp of every iteration."""
    cfg = parse_config(tree)
    device = pick_device(cfg.device)
    trainer = Trainer(cfg, load_data(cfg.data), device, CostTotals(), None)
    runner, cps = trainer.runner, []
    step = runner.step

    def recording_step(x, y, iteration):
        out = step(x, y, iteration)
        cps.append(runner.last_cp)
        return out

    runner.step = recording_step
    started = time.perf_counter()
    while not trainer.finished:
        trainer.train_epoch()
    result = trainer.result()
    return {"cp": cps, "epoch_cp": [h["cp_gated"] for h in result.history], "accuracy": result.metrics["accuracy"],
            "seconds": time.perf_counter() - started, "iterations_per_epoch": trainer.run.iterations_per_epoch}


def moving_average(values: list[float], n: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - n] if i >= n else 0.0)
        out.append(acc / min(i + 1, n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=float, nargs="+", default=[3.0, 1.5])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=str(ROOT / "docs" / "dfq_controllers.png"))
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    out: dict = {"bench": "dfq_controllers", "seed": args.seed, "setting": BASE, **machine(), "runs": {}}
    traces = {}
    for target in args.targets:
        for name, overrides in CONTROLLERS.items():
            tree = copy.deepcopy(BASE)
            tree["seed"] = args.seed
            tree["schedule"].update(target_cp=target, **overrides)
            r = run(tree)
            traces[(name, target)] = r
            errors = [abs(c / target - 1) for c in r["epoch_cp"]]
            out["runs"][f"{name}_{target:g}"] = {
                "target": target, "epoch_cp": [round(c, 4) for c in r["epoch_cp"]],
                "epoch_rel_error": [round(e, 4) for e in errors], "accuracy": r["accuracy"],
                "seconds": round(r["seconds"], 1), **overrides}
            print(f"{name} target {target:g}: epoch cp {', '.join(f'{c:.3f}' for c in r['epoch_cp'])}, "
                  f"accuracy {r['accuracy']:.4f}", flush=True)
    if not args.no_plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(args.targets), 1, figsize=(9, 3.2 * len(args.targets)), squeeze=False)
        for ax, target in zip(axes[:, 0], args.targets):
            for name, color in (("reference", "tab:red"), ("dual", "tab:blue")):
                r = traces[(name, target)]
                ax.plot(r["cp"], color=color, alpha=0.18, lw=0.8)
                ax.plot(moving_average(r["cp"], 20), color=color, lw=1.6, label=f"{name} (20-iteration mean)")
            ipe = traces[("dual", target)]["iterations_per_epoch"]
            for e in range(1, len(traces[("dual", target)]["epoch_cp"])):
                ax.axvline(e * ipe, color="grey", lw=0.6, ls=":")
            ax.axhline(target, color="black", lw=0.9, ls="--", label=f"target {target:g} %")
            ax.set_ylabel("gated cp (% of FP32)")
            ax.set_title(f"routed DFQ, target {target:g} %: gated cp of every iteration")
            ax.legend(loc="upper right", fontsize=8)
        axes[-1, 0].set_xlabel("iteration")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        out["plot"] = args.plot
    emit(out)


if __name__ == "__main__":
    main()
