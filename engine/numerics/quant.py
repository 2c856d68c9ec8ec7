"""The quantization math (docs/methods.md §1): small pure functions on tensors.

Asymmetric min/max affine quantization, simulated ("fake quant": quantize then dequantize):

    qmax = 2^b - 1,  s = max((hi - lo) / qmax, 1e-8),  u = (x - lo) / s
    u <- u + n,  n ~ U(-0.5, 0.5)    (stochastic rounding only)
    u <- round(clamp(u, 0, qmax))    (clamp first, then round half-to-even, as the reference)
    x_q = u * s + lo

``lo`` acts as the zero point, so 0 is generally not exactly representable (reference behaviour).
Ranges: weights per output channel, activations and gradients per tensor (methods.md §1).
Per-tensor ranges are Python floats on the CPU and every op after the first works in place on one buffer
(fresh, or scratch where the result is consumed at once): the overhead of quantized training is a handful of
memory passes per layer, not a graph of small ops; where ``engine/numerics/fused.py``'s kernels are loaded, each chain is
one C pass with the same float operations (and the noise the same draw of torch's generator), so the results do
not depend on whether they are (methods.md §1, "Fused kernels"). On an accelerator the per-tensor ranges stay 0-d
tensors on the device (``ranges_on_device``): a Python float would make the host wait for the device at every
quantized tensor, and a GPU step of a small network is bound by how fast the host issues its kernels (methods.md §1, "Devices").
On a CUDA device each quantizer is ``engine/numerics/gpu_kernels.py``'s Triton kernel, the device form's arithmetic in one
kernel (two where the range is the tensor's own; methods.md §1, "GPU kernels").
"""

from __future__ import annotations

import torch

from engine.numerics import fused, gpu_kernels, scratch
from engine.numerics.affine import NOISE_LEVELS, STEP_FLOOR, levels, tensor_step  # noqa: F401  (quant's public names)


def ranges_on_device(x: torch.Tensor) -> bool:
    """Whether ``x``'s per-tensor ranges stay 0-d tensors on its device (an accelerator) instead of Python
    floats (the CPU): reading a float from a GPU waits for every kernel queued before it, and a step being
    compiled (``torch.compile``, methods.md §1 "Captured steps") keeps every value in its graph."""
    return x.device.type != "cpu" or gpu_kernels.usable(x) or torch.compiler.is_compiling()


def tensor_range(x: torch.Tensor) -> tuple[float, float] | tuple[torch.Tensor, torch.Tensor]:
    """Global (lo, hi) of a tensor (one pass): Python floats, or 0-d tensors where ``ranges_on_device``."""
    if not ranges_on_device(x) and x.numel() and fused.usable(x):
        return fused.minmax(x.detach())
    lo, hi = torch.aminmax(x.detach())
    if ranges_on_device(x):
        return lo, hi
    return float(lo), float(hi)


def channel_range(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel (lo, hi) of a weight of shape (C_out, ...), shaped (C_out, 1, ..., 1)."""
    lo, hi = torch.aminmax(w.detach().reshape(w.shape[0], -1), dim=1)
    shape = (w.shape[0],) + (1,) * (w.dim() - 1)
    return lo.reshape(shape), hi.reshape(shape)


def noise_words(like: torch.Tensor, reuse: bool = False) -> torch.Tensor:
    """Integers v uniform on [-2^15, 2^15), shaped like ``like``: n = (v + 0.5) / 2^16 ~ U(-0.5, 0.5).

    On CPU torch's only generator (mt19937) costs ~4.5 ns per float32 and dominated the overhead of
    quantized training; one 64-bit draw here feeds four 16-bit values. The noise is symmetric with 65536
    levels, so rounding stays unbiased to within 2^-17 of a quantization step.
    ``reuse``: draw into a per-thread scratch buffer (CPU only), for callers that consume the words at once.
    The full 64-bit range (``to=None``) is a plain mt19937 draw; an explicit ``to`` costs a 64-bit modulo.
    """
    n = like.numel()
    if torch.compiler.is_compiling():  # in a graph: an out-of-place draw (the compiler has its own generator)
        return torch.randint(-(2**15), 2**15, like.shape, dtype=torch.int16, device=like.device)
    words = scratch.buffer("noise", ((n + 3) // 4,), torch.int64, like.device) if reuse else None
    if words is None:
        words = torch.empty((n + 3) // 4, dtype=torch.int64, device=like.device)
    if like.device.type == "cpu" and fused.usable():
        fused.random_words(words)  # the same draw, stepped in C (methods.md §1, "Fused kernels")
    else:
        words.random_(-(2**63), None)
    return words.view(torch.int16)[:n].view(like.shape)


def uniform_noise(like: torch.Tensor) -> torch.Tensor:
    """Float noise ~ U(-0.5, 0.5) at the resolution ``quantize`` uses (for tests and analysis)."""
    return noise_words(like).to(torch.float32).add_(0.5).div_(NOISE_LEVELS)


def quantize(
    x: torch.Tensor,
    bits: int,
    lo: float | torch.Tensor,
    hi: float | torch.Tensor,
    stochastic: bool = False,
    noise: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fake-quantize ``x`` to ``bits`` over [lo, hi]: floats, or tensors that broadcast against x (per-channel
    ranges, or a per-tensor range kept on the device: 0-d tensors).

    ``noise`` (floats in [-0.5, 0.5) shaped like x) may be passed to make stochastic rounding
    reproducible; otherwise 16-bit noise is drawn from torch's global generator (``noise_words``).
    ``out``: a contiguous float buffer shaped like x to write the result into (e.g. a scratch buffer).
    """
    qmax = levels(bits)
    drawn = stochastic and noise is None
    if noise is None and isinstance(lo, torch.Tensor) and lo.numel() == 1 and gpu_kernels.usable(x):
        return gpu_kernels.quantize(x, bits, lo, hi, stochastic)  # the whole chain in one kernel, same bits
    if isinstance(lo, torch.Tensor):  # per-channel ranges (weights: small tensors), or a range on the device
        step = ((hi - lo) / qmax).clamp_min(STEP_FLOOR)
    else:  # per-tensor range on the host: the device form's step and passes, with Python floats (same bits)
        step = tensor_step(bits, lo, hi, double=x.dtype == torch.float64)
        if (noise is None or not stochastic) and fused.usable(x, out):  # the whole chain in one pass, same bits
            words = noise_words(x, reuse=True) if drawn else None
            return fused.tensor(x.detach(), torch.empty_like(x) if out is None else out, words, lo, step,
                                float(qmax))
    # u = (x - lo) / s, a subtraction then an IEEE division, as the reference and the GPU kernels compute it:
    # x * (1/s) - lo/s rounds differently and can put a value next to a half-level on the other side of it
    u = torch.sub(x.detach(), lo, out=out).div_(step)
    if noise is not None and stochastic:
        u.add_(noise)
    elif drawn:  # n = (v + 0.5) / 2^16, added without materialising a float noise tensor
        u.add_(0.5 / NOISE_LEVELS).add_(noise_words(u, reuse=True), alpha=1.0 / NOISE_LEVELS)
    u.clamp_(0, qmax).round_()
    return u.mul_(step).add_(lo)  # u * s + lo: a multiply, then an add (no fused multiply-add), as on a GPU


def quantize_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Weights: per output channel, nearest rounding, range taken fresh at every call (1.2)."""
    if gpu_kernels.usable(w):
        return gpu_kernels.quantize_weight(w, bits)
    lo, hi = channel_range(w)
    return quantize(w, bits, lo, hi)


def quantize_tensor(x: torch.Tensor, bits: int, stochastic: bool = False, out: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Per-tensor min/max quantization (activations in train mode, gradients in backward)."""
    if gpu_kernels.usable(x):
        return gpu_kernels.quantize_tensor(x, bits, stochastic)
    lo, hi = tensor_range(x)
    return quantize(x, bits, lo, hi, stochastic=stochastic, out=out)
