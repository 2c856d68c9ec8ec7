"""DFQ training-step time: gated ResNet-38 (batch 64, the paper's seven options incl. skip, 4-bit weights) in
``masked`` mode (the reference: every option for every sample) and ``routed`` mode (each sample only at its
option, one pass per block), against the plain FP32 ResNet-38, in one process with interleaved timing.

The choices are drawn uniformly at random per sample and block (fixed seed, the same for both modes): every
option is in use in every block, the hardest case for routing (a trained gate concentrates its choices), and one
sample in seven skips each block, the hardest case for ``routed_statistics: batch``. The step is the full DFQ
step: gated forward, CE + beta * cost, backward, SGD. ``routed`` is the config's default (the ``sampled``
estimator with its alternative for half the batch, ``routed_statistics: batch``: methods.md §6.3). Target:
routed <= 2.0x FP32 (docs/benchmarks.md has the reference implementation's figure). Last stdout line: one
JSON object with ``masked_ratio``, ``routed_ratio`` (the default) and routed's other settings against FP32:
``routed_computed_half_ratio`` (``computed`` statistics, half batch), ``routed_batch_whole_ratio`` (``batch``,
the alternative for every sample), ``routed_computed_whole_ratio`` (``computed``, every sample: the setting the
published study specs pin), ``routed_skip_ratio`` (the ``skip`` estimator: no alternative pass) and
``routed_exact_ratio`` (``exact``: every other forward group for every sample, masked's gate gradient); with the
reference's five options (no skip), which execution ``conv`` needs, ``noskip_masked_ratio``,
``noskip_routed_ratio`` (the default) and ``noskip_conv_ratio`` (FracTrain's ImageNet design: one pass, every
quantized conv's input quantized at each option for the gate); on CUDA also ``host_syncs_per_step``, how often
each step makes the host wait for the GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import dfq_train_step, emit, fused_off, host_syncs, interleaved, machine, plain_train_step  # noqa: E402
from engine.config.gated_schedule import (  # noqa: E402
    OPTION_PRESETS,
    default_routed_sample_fraction,
    default_routed_statistics,
)
from engine.numerics import fused  # noqa: E402
from engine.numerics.precision import FP32  # noqa: E402

DEFAULTS = (default_routed_sample_fraction("routed", "sampled"), default_routed_statistics("routed"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet38")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (timed with a synchronise after each block)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    options = OPTION_PRESETS["paper"]
    x = torch.randn(args.batch, 3, 32, 32).to(dev)
    y = torch.randint(0, 10, (args.batch,)).to(dev)

    fp32_step = plain_train_step(args.model, x, y, FP32)

    def gated(execution: str, estimator: str = "sampled", fraction: float | None = None,
              statistics: str | None = None, preset: str = "paper"):
        return dfq_train_step(args.model, x, y, execution, estimator, fraction, statistics, options=preset)

    steps = {"fp32": fp32_step, "masked": gated("masked"), "routed": gated("routed"),
             "routed_computed_half": gated("routed", fraction=0.5, statistics="computed"),
             "routed_batch_whole": gated("routed", fraction=1.0, statistics="batch"),
             "routed_computed_whole": gated("routed", fraction=1.0, statistics="computed"),
             "routed_skip": gated("routed", "skip"), "routed_exact": gated("routed", "exact"),
             **{f"noskip_{e}": gated(e, preset="reference") for e in ("masked", "routed", "conv")}}
    if dev.type == "cpu" and fused.status() == "on":  # the default once more with the torch passes instead
        steps["routed_unfused"] = fused_off(gated("routed"))
    t = interleaved(steps, args.rounds, args.steps, warmup=1, sync=sync)
    syncs = host_syncs(steps, dev)
    out = {"bench": "dfq_step", "model": args.model, "batch": args.batch, "options": len(options),
           "device": args.device, "routed_sample_fraction": DEFAULTS[0], "routed_statistics": DEFAULTS[1],
           **{f"{k}_step_s": v for k, v in t.items()},
           **{f"{k}_ratio": v / t["fp32"] for k, v in t.items() if k != "fp32"},
           "target_routed": 2.0, "host_syncs_per_step": syncs,
           **machine()}
    names = {"masked": "masked", "routed": f"routed (default: alternative for {DEFAULTS[0]:g} of the batch, {DEFAULTS[1]} "
                                                "statistics; target <= 2.0x)",
             "routed_computed_half": "routed, half batch, computed statistics",
             "routed_batch_whole": "routed, whole batch, batch statistics",
             "routed_computed_whole": "routed, whole batch, computed statistics",
             "routed_skip": "routed, skip estimator", "routed_exact": "routed, exact estimator",
             "routed_unfused": "routed (default) with the torch passes instead of the fused kernels",
             **{f"noskip_{e}": f"{e}, the reference's five options (no skip)" for e in ("masked", "routed", "conv")}}
    names = {k: v for k, v in names.items() if k in t}
    print(f"{args.model} batch {args.batch}, {len(options)} options: FP32 {t['fp32'] * 1e3:.0f} ms; " + "; ".join(
        f"{name} {t[k] * 1e3:.0f} ms ({out[k + '_ratio']:.2f}x)" for k, name in names.items()))
    if syncs is not None:
        print("host synchronisations per step: " + ", ".join(f"{k} {v}" for k, v in syncs.items()))
    emit(out)


if __name__ == "__main__":
    main()
