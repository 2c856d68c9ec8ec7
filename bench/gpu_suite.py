"""The GPU suite: quantized training steps against FP32 on one GPU, each path side by side in one process, then
every schedule kind's accuracy on the new path (docs/benchmarks.md, methods.md §1 "GPU kernels", "Captured steps").

Models: ResNet-38 (batch 128, CIFAR-shaped input, SGD) and the small Transformer (64 sequences of 64 tokens,
4,096 words, Adam). Per model and kind (FP32, FW8/BW8, CPT 3->8 with the precision changing at every step, DFQ
routed and masked at the paper's seven options with the choices drawn per sample and block; for ResNet-38 also
DFQ at execution conv, FracTrain's ImageNet design, at the reference's five options), the step time of:

* ``torch``    eager, the quantizers as torch passes (the engine before the GPU kernels; ``gpu_kernels.disabled``),
* ``kernels``  eager, the quantizers as the fused Triton kernels (the engine's default on a GPU),
* ``compiled`` the kernels inside a ``torch.compile``d model (``engine.compile``: ``reduce-overhead`` on CUDA,
  CUDA graphs; ``default`` on the CPU); static kinds only (DFQ runs eager). Its compile time (every precision of
  the kind compiled and its graphs recorded) is reported apart.

The static steps are the engine's own (``runners.make_step``: the loss and accuracy read once per step); the DFQ
steps are bench/_common.py's (``dfq_step.py``'s). Ratios: each path against FP32 run the same way (eager with
eager, compiled with compiled) and the best path of a kind against the best FP32 path; ``host_syncs_per_step``
counts the host's waits for the GPU in one step of each (torch's sync debug mode). Then ``cuda_check.py``'s runs
(every schedule kind trained briefly) on the new path and on the torch passes, and the nearest-rounding
quantizers of both compared bit for bit on the device.

Runs in under 8 minutes on one H100/H200 (``--budget-s`` stops starting new parts past it); ``--quick`` is a
small smoke test of the script on any device. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import dfq_train_step, emit, host_syncs, inside, interleaved, machine  # noqa: E402
from engine.models import LayerMap, build_model  # noqa: E402
from engine.numerics import gpu_kernels, quant  # noqa: E402
from engine.numerics.precision import FP32, Precision  # noqa: E402
from engine.schedules.static_runner import compiled, make_step  # noqa: E402

TARGETS = {"resnet_fw8bw8": 1.3, "resnet_cpt": 1.35, "transformer_fw8bw8": 1.2, "routed": 3.0,
           "routed_to_masked": 0.25, "static_host_syncs": 2}
CPT_BITS = range(3, 9)  # CPT 3->8: the forward bits of one cycle, gradients at 8


class Clock:
    def __init__(self, budget_s: float):
        self.started, self.budget_s = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)


def _sync(dev: torch.device):
    return torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


def _path(fn, path: str):
    """``fn`` run with the torch passes (``torch``) or the kernels (any other path)."""
    return inside(gpu_kernels.disabled, fn) if path == "torch" else fn


def model_steps(name: str, dev: torch.device, batch: int, seq_len: int, vocab: int, mode: str,
                kinds: list[str], cpt_bits=CPT_BITS) -> tuple[dict, dict]:
    """({step name: fn}, {compiled step name: its precisions}) for one model; each static step trains its own
    model built from the same seed."""
    lm = name.startswith("transformer")
    if lm:
        x = torch.randint(0, vocab, (batch, seq_len), device=dev)
        y = torch.randint(0, vocab, (batch * seq_len,), device=dev)
    else:
        x = torch.randn(batch, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)

    def static(precs: list[Precision], path: str):
        torch.manual_seed(0)
        model = build_model(name, 1 if lm else 3, vocab if lm else 10).to(dev)
        if lm:
            model.set_layer_map(LayerMap(stem=False, fc=False))  # the output layer fp32, as training's default
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        compiling = path == "compiled"
        step = make_step(compiled(model, mode) if compiling else model, opt,
                         graphs=compiling and mode == "reduce-overhead")
        turn = [0]

        def run() -> None:
            step(x, y, precs[turn[0] % len(precs)])  # CPT: the next bit-width at every step
            turn[0] += 1
        return _path(run, path)

    precisions = {"fp32": [FP32], "fw8bw8": [Precision.fwbw(8, 8)], "cpt": [Precision.fwbw(b, 8) for b in cpt_bits]}
    steps, compiled_precs = {}, {}
    for kind in kinds:
        if kind in precisions:
            paths = ("eager", "compiled") if kind == "fp32" else ("torch", "kernels", "compiled")
            for path in paths:
                steps[f"{kind}_{path}"] = static(precisions[kind], "torch" if path == "eager" else path)
            compiled_precs[f"{kind}_compiled"] = precisions[kind]
        else:  # dfq_routed, dfq_masked; dfq_conv (no skip option there: the reference's five options)
            execution = kind.split("_")[1]
            for path in ("torch", "kernels"):
                fn = dfq_train_step(name, x, y, execution, channels=1 if lm else 3, classes=vocab if lm else 10,
                                    options="reference" if execution == "conv" else "paper")
                steps[f"{kind}_{path}"] = _path(fn, path)
    return steps, compiled_precs


def time_model(name: str, args, dev: torch.device, clock: Clock) -> dict:
    lm = name.startswith("transformer")
    batch = args.lm_batch if lm else args.batch
    mode = "reduce-overhead" if dev.type == "cuda" else "default"
    kinds = ["fp32", "fw8bw8", "cpt", "dfq_routed", "dfq_masked"] + ([] if lm else ["dfq_conv"])
    steps, compiled_precs = model_steps(name, dev, batch, args.seq_len, args.vocab, mode, kinds,
                                        (3, 8) if args.quick else CPT_BITS)
    sync = _sync(dev)
    compile_s = {}
    for key, precs in compiled_precs.items():  # every precision compiled and its graphs recorded, timed apart
        if clock.left() < args.reserve_s:  # a compile that would leave no time for the rest: left out
            compile_s[key] = "skipped: out of the time budget"
            del steps[key]
            continue
        t = time.perf_counter()
        for _ in range(3 * len(precs)):
            steps[key]()
        sync()
        compile_s[key] = round(time.perf_counter() - t, 2)
    t = interleaved(steps, args.rounds, args.steps, warmup=1, sync=sync)
    syncs = host_syncs(steps, dev)
    ms = {k: round(v * 1e3, 3) for k, v in t.items()}
    best_fp32 = min(v for k, v in t.items() if k.startswith("fp32_"))
    ratios = {}
    for kind in kinds[1:]:
        for path in ("torch", "kernels"):
            ratios[f"{kind}_{path}"] = t[f"{kind}_{path}"] / t["fp32_eager"]
        if f"{kind}_compiled" in t and "fp32_compiled" in t:
            ratios[f"{kind}_compiled"] = t[f"{kind}_compiled"] / t["fp32_compiled"]
        ratios[f"{kind}_best"] = min(v for k, v in t.items() if k.startswith(kind + "_")) / best_fp32
    ratios["routed_to_masked"] = (min(t["dfq_routed_torch"], t["dfq_routed_kernels"])
                                  / min(t["dfq_masked_torch"], t["dfq_masked_kernels"]))
    ratios = {k: round(v, 3) for k, v in ratios.items()}
    print(f"{name} batch {batch}: " + ", ".join(f"{k} {v} ms" for k, v in ms.items()), flush=True)
    print(f"{name} ratios: {ratios}; compile s: {compile_s}; host syncs: {syncs}", flush=True)
    return {"batch": batch, "step_ms": ms, "ratios": ratios, "compile_s": compile_s, "compile_mode": mode,
            "host_syncs_per_step": syncs}


def bit_check(dev: torch.device) -> dict:
    """The kernels' nearest rounding against the torch passes on this device (per tensor over a given range
    and its own, per channel, per row group): the count of differing values, 0 where bit for bit."""
    if not gpu_kernels.usable(torch.zeros(1, device=dev)):
        return {"skipped": f"the kernels do not run on {dev} here"}
    from engine.numerics import passes

    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(64, 16, 32, 32, device=dev, generator=g) * 3
    lo, hi = torch.aminmax(x)
    groups = ((0, 20, Precision.fwbw(3, 8)), (20, 21, Precision.fwbw(32, 32)), (21, 64, Precision.fwbw(6, 4)))
    sizes, gid = passes.layout(groups, 64, dev)
    out = {}
    for bits in (2, 4, 8):
        pairs = {"tensor_range": lambda b=bits: quant.quantize(x, b, lo, hi),
                 "tensor_own": lambda b=bits: quant.quantize_tensor(x, b),
                 "channel": lambda b=bits: quant.quantize_weight(x, b),
                 "rows_groups": lambda b=bits: quant.backend_for(x).rows(
                     x, groups, sizes, gid, [min(p.act, b + 1) if p.act < 32 else 32 for *_, p in groups], None, None,
                     False, torch.empty_like(x))}
        for name, fn in pairs.items():
            with gpu_kernels.disabled():
                want = fn()
            got = fn()
            out[f"{name}_{bits}"] = int((got != want).sum())
    return out


def trainer_syncs(dev: torch.device, text_dir: str) -> dict:
    """The host's waits for the GPU in one training iteration of the engine's own runner (``Trainer._step``:
    the schedule, the step, its bookkeeping) for every run of cuda_check.py (ResNet-8 on digits, and the
    Transformer where the corpus is), after two warm-up iterations."""
    from bench import cuda_check
    from engine.config.experiment import parse_config
    from engine.cost.bitops import CostTotals
    from engine.data.datasets import load_data
    from engine.train import Trainer

    counts = {}
    for name, job in cuda_check.jobs(2, text_dir).items():
        cfg = parse_config({"name": f"syncs_{name}", "device": str(dev), **job})
        data = load_data(cfg.data)
        trainer = Trainer(cfg, data, dev, CostTotals(), None)
        x, y = next(iter(data.train.batches(cfg.data.batch_size, True, False, torch.Generator().manual_seed(0), dev)))

        def step(t=trainer, x=x, y=y) -> None:
            t._step(x, y)
            t.iteration += 1
        for _ in range(2):
            step()
        counts[name] = host_syncs({name: step}, dev)[name]
    return counts


def accuracy(args, dev: torch.device, clock: Clock) -> dict:
    """cuda_check.py's runs on the new path (the kernels; FW8/BW8 and CPT also compiled) and on the torch
    passes."""
    from bench import cuda_check

    result = {}
    plans = [("kernels", {}, False), ("torch", {}, True)]
    if not args.quick:
        plans.insert(1, ("compiled", {"compile": "reduce-overhead" if dev.type == "cuda" else "default"}, False))
    for label, engine, torch_passes in plans:
        if clock.left() < args.reserve_s:
            result[label] = {"skipped": "out of the time budget"}
            continue
        only = list(cuda_check.jobs(args.epochs, args.text_dir))
        if engine:  # compiled: FW8/BW8 and CPT (its bit-widths symbolic); more would cost minutes of compiling
            only = [k for k in only if k in ("fw8bw8", "cpt")]
        if args.quick:
            only = [k for k in only if k in ("fw8bw8", "cpt", "dfq_routed")]
        ctx = gpu_kernels.disabled() if torch_passes else contextlib.nullcontext()
        with ctx:
            result[label] = cuda_check.run(str(dev), args.epochs, only, args.text_dir, engine=engine,
                                           deadline=clock.started + clock.budget_s)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=128, help="ResNet-38's batch")
    ap.add_argument("--lm-batch", type=int, default=64, help="the Transformer's sequences per batch")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="cuda_check's epochs")
    ap.add_argument("--text-dir", default=None, help="the fortunes corpus for cuda_check's language-model runs")
    ap.add_argument("--budget-s", type=float, default=450.0, help="no new part starts past this")
    ap.add_argument("--reserve-s", type=float, default=60.0, help="what a part needs at least to start")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke test: small models and batches, few steps, CPT at 3 and 8 bits alone")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--models", nargs="*", help="these models alone (default: resnet38 and transformer_small; "
                    "with --quick resnet8 and transformer_tiny)")
    ap.add_argument("--interpret", action="store_true",
                    help="on the CPU: the kernels under Triton's interpreter (TRITON_INTERPRET=1), for a smoke test")
    args = ap.parse_args()
    if args.interpret:
        with gpu_kernels.on_cpu():
            return run_suite(args)
    return run_suite(args)


def run_suite(args) -> None:
    dev = torch.device(args.device)
    clock = Clock(args.budget_s)
    models = ["resnet38", "transformer_small"]
    if args.quick:
        models = ["resnet8", "transformer_tiny"]
        args.batch, args.lm_batch, args.seq_len, args.vocab = 8, 4, 8, 64
        args.rounds, args.steps = 1, 1
    models = args.models or models
    from engine.data.text import FORTUNES_DIR

    args.text_dir = args.text_dir or str(FORTUNES_DIR)
    import triton

    out = {"bench": "gpu_suite", "device": str(dev), "triton": triton.__version__,
           "gpu_kernels": gpu_kernels.status(), "targets": TARGETS, "models": {}}
    for name in models:
        if clock.left() < args.reserve_s:
            out["models"][name] = {"skipped": "out of the time budget"}
            continue
        started = time.perf_counter()
        out["models"][name] = time_model(name, args, dev, clock)
        out["models"][name]["wall_s"] = round(time.perf_counter() - started, 1)
    out["trainer_host_syncs_per_step"] = trainer_syncs(dev, args.text_dir) if dev.type == "cuda" else None
    print("host syncs per training iteration:", out["trainer_host_syncs_per_step"], flush=True)
    out["bit_check_differing_values"] = bit_check(dev)
    print("bit check:", out["bit_check_differing_values"], flush=True)
    if not args.skip_accuracy:
        out["accuracy"] = accuracy(args, dev, clock)
    out["wall_s"] = round(time.perf_counter() - clock.started, 1)
    emit({**out, **machine()})


if __name__ == "__main__":
    main()
