"""Every schedule kind trained briefly on one device: the engine's GPU check (CUDA kernels of the quantizers, the
mixed-precision routed pass, the gate and its controller), runnable on CPU for the side-by-side figures.

ResNet-8 on scikit-learn's digits (always present), 2 epochs at batch 64: FP32, FW8/BW8, auto PFQ, CPT 3->8, DFQ
at cp 3 % masked (shared and per-option statistics) and routed (the defaults: ``sampled`` for half the batch,
``skip_apart``, ``batch``; and ``routed_statistics: computed``, the ``grouped`` and ``exact`` estimators), routed
FracTrain, and FracTrain at execution conv with the ImageNet preset's options.
Where the embedded corpus (Debian's ``fortunes``, or ``--text-dir``) is present, the small Transformer language
model too, one short epoch each: FW8/BW8, CPT, DFQ masked and routed (per-sequence gating: the mixed-precision
attention products), routed FracTrain. Per run: test accuracy (language models: perplexity), the gated cp of the
last epoch (DFQ, FracTrain) and wall seconds. Last stdout line: one JSON object with ``runs`` (name -> figures),
``device`` and the machine facts.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, machine  # noqa: E402
from engine.config.experiment import GATED_KINDS, parse_config  # noqa: E402
from engine.data.text import FORTUNES_DIR  # noqa: E402
from engine.train import train_and_evaluate  # noqa: E402

SCHEDULES = {
    "fp32": {"kind": "fp32"},
    "fw8bw8": {"kind": "static", "fw": 8, "bw": 8},
    "pfq": {"kind": "pfq"},
    "cpt": {"kind": "cpt", "fw_min": 3, "fw_max": 8},
    "dfq_masked": {"kind": "dfq", "target_cp": 3.0, "execution": "masked"},
    "dfq_masked_per_option": {"kind": "dfq", "target_cp": 3.0, "execution": "masked", "option_state": "per_option"},
    "dfq_routed": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"},
    "dfq_routed_computed": {"kind": "dfq", "target_cp": 3.0, "execution": "routed", "routed_statistics": "computed"},
    "dfq_routed_grouped": {"kind": "dfq", "target_cp": 3.0, "execution": "routed", "routed_estimator": "grouped"},
    "dfq_routed_exact": {"kind": "dfq", "target_cp": 3.0, "execution": "routed", "routed_estimator": "exact"},
    "fractrain_routed": {"kind": "fractrain", "execution": "routed"},
    "fractrain_conv": {"kind": "fractrain", "execution": "conv", "options": ["3/6", "4/8", "6/12", "8/16"],
                       "weight_bits": 6, "cp0": 3.0, "cp_step": 0.5},  # the ImageNet preset's FracTrain
}
LM_SCHEDULES = {
    "lm_fw8bw8": {"kind": "static", "fw": 8, "bw": 8},
    "lm_cpt": {"kind": "cpt", "fw_min": 3, "fw_max": 8, "num_cycles": 2},
    "lm_dfq_masked": {"kind": "dfq", "target_cp": 3.0, "execution": "masked"},
    "lm_dfq_routed": {"kind": "dfq", "target_cp": 3.0, "execution": "routed"},
    "lm_fractrain_routed": {"kind": "fractrain", "execution": "routed"},
}


def jobs(epochs: int, text_dir: str) -> dict[str, dict]:
    """Each run's config sections but name and device, the language models' where the corpus is present."""
    out = {name: {"model": {"name": "resnet8"}, "data": {"dataset": "digits", "batch_size": 64},
                  "optim": {"epochs": epochs}, "schedule": schedule} for name, schedule in SCHEDULES.items()}
    if Path(text_dir).is_dir():
        lm_data = {"dataset": "fortunes", "data_dir": text_dir, "seq_len": 32, "vocab_size": 2048,
                   "batch_size": 16, "train_subset": 480, "test_subset": 160}
        out.update({name: {"model": {"name": "transformer_small"}, "data": lm_data,
                           "optim": {"epochs": 1, "optimizer": "adam", "lr": 0.002, "weight_decay": 0.0},
                           "schedule": schedule} for name, schedule in LM_SCHEDULES.items()})
    return out


def run(device: str, epochs: int, only: list[str] | None, text_dir: str, engine: dict | None = None,
        deadline: float | None = None) -> dict[str, dict]:
    """Train each run (``only``: these alone) and return its figures; ``engine``: the config's engine section
    (``{"compile": "default"}``); past ``deadline`` (a ``time.perf_counter()`` value) no run starts."""
    runs = {}
    for name, job in jobs(epochs, text_dir).items():
        if only and name not in only:
            continue
        if deadline is not None and time.perf_counter() > deadline:
            runs[name] = {"skipped": "out of the time budget"}
            continue
        cfg = parse_config({"name": f"cuda_check_{name}", "device": device, **job, **({"engine": engine} if engine
                                                                                     else {})})
        started = time.perf_counter()
        m = train_and_evaluate(cfg).metrics
        runs[name] = {"accuracy": m.get("accuracy"), "perplexity": m.get("perplexity"),
                      "cp_last_epoch": m.get("cp_last_epoch"), "wall_s": round(time.perf_counter() - started, 2)}
        print(name, runs[name], flush=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda where a GPU is visible")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=sorted({**SCHEDULES, **LM_SCHEDULES}), help="these runs alone")
    ap.add_argument("--text-dir", default=str(FORTUNES_DIR),
                    help="the fortunes corpus for the language-model runs (left out where it is missing)")
    ap.add_argument("--compile", default="off", choices=["off", "default", "reduce-overhead"],
                    help="engine.compile for the runs of fp32, static, PFQ and CPT (DFQ and FracTrain run eager)")
    ap.add_argument("--torch-passes", action="store_true",
                    help="the quantizers' torch passes instead of the GPU kernels (engine/numerics/gpu_kernels.py)")
    args = ap.parse_args()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    only = args.only
    if args.compile != "off":  # the kinds that compile
        table = jobs(args.epochs, args.text_dir)
        only = [k for k in (only or table) if table[k]["schedule"]["kind"] not in GATED_KINDS]
    from engine.numerics import gpu_kernels

    with gpu_kernels.disabled() if args.torch_passes else contextlib.nullcontext():
        runs = run(args.device, args.epochs, only, args.text_dir,
                   {"compile": args.compile} if args.compile != "off" else None)
    emit({"bench": "cuda_check", "device": args.device, "epochs": args.epochs, "compile": args.compile,
          "gpu_kernels": "off (--torch-passes)" if args.torch_passes else gpu_kernels.status(), "runs": runs,
          **machine()})


if __name__ == "__main__":
    main()
