"""Training-step time of ResNet-38 (batch 64, CIFAR-shaped input) at FW8/BW8 against FP32, in one process.

ratio = median step time at FW8/BW8 / median step time at FP32 (target <= 1.2 on CPU; the reference
implementation measures about 1.65 on this machine). Steps alternate in blocks so drift hits both alike.
Last stdout line: one JSON object with ``ratio``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench._common import emit, interleaved, machine  # noqa: E402
from engine.models import build_model  # noqa: E402
from engine.precision import FP32, Precision  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet38")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device(args.device)
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
    t = interleaved({"fp32": step(FP32), "fw8bw8": step(Precision.fwbw(8, 8))}, args.rounds, args.steps, sync=sync)
    ratio = t["fw8bw8"] / t["fp32"]
    print(f"{args.model} batch {args.batch} on {dev}: FP32 {t['fp32']*1e3:.1f} ms/step, "
          f"FW8/BW8 {t['fw8bw8']*1e3:.1f} ms/step, ratio {ratio:.3f} (target <= 1.2)")
    emit({"bench": "engine_overhead", "model": args.model, "batch": args.batch, "device": str(dev),
          "fp32_step_s": t["fp32"], "fw8bw8_step_s": t["fw8bw8"], "ratio": ratio, "target": 1.2, **machine()})


if __name__ == "__main__":
    main()
