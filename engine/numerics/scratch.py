"""Reusable per-thread scratch buffers for tensors that never leave the op that fills them.

On CPU a fresh multi-megabyte tensor costs more than the elementwise pass that fills it (allocation,
first-touch page faults, a cold cache line per write); a buffer reused by every layer of the same shape
stays in cache. Only for values consumed before the caller returns (e.g. the quantized gradient handed
to ``convolution_backward``): the next call with the same shape and tag overwrites it.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()  # autograd may run backward on other threads: one pool per thread


def buffer(tag: str, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """A contiguous buffer of ``shape`` for ``tag``, or None off CPU (the caching allocator of an
    accelerator already makes fresh tensors cheap, and reuse across streams would not be safe) and in a step
    being compiled."""
    if device.type != "cpu" or torch.compiler.is_compiling():  # a compiled step plans its own buffers
        return None
    pool = _local.__dict__.setdefault("pool", {})
    flat = pool.get((tag, dtype))
    n = shape.numel() if isinstance(shape, torch.Size) else torch.Size(shape).numel()
    if flat is None or flat.numel() < n:  # one flat buffer per tag, grown to the largest shape seen
        flat = pool[(tag, dtype)] = torch.empty(n, dtype=dtype)
    return flat[:n].view(shape)


def like(x: torch.Tensor, tag: str) -> torch.Tensor | None:
    """``buffer`` shaped, typed and placed like ``x``."""
    return buffer(tag, x.shape, x.dtype, x.device)
