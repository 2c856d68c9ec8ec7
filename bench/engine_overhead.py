"""Training-step time of ResNet-38 (batch 64, CIFAR-shaped input) at FW8/BW8 against FP32, in one process.

``--model transformer_small`` (or any transformer_*) times the language model instead: ``--batch`` sequences
of ``--seq-len`` tokens over a ``--vocab``-word vocabulary, Adam, the output layer fp32 as in training.

ratio = median step time at FW8/BW8 / median step time at FP32 (target <= 1.2 on CPU; docs/benchmarks.md has
the reference implementation's figure). Steps alternate in blocks so drift hits both alike.
Last stdout line: one JSON object with ``ratio``, on CPU ``fw8bw8_unfused_ratio`` (FW8/BW8 with the quantizers'
torch passes instead of the fused kernels, engine/numerics/fused.py) where the kernels are on, on CUDA
``host_syncs_per_step`` (how often a step makes the host wait for the GPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench._common import emit, fused_off, host_syncs, interleaved, machine  # noqa: E402
from engine.models import LayerMap, build_model, is_language_model  # noqa: E402
from engine.numerics import fused  # noqa: E402
from engine.numerics.precision import FP32, Precision  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet38")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq-len", type=int, default=64, help="language models: tokens per sequence")
    ap.add_argument("--vocab", type=int, default=4096, help="language models: vocabulary size")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if is_language_model(args.model):
        model = build_model(args.model, 1, args.vocab).to(dev)
        model.set_layer_map(LayerMap(stem=False, fc=False))  # the output layer fp32, as training's default
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        x = torch.randint(0, args.vocab, (args.batch, args.seq_len), device=dev)
        y = torch.randint(0, args.vocab, (args.batch * args.seq_len,), device=dev)
    else:
        model = build_model(args.model, 3, 10).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        x = torch.randn(args.batch, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (args.batch,), device=dev)

    def step(prec):
        def run() -> None:
            loss = F.cross_entropy(model(x, prec), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return run

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    steps = {"fp32": step(FP32), "fw8bw8": step(Precision.fwbw(8, 8))}
    if dev.type == "cpu" and fused.status() == "on":  # FW8/BW8 once more with the torch passes (engine/numerics/fused.py)
        steps["fw8bw8_unfused"] = fused_off(steps["fw8bw8"])
    t = interleaved(steps, args.rounds, args.steps, sync=sync)
    syncs = host_syncs(steps, dev)
    ratio = t["fw8bw8"] / t["fp32"]
    unfused = {"fw8bw8_unfused_ratio": t["fw8bw8_unfused"] / t["fp32"]} if "fw8bw8_unfused" in t else {}
    print(f"{args.model} batch {args.batch} on {dev}: FP32 {t['fp32']*1e3:.1f} ms/step, "
          f"FW8/BW8 {t['fw8bw8']*1e3:.1f} ms/step, ratio {ratio:.3f} (target <= 1.2)"
          + (f"; without the fused kernels {unfused['fw8bw8_unfused_ratio']:.3f}" if unfused else ""))
    extra = {"seq_len": args.seq_len, "vocab": args.vocab} if is_language_model(args.model) else {}
    emit({"bench": "engine_overhead", "model": args.model, "batch": args.batch, "device": str(dev), **extra,
          "fp32_step_s": t["fp32"], "fw8bw8_step_s": t["fw8bw8"], "ratio": ratio, "target": 1.2, **unfused,
          "host_syncs_per_step": syncs, **machine()})


if __name__ == "__main__":
    main()
