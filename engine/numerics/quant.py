"""The quantizers (docs/methods.md §1): one per kind of tensor, and the one place a backend is picked for a tensor.

The kinds: ``quantize_tensor`` (per tensor over its own min/max: activations in train mode, gradients with
stochastic rounding), ``quantize`` (per tensor over a given range: an activation over its layer's range),
``quantize_weight`` (per output channel, nearest) and ``quantize_rows`` (the row groups of a mixed-precision
batch, each at its own bits: DFQ's routed execution). Each asks ``backend_for`` which backend runs it:

* ``TRITON``: ``gpu_kernels.py``'s Triton kernels, for a CUDA float32 tensor (methods.md §1, "GPU kernels");
* ``FUSED``: ``fused.py``'s C kernels, for a contiguous float32 CPU tensor over a range on the host (methods.md
  §1, "Fused kernels");
* ``TORCH``: the torch passes of ``passes.py`` (the reference arithmetic), everywhere else.

All three give the same bits (nearest rounding everywhere; stochastic rounding the same draw of torch's
generator on the CPU, a Philox key drawn from it on a GPU). On an accelerator the per-tensor ranges stay 0-d
tensors on the device (``ranges_on_device``): a Python float would make the host wait for the device at every
quantized tensor, and a GPU step of a small network is bound by how fast the host issues its kernels
(methods.md §1, "Devices").
"""

from __future__ import annotations

import torch

from engine.numerics import fused, gpu_kernels, passes
from engine.numerics.affine import NOISE_LEVELS, STEP_FLOOR, levels, tensor_step  # noqa: F401  (quant's public names)
from engine.numerics.passes import channel_range, noise_words, uniform_noise  # noqa: F401  (quant's public names)
from engine.numerics.precision import FULL_BITS


class TorchPasses:
    """The torch passes (``passes.py``): any device, dtype and layout, and inside a step being compiled."""

    name = "torch"
    observes = False  # whether ``observe`` takes a layer's batch range and updates its running range in one op

    def ranges_on_device(self, x: torch.Tensor) -> bool:
        return x.device.type != "cpu" or torch.compiler.is_compiling()

    def range(self, x: torch.Tensor):
        return passes.tensor_range(x, self.ranges_on_device(x))

    def tensor(self, x, bits: int, lo, hi, stochastic: bool, out: torch.Tensor | None) -> torch.Tensor:
        return passes.quantize(x, bits, lo, hi, stochastic=stochastic, out=out)

    def own(self, x: torch.Tensor, bits: int, stochastic: bool, out: torch.Tensor | None) -> torch.Tensor:
        lo, hi = self.range(x)
        return self.tensor(x, bits, lo, hi, stochastic, out)

    def channel(self, w: torch.Tensor, bits: int) -> torch.Tensor:
        lo, hi = passes.channel_range(w)
        return passes.quantize(w, bits, lo, hi)

    def row_range(self, rows: torch.Tensor) -> tuple[list[float], list[float]]:
        return rows.amin(1).tolist(), rows.amax(1).tolist()  # two passes: aminmax(dim=1) is far slower

    def row_pass(self, rows, gid, table, x, groups, bits, stochastic, out) -> torch.Tensor:
        return passes.rows_host(rows, gid, table, x, groups, bits, stochastic, out)

    def rows(self, x, groups, sizes, gid, bits, lo, hi, stochastic: bool, out: torch.Tensor) -> torch.Tensor:
        if self.ranges_on_device(x):
            return passes.rows_device(x, groups, sizes, gid, bits, lo, hi, stochastic, out)
        rows = x.reshape(x.shape[0], -1)
        if lo is None:  # each group's own (lo, hi): per-row min/max, reduced per group on the host (one read)
            row_lo, row_hi = self.row_range(rows)
            ranges = [(min(row_lo[s:e]), max(row_hi[s:e])) for s, e, _ in groups]
        else:
            ranges = [(lo, hi)] * len(groups)
        return self.row_pass(rows, gid, passes.group_table(bits, ranges, x.dtype), x, groups, bits, stochastic, out)


class FusedC(TorchPasses):
    """``fused.py``'s C kernels: each chain one pass over a contiguous float32 CPU tensor, a range on the host."""

    name = "fused"

    def ranges_on_device(self, x: torch.Tensor) -> bool:
        return False

    def range(self, x: torch.Tensor):
        return fused.minmax(x.detach()) if x.numel() else super().range(x)

    def tensor(self, x, bits: int, lo, hi, stochastic: bool, out: torch.Tensor | None) -> torch.Tensor:
        step = tensor_step(bits, lo, hi)
        words = passes.noise_words(x, reuse=True) if stochastic else None
        return fused.tensor(x.detach(), torch.empty_like(x) if out is None else out, words, lo, step, float(levels(bits)))

    def row_range(self, rows: torch.Tensor) -> tuple[list[float], list[float]]:
        return fused.row_range(rows)

    def row_pass(self, rows, gid, table, x, groups, bits, stochastic, out) -> torch.Tensor:
        return fused.rows(rows, out, passes.noise_words(out, reuse=True) if stochastic else None, gid, table)


class Triton(TorchPasses):
    """``gpu_kernels.py``'s Triton kernels: a CUDA float32 tensor (a CPU one inside ``gpu_kernels.on_cpu()``), its
    ranges 0-d tensors on the device."""

    name = "triton"
    observes = True

    def ranges_on_device(self, x: torch.Tensor) -> bool:
        return True

    def tensor(self, x, bits: int, lo, hi, stochastic: bool, out: torch.Tensor | None) -> torch.Tensor:
        return gpu_kernels.quantize(x, bits, lo, hi, stochastic)  # the whole chain in one kernel, same bits

    def own(self, x: torch.Tensor, bits: int, stochastic: bool, out: torch.Tensor | None) -> torch.Tensor:
        return gpu_kernels.quantize_tensor(x, bits, stochastic)

    def channel(self, w: torch.Tensor, bits: int) -> torch.Tensor:
        return gpu_kernels.quantize_weight(w, bits)

    def observe(self, x: torch.Tensor, bits: int, run_lo: torch.Tensor, run_range: torch.Tensor, momentum: float
                ) -> torch.Tensor:
        return gpu_kernels.quantize_observed(x, bits, run_lo, run_range, momentum)

    def rows(self, x, groups, sizes, gid, bits, lo, hi, stochastic: bool, out: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > gpu_kernels.MAX_ROWS:  # more rows than a program reads: the torch passes on the device
            return super().rows(x, groups, sizes, gid, bits, lo, hi, stochastic, out)
        levels_r = passes.row_levels(groups, sizes, bits, x, full=0)  # a 32-bit row: 0 levels, copied by the kernel
        return gpu_kernels.quantize_rows(x, gid, levels_r, lo, hi, stochastic)  # in place of ``out``


TORCH, FUSED, TRITON = TorchPasses(), FusedC(), Triton()


def backend_for(x: torch.Tensor, out: torch.Tensor | None = None, lo=None) -> TorchPasses:
    """The one place a quantizer's backend is picked: for ``x`` (its result into ``out``), over ``lo``'s kind of
    range (None: the tensor's own; a Python float: a range on the host; a 0-d tensor: one on the device; a
    larger tensor: per channel)."""
    if isinstance(lo, torch.Tensor) and lo.numel() != 1:
        return TORCH  # per-channel ranges: only the torch passes take them
    on_host = lo is not None and not isinstance(lo, torch.Tensor)
    if not on_host and gpu_kernels.usable(x):
        return TRITON
    if not isinstance(lo, torch.Tensor) and fused.usable(x, out):
        return FUSED
    return TORCH


def ranges_on_device(x: torch.Tensor) -> bool:
    """Whether ``x``'s per-tensor ranges stay 0-d tensors on its device (an accelerator) instead of Python
    floats (the CPU): reading a float from a GPU waits for every kernel queued before it, and a step being
    compiled (``torch.compile``, methods.md §1 "Captured steps") keeps every value in its graph."""
    return backend_for(x).ranges_on_device(x)


def tensor_range(x: torch.Tensor) -> tuple[float, float] | tuple[torch.Tensor, torch.Tensor]:
    """Global (lo, hi) of a tensor (one pass): Python floats, or 0-d tensors where ``ranges_on_device``."""
    return backend_for(x).range(x)


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
    if noise is not None and stochastic:  # a caller's noise: only the torch passes take it
        return passes.quantize(x, bits, lo, hi, stochastic, noise, out)
    return backend_for(x, out, lo).tensor(x, bits, lo, hi, stochastic, out)


def quantize_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Weights: per output channel, nearest rounding, range taken fresh at every call (1.2)."""
    return backend_for(w).channel(w, bits)


def quantize_tensor(x: torch.Tensor, bits: int, stochastic: bool = False, out: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Per-tensor min/max quantization (activations in train mode, gradients in backward)."""
    return backend_for(x, out).own(x, bits, stochastic, out)


def quantize_observed(x: torch.Tensor, bits: int, run_lo: torch.Tensor, run_range: torch.Tensor, momentum: float
                      ) -> torch.Tensor:
    """A layer's activation quantizer in training where the backend ``observes``: x over its own range, the
    layer's running range updated in the same op."""
    return TRITON.observe(x, bits, run_lo, run_range, momentum)


def quantize_rows(x: torch.Tensor, groups, bits_of, lo, hi, stochastic: bool, out: torch.Tensor) -> torch.Tensor:
    """Quantize the row groups of ``x`` (samples along dim 0) at each group's bits (``bits_of(precision)``) into
    ``out``: over the given range (activations: one range for the whole batch), or each group's own (errors).

    Each group gets ``quantize``'s per-tensor arithmetic at its bits over its range (methods.md §1), the same
    bits, but all groups share one set of whole-tensor passes with per-row lo, step and level count: the number
    of passes does not grow with the number of groups (a routed batch has up to one group per option)."""
    sizes, gid = passes.layout(groups, len(x), x.device)  # checks that the groups tile the batch
    bits = [bits_of(prec) for _, _, prec in groups]
    if len(groups) == 1:  # one group: the plain per-tensor quantizer
        if bits[0] >= FULL_BITS:
            return out.copy_(x)
        if lo is None:
            return quantize_tensor(x, bits[0], stochastic=stochastic, out=out)
        return quantize(x, bits[0], lo, hi, stochastic=stochastic, out=out)
    if all(b >= FULL_BITS for b in bits):
        return out.copy_(x)
    return backend_for(x, out).rows(x, groups, sizes, gid, bits, lo, hi, stochastic, out)
