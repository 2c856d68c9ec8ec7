"""Every schedule kind trained briefly on one device: the engine's GPU check (CUDA kernels of the quantizers, the
mixed-precision routed pass, the gate and its controller), runnable on CPU for the side-by-side figures.

ResNet-8 on scikit-learn's digits (always present), 2 epochs at batch 64: FP32, FW8/BW8, auto PFQ, CPT 3->8, DFQ
at cp 3 % masked and routed (the default statistics: skip_apart), and routed FracTrain. Per run: test accuracy,
the gated cp of the last epoch (DFQ, FracTrain) and wall seconds. Last stdout line: one JSON object with
``runs`` (name -> figures), ``device`` and the machine facts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, machine  # noqa: E402
from engine.config import parse_config  # noqa: E402
from engine.train import train_and_evaluate  # noqa: E402

SCHEDULES = {
    "fp32": {"kind": "fp32"},
    "fw8bw8": {"kind": "static", "fw": 8, "bw": 8},
    "pfq": {"kind": "pfq"},
    "cpt": {"kind": "cpt", "fw_min": 3, "fw_max": 8},
    "dfq_masked": {"kind": "dfq", "target_cp": 3.0, "execution": "masked"},
    "dfq_routed": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"},
    "fractrain_routed": {"kind": "fractrain", "execution": "routed"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda where a GPU is visible")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=sorted(SCHEDULES), help="these runs alone")
    args = ap.parse_args()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = {}
    for name, schedule in SCHEDULES.items():
        if args.only and name not in args.only:
            continue
        cfg = parse_config({"name": f"cuda_check_{name}", "model": {"name": "resnet8"}, "device": args.device,
                            "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": args.epochs},
                            "schedule": schedule})
        started = time.perf_counter()
        m = train_and_evaluate(cfg).metrics
        runs[name] = {"accuracy": m["accuracy"], "cp_last_epoch": m.get("cp_last_epoch"),
                      "wall_s": round(time.perf_counter() - started, 2)}
        print(name, runs[name], flush=True)
    emit({"bench": "cuda_check", "device": args.device, "epochs": args.epochs, "runs": runs, **machine()})


if __name__ == "__main__":
    main()
