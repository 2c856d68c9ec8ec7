"""Exact BitOPs accounting (docs/methods.md §2).

For a conv/linear layer with M forward MACs per sample, one training iteration runs three passes:

    FW  (Y = W * A):        M * a * w
    EB  (dL/dA = W^T dL/dY): M * g * w
    GC  (dL/dW = A * dL/dY): M * a * g

so one sample costs ``sum_l M_l (a_l w_l + g_l w_l + a_l g_l)`` BitOPs, fp32 layers counted at 32x32
(FracTrain's "effective MACs" are BitOPs / 1024; CPT reports GBitOPs). Every conv and linear layer is
counted, stem and FC included, so savings are not overstated (methods.md §9); BN, ReLU and pooling
are not GEMMs and are not counted. The FP32 and FW8/BW8 references of a run use the same counter and the
same layer map: FP32 puts every layer at 32/32/32, FW8/BW8 puts every layer the method quantizes at 8/8/8.
Cost formula: FracTrain supplement / reviews (bit-weighted MACs); Fu et al., CPT (ICLR 2021), GBitOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from engine.models.base import LayerInfo, LayerMap
from engine.precision import FP32, Precision

FW8BW8 = Precision.fwbw(8, 8)


@dataclass(frozen=True)
class PassCost:
    fw: int
    eb: int
    gc: int

    @property
    def total(self) -> int:
        return self.fw + self.eb + self.gc


def layer_cost(macs: int, prec: Precision) -> PassCost:
    """BitOPs of the FW, EB and GC passes of one layer for one sample: ``macs`` times ``prec.pass_bits()``."""
    fw, eb, gc = prec.pass_bits()
    return PassCost(macs * fw, macs * eb, macs * gc)


class BitOpsCounter:
    """Per-sample BitOPs of a model under a layer map, cached per precision (called every iteration)."""

    def __init__(self, table: Sequence[LayerInfo], layer_map: LayerMap):
        self.table = tuple(table)
        self.layer_map = layer_map
        self._per_sample = lru_cache(maxsize=256)(self._compute)

    @property
    def forward_macs(self) -> int:
        return sum(layer.macs for layer in self.table)

    def _compute(self, prec: Precision) -> int:
        return sum(layer_cost(x.macs, self.layer_map.resolve(x.role, prec)).total for x in self.table)

    def per_sample(self, prec: Precision) -> int:
        """BitOPs of one training iteration for one sample when the schedule says ``prec``."""
        return self._per_sample(prec)

    def fp32_per_sample(self) -> int:
        return self.per_sample(FP32)

    def fw8bw8_per_sample(self) -> int:
        return self.per_sample(FW8BW8)

    def per_layer(self, prec: Precision) -> list[dict]:
        rows = []
        for layer in self.table:
            p = self.layer_map.resolve(layer.role, prec)
            c = layer_cost(layer.macs, p)
            rows.append({"layer": layer.name, "role": layer.role, "block": layer.block, "macs": layer.macs,
                         "precision": str(p), "fw": c.fw, "eb": c.eb, "gc": c.gc, "bitops": c.total})
        return rows

    def block_macs(self) -> dict[int, int]:
        """Forward MACs per residual block (omega_l of DFQ with ``block_cost: macs``)."""
        out: dict[int, int] = {}
        for layer in self.table:
            if layer.block is not None:
                out[layer.block] = out.get(layer.block, 0) + layer.macs
        return out


@dataclass
class CostTotals:
    """Cumulative training BitOPs of a run and of its two references (plain ints: exact)."""

    bitops: int = 0
    fp32: int = 0
    fw8bw8: int = 0

    def add(self, bitops: int, fp32: int, fw8bw8: int) -> None:
        self.bitops += bitops
        self.fp32 += fp32
        self.fw8bw8 += fw8bw8

    @property
    def cp(self) -> float:
        """Computation percentage: 100 * cost / fp32 cost."""
        return 100.0 * self.bitops / self.fp32 if self.fp32 else 0.0

    @property
    def savings_vs_fp32(self) -> float:
        return 1.0 - self.bitops / self.fp32 if self.fp32 else 0.0

    @property
    def savings_vs_fw8bw8(self) -> float:
        return 1.0 - self.bitops / self.fw8bw8 if self.fw8bw8 else 0.0

    def state_dict(self) -> dict:
        return {"bitops": self.bitops, "fp32": self.fp32, "fw8bw8": self.fw8bw8}

    def load_state_dict(self, state: dict) -> None:
        self.bitops, self.fp32, self.fw8bw8 = int(state["bitops"]), int(state["fp32"]), int(state["fw8bw8"])
