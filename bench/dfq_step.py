"""DFQ training-step time: gated ResNet-38 (batch 64, the paper's seven options incl. skip, 4-bit weights) in
``masked`` mode (the reference: every option for every sample) and ``routed`` mode (each sample only at its
option, one pass per block; with the default ``sampled`` gate estimator, which adds one forward-only pass of
every block, and with ``skip``), against the plain FP32 ResNet-38, in one process with interleaved timing.

The choices are drawn uniformly at random per sample and block (fixed seed, the same for both modes): every
option is in use in every block, the hardest case for routing (a trained gate concentrates its choices). The
step is the full DFQ step: gated forward, CE + beta * cost, backward, SGD. ``routed`` uses the config's
default ``routed_statistics``; the other one is timed too (``routed_computed_ratio``, ``routed_batch_ratio``:
``batch`` also runs the samples that skip a block through its pass). Target: routed <= 2.0x FP32 (the
reference implementation measures about 10x FP32 on this machine). Last stdout line: one JSON object with
``masked_ratio``, ``routed_ratio`` (the default, sampled), ``routed_half_ratio`` (sampled with
``routed_sample_fraction`` 0.5: the alternative for half the batch), ``routed_skip_ratio`` and
``routed_exact_ratio`` (the ``exact`` estimator: every other forward group for every sample, masked's gate
gradient), ``routed_batch_half_ratio`` (``routed_statistics: batch`` with the half-batch alternative); on CUDA
also ``host_syncs_per_step``, how often each step makes the host wait for the GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import dfq_train_step, emit, host_syncs, interleaved, machine, plain_train_step  # noqa: E402
from engine.precision import FP32  # noqa: E402
from engine.schedule_config import OPTION_PRESETS, GatedSettings  # noqa: E402

STATISTICS = GatedSettings.model_fields["routed_statistics"].default  # the config's default
OTHER = "computed" if STATISTICS == "batch" else "batch"


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

    def gated(execution: str, estimator: str = "sampled", fraction: float = 1.0, statistics: str = STATISTICS):
        return dfq_train_step(args.model, x, y, execution, estimator, fraction, statistics)

    steps = {"fp32": fp32_step, "masked": gated("masked"), "routed": gated("routed"),
             "routed_half": gated("routed", fraction=0.5),
             "routed_skip": gated("routed", "skip"), "routed_exact": gated("routed", "exact"),
             "routed_other": gated("routed", statistics=OTHER),
             "routed_batch_half": gated("routed", fraction=0.5, statistics="batch")}
    t = interleaved(steps, args.rounds, args.steps, warmup=1, sync=sync)
    syncs = host_syncs(steps, dev)
    out = {"bench": "dfq_step", "model": args.model, "batch": args.batch, "options": len(options),
           "device": args.device,
           "fp32_step_s": t["fp32"], "masked_step_s": t["masked"], "routed_step_s": t["routed"],
           "routed_skip_step_s": t["routed_skip"], "routed_half_step_s": t["routed_half"],
           "masked_ratio": t["masked"] / t["fp32"],
           "routed_ratio": t["routed"] / t["fp32"], "routed_skip_ratio": t["routed_skip"] / t["fp32"],
           "routed_half_ratio": t["routed_half"] / t["fp32"], "routed_exact_step_s": t["routed_exact"],
           "routed_exact_ratio": t["routed_exact"] / t["fp32"],
           "routed_statistics": STATISTICS, f"routed_{STATISTICS}_ratio": t["routed"] / t["fp32"],
           f"routed_{OTHER}_ratio": t["routed_other"] / t["fp32"],
           "routed_batch_half_ratio": t["routed_batch_half"] / t["fp32"],
           "target_routed": 2.0, "host_syncs_per_step": syncs,
           **machine()}
    print(f"{args.model} batch {args.batch}, {len(options)} options: FP32 {t['fp32'] * 1e3:.0f} ms, masked "
          f"{t['masked'] * 1e3:.0f} ms ({out['masked_ratio']:.2f}x), routed {t['routed'] * 1e3:.0f} ms "
          f"({out['routed_ratio']:.2f}x with the default sampled estimator; target <= 2.0x), half-batch alternative "
          f"{t['routed_half'] * 1e3:.0f} ms ({out['routed_half_ratio']:.2f}x), routed with the skip "
          f"estimator {t['routed_skip'] * 1e3:.0f} ms ({out['routed_skip_ratio']:.2f}x), routed with the exact "
          f"estimator {t['routed_exact'] * 1e3:.0f} ms ({out['routed_exact_ratio']:.2f}x); routed with "
          f"routed_statistics {OTHER} (default {STATISTICS}) {t['routed_other'] * 1e3:.0f} ms "
          f"({out[f'routed_{OTHER}_ratio']:.2f}x); with routed_statistics batch and the half-batch alternative "
          f"{t['routed_batch_half'] * 1e3:.0f} ms ({out['routed_batch_half_ratio']:.2f}x)")
    if syncs is not None:
        print("host synchronisations per step: " + ", ".join(f"{k} {v}" for k, v in syncs.items()))
    emit(out)


if __name__ == "__main__":
    main()
