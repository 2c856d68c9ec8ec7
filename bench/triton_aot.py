"""The GPU quantizer kernels (engine/numerics/_triton_kernels.py) compiled ahead of time for a GPU, on a machine
without one: every variant the engine launches (each kernel with its argument types and compile-time constants,
as the wrappers in engine/numerics/gpu_kernels.py pass them for a spread of shapes and modes) goes through
Triton's whole compiler down to machine code (cubin) for the target, sm_90 (H100, H200) by default.

Triton's interpreter, which runs the kernels in CI, executes their Python and never compiles them, so a kernel
the compiler rejects would first fail on a lent GPU. ``make bench-gpu-compat`` runs this under the GPU machines'
own Triton as well. Last stdout line: one JSON object; exit 1 if a variant does not compile.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.numerics import gpu_kernels  # noqa: E402

_DTYPES = {torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8", torch.bool: "i1"}


def _type(value) -> str:
    """Triton's signature type of one runtime argument, as its launcher would type it."""
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def variants() -> list[tuple[str, object, dict, dict]]:
    """(kernel name, kernel, signature, constants) of every launch the wrappers make for the shapes and modes
    below, without running one: the launch is recorded instead."""
    seen: dict[str, tuple[str, object, dict, dict]] = {}

    def record(kernel, grid, *args, **meta):
        fn = kernel.fn
        names = list(inspect.signature(fn).parameters)
        constants = {k: v for k, v in meta.items() if k in names}
        signature = {name: "constexpr" if name in constants else _type(args[i]) for i, name in enumerate(names)}
        key = json.dumps([fn.__name__, signature, constants], sort_keys=True)
        seen.setdefault(key, (fn.__name__, kernel, signature, constants))

    launch, gpu_kernels._launch = gpu_kernels._launch, record
    try:
        zero, one = torch.zeros(()), torch.ones(())
        for n in (7, 5000, 2_000_000):  # one program, a few, many: PARTS 16 to MAX_PARTS
            x = torch.randn(n)
            for stochastic in (False, True):
                gpu_kernels.quantize_tensor(x, 8, stochastic)
                gpu_kernels.quantize(x, 8, zero, one, stochastic)
            gpu_kernels.quantize_observed(x, 8, torch.zeros(()), torch.ones(()), 0.9)
        for shape in ((16, 1, 3, 3), (64, 16, 3, 3), (10, 512), (4, 3000)):  # BLOCK from 16 to its cap
            gpu_kernels.quantize_weight(torch.randn(shape), 8)
        for rows, row_len in ((8, 9), (64, 300), (300, 2048)):
            x = torch.randn(rows, row_len)
            gid = torch.arange(rows, dtype=torch.int64) % 4
            qmax = 2.0 ** (2 + gid.float()) - 1
            for stochastic in (False, True):
                gpu_kernels.quantize_rows(x, gid, qmax, None, None, stochastic)
                gpu_kernels.quantize_rows(x, gid, qmax, zero, one, stochastic)
    finally:
        gpu_kernels._launch = launch
    return list(seen.values())


def compile_all(arch: int = 90) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    start = time.perf_counter()
    found = variants()
    errors = []
    for name, kernel, signature, constants in found:
        try:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                                      target=GPUTarget("cuda", arch, 32))
            if not compiled.asm.get("cubin"):
                errors.append(f"{name} {constants}: no cubin")
        except Exception as err:  # noqa: BLE001 - every variant is tried; each failure is reported
            errors.append(f"{name} {constants}: {type(err).__name__}: {str(err)[:400]}")
    kernels = sorted({v[0] for v in found})
    return {"bench": "triton_aot", "triton": triton.__version__, "torch": torch.__version__, "target": f"sm_{arch}",
            "kernels": kernels, "variants": len(found), "compiled": len(found) - len(errors), "errors": errors,
            "wall_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability as one number (default 90: "
                    "H100, H200)")
    args = ap.parse_args()
    if gpu_kernels.interpreting():
        sys.exit("error: TRITON_INTERPRET is set: the kernels are then defined for the interpreter, which compiles "
                 "nothing; unset it")
    out = compile_all(args.arch)
    for line in out["errors"]:
        print(line, file=sys.stderr)
    print(json.dumps(out))
    sys.exit(1 if out["errors"] else 0)


if __name__ == "__main__":
    main()
