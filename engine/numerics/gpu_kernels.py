"""Fused GPU quantizer kernels (docs/methods.md §1, "GPU kernels"): one Triton kernel per quantizer chain.

On a GPU, the torch passes of a quantizer (range, scale, noise, clamp, round, back to values) are about ten
small kernels per quantized tensor, and a step of a small network is bound by how fast the host issues them.
Here each chain is one kernel (two where a whole-tensor range must be reduced first), registered as a
``torch.library`` custom op with a fake implementation so that ``torch.compile`` captures a step that calls it:

* ``fractune::quant_tensor``: per-tensor quantizer over a given range (0-d tensors), or over the tensor's own
  min/max (partial ranges per program, then the quantizer reduces them);
* ``fractune::quant_observe``: the activation quantizer of a layer in training: the batch range, the layer's
  running range updated in place (the EMA of layers.py) and the quantized tensor, from two kernels;
* ``fractune::quant_channel``: the weight quantizer, per output channel (a program per channel, one kernel);
* ``fractune::quant_rows``: routed DFQ's row quantizer: row r at its group's level count, over one range for the
  batch or each group's own range (a kernel for the row ranges, one for the quantizer).

The arithmetic is that of ``quant.quantize`` for a range kept on the device: ``s = max((hi - lo) / qmax, 1e-8)``,
``u = (x - lo) / s`` (IEEE division), clamped to [0, qmax], rounded half to even, ``u * s + lo`` (no fused
multiply-add: kernels are built with ``enable_fp_fusion=False``), so nearest rounding gives the torch passes'
values bit for bit. Stochastic rounding adds ``n = (v + 0.5) / 2^16`` with ``v`` the low 16 bits of a Philox
draw (``tl.randint``, a counter-based generator keyed by the element's index) taken as a signed integer: the
noise is symmetric on [-0.5, 0.5), so rounding stays unbiased; its key is drawn from torch's generator on the
tensor's device at every call, so a seeded run reproduces itself and nothing waits for the host.

The kernels run wherever Triton runs: CUDA, and the CPU under ``TRITON_INTERPRET=1`` (how CI tests them; the
CPU's training path is ``engine/numerics/fused.py``). ``usable(x)`` says whether they take over for ``x``: a CUDA float32
tensor with Triton importable, unless ``FRACTUNE_GPU_KERNELS=0`` (the torch passes, for side-by-side timing);
``on_cpu()`` runs them on CPU tensors too, under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

from engine.numerics.affine import levels
from engine.numerics.fused import SWITCH_VALUES

ENV_SWITCH = "FRACTUNE_GPU_KERNELS"
BLOCK = 1024  # elements per program and loop step
MAX_PARTS = 256  # programs of a whole-tensor kernel (each quantizer program reduces all partial ranges)
MAX_ROWS = 4096  # rows of a row quantizer (a program reads every row's group id and range: one lane each)
SEED_HIGH = 2**31 - 1


def environment_problem() -> str | None:
    """A one-line error for a ``FRACTUNE_GPU_KERNELS`` value that is neither on nor off (None where fine)."""
    value = os.environ.get(ENV_SWITCH)
    if value is None or value.strip().lower() in SWITCH_VALUES:
        return None
    return f"{ENV_SWITCH}: got {value!r}; allowed: {', '.join(SWITCH_VALUES)} (unset: on for CUDA tensors)"


def _switch() -> bool | None:
    value = os.environ.get(ENV_SWITCH)
    return None if value is None else SWITCH_VALUES.get(value.strip().lower())


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _triton_version() -> str | None:
    try:
        import triton
    except Exception:  # noqa: BLE001 - any import failure means: no Triton here
        return None
    return triton.__version__


def status() -> str:
    """Which path a CUDA tensor's quantizers take, for the benches: "on (triton X)" or "off (reason)"."""
    if environment_problem():
        return f"off ({environment_problem()})"
    if _switch() is False:
        return f"off ({ENV_SWITCH}={os.environ[ENV_SWITCH]})"
    version = _triton_version()
    if version is None:
        return "off (triton is not installed)"
    return f"on (triton {version}{', interpreted' if interpreting() else ''})"


_on_cpu = [False]  # set by ``on_cpu()``: the kernels take CPU tensors too, under the interpreter
_off = [False]  # set by ``disabled()``


@contextlib.contextmanager
def _flag(flag: list, value: bool):
    was, flag[0] = flag[0], value
    try:
        yield
    finally:
        flag[0] = was


def on_cpu():
    """Context manager: CPU float32 tensors take the kernels too (under ``TRITON_INTERPRET=1`` only), so the
    GPU path of the engine runs, slowly, where there is no GPU (tests)."""
    if not interpreting():
        raise RuntimeError("gpu_kernels.on_cpu needs TRITON_INTERPRET=1 set before the kernels are first used")
    return _flag(_on_cpu, True)


def disabled():
    """Context manager: the torch passes instead of the kernels, in this process (side-by-side timing)."""
    return _flag(_off, True)


@functools.cache
def _cuda_ready() -> bool:
    """The switch and Triton, looked at once per process: ``usable`` runs for every quantized tensor."""
    return _switch() is not False and _triton_version() is not None


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels quantize ``x``: float32 on CUDA with Triton importable and the switch not off, or
    on the CPU inside ``on_cpu()``; never inside ``disabled()``."""
    if x.dtype != torch.float32 or _off[0]:
        return False
    if x.device.type == "cuda":
        return _cuda_ready()
    return _on_cpu[0] and x.device.type == "cpu"


@functools.cache
def _kernels():
    """The Triton kernels, imported at first use (Triton reads ``TRITON_INTERPRET`` when a kernel is defined)."""
    from engine.numerics import _triton_kernels as k

    return {"partial_range": k.partial_range, "quant_tensor": k.quant_tensor, "quant_channel": k.quant_channel,
            "row_range": k.row_range, "quant_rows": k.quant_rows}


def _levels(bits: int) -> float:
    return float(levels(bits))


def _grid(n: int) -> tuple[int, int]:
    """(programs, elements per program): at most MAX_PARTS programs, each a whole number of blocks."""
    blocks = max(1, -(-n // BLOCK))
    programs = min(MAX_PARTS, blocks)
    return programs, -(-blocks // programs) * BLOCK


def _seed(x: torch.Tensor, stochastic: bool) -> torch.Tensor | None:
    """The Philox key of one stochastic call, drawn from torch's generator on ``x``'s device (no host wait)."""
    return torch.randint(0, SEED_HIGH, (1,), dtype=torch.int64, device=x.device) if stochastic else None


def _launch(kernel, grid, *args, **meta):
    kernel[grid](*args, enable_fp_fusion=False, **meta)


def _quant_tensor_impl(x, bits, lo, hi, seed, run_lo=None, run_range=None, momentum=0.0):
    k = _kernels()
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return out
    rng = out  # a stand-in for the pointers a variant does not read
    programs, per = _grid(n)
    from_parts, observe = lo is None, run_lo is not None
    parts = torch.empty(2 * programs, dtype=x.dtype, device=x.device) if from_parts else rng
    if from_parts:
        _launch(k["partial_range"], (programs,), x, parts, n, per, BLOCK=BLOCK)
    _launch(k["quant_tensor"], (programs,), x, out, n, per, _levels(bits),
            rng if lo is None else lo, rng if hi is None else hi, parts, programs,
            run_lo if observe else rng, run_range if observe else rng, momentum, 1.0 - momentum,
            rng if seed is None else seed,
            FROM_PARTS=from_parts, OBSERVE=observe, STOCHASTIC=seed is not None, BLOCK=BLOCK,
            PARTS=max(16, 1 << (programs - 1).bit_length()))
    return out


@torch.library.custom_op("fractune::quant_tensor", mutates_args=())
def quant_tensor_op(x: torch.Tensor, bits: int, lo: torch.Tensor | None, hi: torch.Tensor | None,
                    seed: torch.Tensor | None) -> torch.Tensor:
    """x quantized per tensor at ``bits``: over [lo, hi] (0-d tensors), or over x's own range when they are
    None; stochastic rounding keyed by ``seed`` (a 1-element int64 tensor), nearest without."""
    return _quant_tensor_impl(x, bits, lo, hi, seed)


@quant_tensor_op.register_fake
def _(x, bits, lo, hi, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("fractune::quant_observe", mutates_args=("run_lo", "run_range"))
def quant_observe_op(x: torch.Tensor, bits: int, run_lo: torch.Tensor, run_range: torch.Tensor,
                     momentum: float) -> torch.Tensor:
    """``quant_tensor`` over x's own range, with the running range updated in place:
    ``run_lo = m * run_lo + (1 - m) * lo``, ``run_range = m * run_range + (1 - m) * (hi - lo)``."""
    return _quant_tensor_impl(x, bits, None, None, None, run_lo, run_range, momentum)


@quant_observe_op.register_fake
def _(x, bits, run_lo, run_range, momentum):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _quant_channel_impl(w, bits):
    w = w.contiguous()
    out = torch.empty_like(w)
    if w.numel():
        row_len = w.numel() // w.shape[0]
        _launch(_kernels()["quant_channel"], (w.shape[0],), w, out, row_len, _levels(bits),
                BLOCK=min(BLOCK, max(16, 1 << (row_len - 1).bit_length())))
    return out


@torch.library.custom_op("fractune::quant_channel", mutates_args=())
def quant_channel_op(w: torch.Tensor, bits: int) -> torch.Tensor:
    """A weight quantized per output channel (dim 0) over each channel's own range, nearest rounding."""
    return _quant_channel_impl(w, bits)


@quant_channel_op.register_fake
def _(w, bits):
    return torch.empty_like(w, memory_format=torch.contiguous_format)


def _quant_rows_impl(x, gid, qmax, lo, hi, seed):
    k = _kernels()
    x = x.contiguous()
    out = torch.empty_like(x)
    n_rows = x.shape[0]
    if x.numel() == 0:
        return out
    row_len = x.numel() // n_rows
    rlo = rhi = qmax
    if lo is None:
        rlo, rhi = torch.empty(n_rows, dtype=x.dtype, device=x.device), torch.empty(n_rows, dtype=x.dtype,
                                                                                      device=x.device)
        _launch(k["row_range"], (n_rows,), x, rlo, rhi, row_len, BLOCK=BLOCK)
    block = min(BLOCK, max(16, 1 << (row_len - 1).bit_length()))
    _launch(k["quant_rows"], (n_rows, -(-row_len // block)), x, out, gid, qmax, n_rows, row_len,
            qmax if lo is None else lo, qmax if hi is None else hi, rlo, rhi, qmax if seed is None else seed,
            GROUP_RANGE=lo is None, STOCHASTIC=seed is not None, BLOCK=block,
            ROWS=max(16, 1 << (n_rows - 1).bit_length()))
    return out


@torch.library.custom_op("fractune::quant_rows", mutates_args=())
def quant_rows_op(x: torch.Tensor, gid: torch.Tensor, qmax: torch.Tensor, lo: torch.Tensor | None,
                  hi: torch.Tensor | None, seed: torch.Tensor | None) -> torch.Tensor:
    """Row r of x (dim 0) at the level count ``qmax[r]`` (float; 0: the row copied unquantized), over [lo, hi]
    (0-d tensors) or, where they are None, over the range of the rows that share its group id ``gid[r]``."""
    return _quant_rows_impl(x, gid, qmax, lo, hi, seed)


@quant_rows_op.register_fake
def _(x, gid, qmax, lo, hi, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------------
# what quant.py and autograd.py call: the custom ops inside a step being compiled, their bodies in eager
# execution (the dispatcher's round of a Python custom op costs more host time than the kernel's launch)


def _eager(op, body):
    return op if torch.compiler.is_compiling() else body


def quantize_tensor(x: torch.Tensor, bits: int, stochastic: bool = False) -> torch.Tensor:
    """``quant.quantize_tensor`` in one or two kernels: per tensor over x's own range."""
    seed = _seed(x, stochastic)
    return _eager(quant_tensor_op, _quant_tensor_impl)(x.detach(), bits, None, None, seed).view(x.shape)


def quantize(x: torch.Tensor, bits: int, lo: torch.Tensor, hi: torch.Tensor, stochastic: bool = False
             ) -> torch.Tensor:
    """``quant.quantize`` over a per-tensor range held on the device (0-d tensors), in one kernel."""
    seed = _seed(x, stochastic)
    return _eager(quant_tensor_op, _quant_tensor_impl)(x.detach(), bits, lo.reshape(()), hi.reshape(()), seed
                                                       ).view(x.shape)


def quantize_observed(x: torch.Tensor, bits: int, run_lo: torch.Tensor, run_range: torch.Tensor,
                      momentum: float) -> torch.Tensor:
    """A layer's activation quantizer in training: x over its own range, the running range updated."""
    if torch.compiler.is_compiling():
        return quant_observe_op(x.detach(), bits, run_lo, run_range, momentum).view(x.shape)
    return _quant_tensor_impl(x.detach(), bits, None, None, None, run_lo, run_range, momentum).view(x.shape)


def quantize_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """``quant.quantize_weight`` in one kernel."""
    return _eager(quant_channel_op, _quant_channel_impl)(w.detach(), bits).view(w.shape)


def quantize_rows(x: torch.Tensor, gid: torch.Tensor, qmax: torch.Tensor, lo, hi, stochastic: bool) -> torch.Tensor:
    """``quant.Triton.rows`` in one or two kernels (``qmax``: per-row levels, 0 for a 32-bit row)."""
    if lo is not None:
        lo, hi = lo.reshape(()), hi.reshape(())
    return _eager(quant_rows_op, _quant_rows_impl)(x.detach(), gid, qmax, lo, hi, _seed(x, stochastic)).view(x.shape)
