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

The same counter prices an iteration under every hardware cost model of ``engine.cost.cost_models`` (``costs``:
model name -> cost of a batch), with the same layer map and the same references; ``bitops`` there is this
module's number, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from engine.cost.cost_models import CostModel, build_models
from engine.models.base import LayerInfo, LayerMap
from engine.numerics.precision import FP32, Precision

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

    def __init__(self, table: Sequence[LayerInfo], layer_map: LayerMap, models: Sequence[CostModel] | None = None):
        self.table = tuple(table)
        self.layer_map = layer_map
        self.models = tuple(build_models() if models is None else models)
        self._per_sample = lru_cache(maxsize=256)(self._compute)
        self._vectors = lru_cache(maxsize=256)(self._compute_vectors)

    @property
    def forward_macs(self) -> int:
        return sum(layer.macs for layer in self.table)

    def _compute(self, prec: Precision) -> int:
        return sum(layer_cost(x.macs, self.layer_map.resolve(x.role, prec)).total for x in self.table)

    def per_sample(self, prec: Precision) -> int:
        """BitOPs of one training iteration for one sample when the schedule says ``prec``."""
        return self._per_sample(prec)

    def _compute_vectors(self, prec: Precision) -> tuple[dict[str, float], dict[str, float]]:
        per_sample, per_iteration = {}, {}
        for model in self.models:
            parts = [model.layer_cost(x, self.layer_map.resolve(x.role, prec)) for x in self.table]
            per_sample[model.name] = sum(p[0] for p in parts)
            per_iteration[model.name] = sum(p[1] for p in parts)
        return per_sample, per_iteration

    def costs(self, prec: Precision, batch: int) -> dict[str, float]:
        """Cost of one training iteration of ``batch`` samples at ``prec`` under every model (``bitops``: exactly
        ``batch * per_sample(prec)``, an int)."""
        per_sample, per_iteration = self._vectors(prec)
        return {name: batch * v + per_iteration[name] for name, v in per_sample.items()}

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
    """Cumulative training BitOPs of a run and of its two references (plain ints: exact), and the same three
    totals under every cost model (``models``: name -> [run, fp32, fw8bw8])."""

    bitops: int = 0
    fp32: int = 0
    fw8bw8: int = 0
    models: dict[str, list] = field(default_factory=dict)

    def add(self, bitops: int, fp32: int, fw8bw8: int) -> None:
        self.bitops += bitops
        self.fp32 += fp32
        self.fw8bw8 += fw8bw8

    def add_costs(self, run: dict[str, float], fp32: dict[str, float], fw8bw8: dict[str, float]) -> None:
        """One iteration (or a block of them) under every model, with its FP32 and FW8/BW8 references."""
        for name, value in run.items():
            acc = self.models.setdefault(name, [0, 0, 0])
            acc[0] += value
            acc[1] += fp32[name]
            acc[2] += fw8bw8[name]

    def merge(self, other: CostTotals) -> None:
        self.add(other.bitops, other.fp32, other.fw8bw8)
        self.add_costs(*({n: v[i] for n, v in other.models.items()} for i in range(3)))

    def model_summary(self) -> dict[str, dict]:
        """Per model: the run's total, its FP32 and FW8/BW8 references and the savings against each."""
        out = {}
        for name, (run, fp32, fw8) in self.models.items():
            out[name] = {"total": float(run), "fp32": float(fp32), "fw8bw8": float(fw8),
                         "savings_vs_fp32": 1.0 - run / fp32 if fp32 else 0.0,
                         "savings_vs_fw8bw8": 1.0 - run / fw8 if fw8 else 0.0}
        return out

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
        return {"bitops": self.bitops, "fp32": self.fp32, "fw8bw8": self.fw8bw8,
                "models": {n: list(v) for n, v in self.models.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.bitops, self.fp32, self.fw8bw8 = int(state["bitops"]), int(state["fp32"]), int(state["fw8bw8"])
        self.models = {n: list(v) for n, v in state.get("models", {}).items()}
