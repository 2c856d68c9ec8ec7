"""Numerics: precision values, the quantizers (torch passes, fused CPU kernels, GPU kernels), their
autograd nodes and the quantized layers (docs/methods.md §1)."""
