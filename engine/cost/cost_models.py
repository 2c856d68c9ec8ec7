"""Hardware cost models: what one training iteration costs under a chosen price (docs/methods.md §10).

Every model is a small pure function of one conv/linear layer and the precision it runs at, summed over the
layers and the samples exactly like BitOPs (``engine.cost.bitops``). A layer with M forward MACs per sample runs three
passes per training sample, each with two quantized operands (``Precision.pass_bits``' pairs):

    FW (a, w)    EB (g, w)    GC (a, g)

The per-MAC models price one MAC of each pass from its operand widths ``(x, y)``:

* ``bitops``    x * y (the papers' BitOPs, exactly ``Precision.pass_bits``);
* ``macs``      1 (bit-agnostic);
* ``int_units`` each width rounded up to the integer unit widths the hardware offers (4, 8, 16, 32 by default),
                priced by the product of the rounded widths; a pass with an fp32 operand (32 bits: the exact
                fp32 bypass) or a width above the widest unit runs on the FP32 unit at 32 x 32;
* ``energy``    picojoules per MAC from Horowitz, ISSCC 2014 (45 nm, 0.9 V): an integer multiply of x by y
                bits plus a 32-bit integer accumulate; an fp32 MAC is an FP32 multiply plus an FP32 add. The
                table gives 8- and 32-bit integer multiplies; other widths follow the power law in the bit
                product x*y that passes through both (``int_mult_pj``);
* ``table:NAME``  a user's YAML table (width pair -> cost per MAC, ``load_cost_table``).

``memory`` is not per MAC: each pass reads its two operands once at their widths (activations and errors per
sample, weights once per iteration) and the weight gradient is written once per iteration in fp32; it is
reported in bytes. A model's cost of one layer for one sample is ``(per_sample, per_iteration)``: the
per-iteration part (weights) is counted once per training iteration whatever the batch size (0 for the
per-MAC models).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ConfigError
from engine.numerics.precision import FULL_BITS, Precision

DEFAULT_INT_WIDTHS = (4, 8, 16, 32)

# Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, 45 nm at 0.9 V, pJ per op.
HOROWITZ_45NM_PJ = {
    "int8_add": 0.03, "int32_add": 0.1, "int8_mult": 0.2, "int32_mult": 3.1,
    "fp16_add": 0.4, "fp32_add": 0.9, "fp16_mult": 1.1, "fp32_mult": 3.7,
}
# multiplier energy ~ (x*y)^p through the 8x8 and 32x32 points: p = ln(3.1/0.2) / ln(1024/64) = 0.98855
MULT_EXPONENT = math.log(HOROWITZ_45NM_PJ["int32_mult"] / HOROWITZ_45NM_PJ["int8_mult"]) / math.log(1024 / 64)
FP32_MAC_PJ = HOROWITZ_45NM_PJ["fp32_mult"] + HOROWITZ_45NM_PJ["fp32_add"]  # 4.6 pJ


def int_mult_pj(x: int, y: int) -> float:
    """Energy of an x-bit by y-bit integer multiply: ``0.2 pJ * (x*y / 64) ** p``, exact at 8x8 (0.2 pJ) and
    32x32 (3.1 pJ); below 8 bits the same law is extrapolated."""
    return HOROWITZ_45NM_PJ["int8_mult"] * (x * y / 64) ** MULT_EXPONENT


def energy_mac_pj(x: int, y: int) -> float:
    """pJ of one MAC with operands of x and y bits: fp32 when either is 32 bits, else integer multiply + int32 add."""
    if x >= FULL_BITS or y >= FULL_BITS:
        return FP32_MAC_PJ
    return int_mult_pj(x, y) + HOROWITZ_45NM_PJ["int32_add"]


def round_up(bits: int, widths: Sequence[int]) -> int | None:
    """The narrowest unit width that holds ``bits``, or None when none does."""
    return next((w for w in sorted(widths) if w >= bits), None)


def int_units_mac(x: int, y: int, widths: Sequence[int] = DEFAULT_INT_WIDTHS) -> int:
    """x*y after rounding each width up to a unit width; fp32 operands (or wider than every unit): 32 x 32."""
    if x >= FULL_BITS or y >= FULL_BITS:
        return FULL_BITS * FULL_BITS
    rx, ry = round_up(x, widths), round_up(y, widths)
    if rx is None or ry is None or rx >= FULL_BITS or ry >= FULL_BITS:
        return FULL_BITS * FULL_BITS
    return rx * ry


# ---------------------------------------------------------------------------------------------------
# user tables


@dataclass(frozen=True)
class CostTable:
    """A user's accelerator: cost per MAC for (x, y) operand widths; unlisted pairs take the cheapest listed
    pair at least as wide in both operands (pairs are unordered), else the fp32 cost."""

    name: str
    unit: str
    fp32: float
    costs: dict[tuple[int, int], float] = field(default_factory=dict)

    def mac(self, x: int, y: int) -> float:
        if x >= FULL_BITS or y >= FULL_BITS:
            return self.fp32
        lo, hi = min(x, y), max(x, y)
        fits = [c for (a, b), c in self.costs.items() if a >= lo and b >= hi]
        return min(fits) if fits else self.fp32


TABLE_KEYS = ("name", "unit", "fp32", "costs")


MAX_MAC_COST = 1e30  # a run's MACs (about 1e18 for ImageNet) times a MAC's price stays a finite float


def _number(value, where: str, source: str) -> float:
    """A MAC's price: above zero, since every ratio and saving is taken against the FP32 and FW8/BW8 prices."""
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not 0 < value <= MAX_MAC_COST):
        raise ConfigError.single(f"{source}: {where}", value, f"allowed: a number > 0 and <= {MAX_MAC_COST:.0e}")
    return float(value)


def parse_cost_table(tree, source: str = "cost table") -> CostTable:
    """Validate a table's mapping; one-line ``ConfigError`` naming the field, the value and what is allowed."""
    if not isinstance(tree, dict):
        raise ConfigError.single(source, type(tree).__name__, "expected a mapping with keys " + ", ".join(TABLE_KEYS))
    unknown = [k for k in tree if k not in TABLE_KEYS]
    if unknown:
        raise ConfigError.single(f"{source}: {unknown[0]}", unknown[0], "allowed keys: " + ", ".join(TABLE_KEYS))
    name = tree.get("name", "user")
    # the name ends up in MLflow metric keys (train_cost_table_<name>) and in --objective table:<name>
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ConfigError.single(f"{source}: name", name, "allowed: 1 to 64 ASCII letters, digits, '_' and '-'")
    unit = tree.get("unit", "cost")
    if not isinstance(unit, str) or not unit or len(unit) > 32 or not unit.isprintable():
        # printed in tables and on figures: no newline or terminal escape may ride along
        raise ConfigError.single(f"{source}: unit", unit, "allowed: 1 to 32 printable characters (e.g. pJ)")
    if "fp32" not in tree:
        raise ConfigError.single(f"{source}: fp32", None, "required: the cost of a MAC with an fp32 operand")
    fp32 = _number(tree["fp32"], "fp32", source)
    raw = tree.get("costs")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError.single(f"{source}: costs", raw, "expected a mapping of width pairs 'XxY' (e.g. 8x8: 0.3)")
    costs: dict[tuple[int, int], float] = {}
    spelled: dict[tuple[int, int], str] = {}
    for key, value in raw.items():
        m = re.fullmatch(r"([0-9]+)x([0-9]+)", str(key).lower())
        x, y = (int(m[1]), int(m[2])) if m else (0, 0)
        if not (1 <= x < FULL_BITS and 1 <= y < FULL_BITS):
            raise ConfigError.single(f"{source}: costs.{key}", key, "allowed: 'XxY' with integer widths 1..31 "
                                     "(fp32 is priced by the fp32 key)")
        pair = (min(x, y), max(x, y))
        if pair in spelled:  # pairs are unordered: 4x8 and 8x4 are one price
            raise ConfigError.single(f"{source}: costs.{key}", key, f"allowed: each pair once (also given as "
                                     f"{spelled[pair]}; pairs are unordered)")
        spelled[pair] = str(key)
        costs[pair] = _number(value, f"costs.{key}", source)
    return CostTable(name, unit, fp32, costs)


def load_cost_table(path: str | Path) -> CostTable:
    """A user's cost table, through the guarded YAML reader (a regular, bounded UTF-8 file; no alias bombs or
    runaway nesting: engine/safe_yaml.py)."""
    from engine import safe_yaml

    tree = safe_yaml.read_yaml_file(path, "cost.table")
    return parse_cost_table(tree, f"cost table {Path(path).name}")


# ---------------------------------------------------------------------------------------------------
# the models


@dataclass(frozen=True)
class CostModel:
    """One price. ``per_mac(x, y)`` prices one MAC of a pass with operand widths x and y; ``memory`` models
    price a layer's tensors instead (``layer_cost``)."""

    name: str
    unit: str
    per_mac: Callable[[int, int], float] | None = None
    source: str = ""

    def pass_costs(self, prec: Precision) -> tuple[float, float, float]:
        """Cost of one MAC in each of the FW, EB and GC passes; 0s when the layer is skipped."""
        if prec.skip:
            return 0, 0, 0
        a, w, g = prec.act, prec.weight, prec.grad
        return self.per_mac(a, w), self.per_mac(g, w), self.per_mac(a, g)

    def layer_cost(self, layer, prec: Precision) -> tuple[float, float]:
        """(per sample, per iteration) cost of one layer (``LayerInfo``) at ``prec``."""
        if self.per_mac is None:
            return memory_bytes(layer, prec)
        return layer.macs * sum(self.pass_costs(prec)), 0


def memory_bytes(layer, prec: Precision) -> tuple[float, float]:
    """Bytes moved by one layer: per sample, the input activations read by FW and GC at ``act`` bits and the
    output errors read by EB and GC at ``grad`` bits; per iteration, the weights read by FW and EB at
    ``weight`` bits and the weight gradient written in fp32."""
    if prec.skip:
        return 0.0, 0.0
    per_sample = layer.inputs * 2 * prec.act + layer.outputs * 2 * prec.grad
    per_iteration = layer.weights * (2 * prec.weight + FULL_BITS)
    return per_sample / 8, per_iteration / 8


def bitops_mac(x: int, y: int) -> int:
    return x * y


def macs_mac(x: int, y: int) -> int:
    return 1


MODEL_NAMES = ("bitops", "macs", "int_units", "energy", "memory")
UNITS = {"bitops": "BitOPs", "macs": "MACs", "int_units": "unit bit-products", "energy": "pJ", "memory": "bytes"}


def build_models(int_widths: Sequence[int] = DEFAULT_INT_WIDTHS, table: CostTable | None = None) -> list[CostModel]:
    """The built-in models (``MODEL_NAMES``) and, with a user table, ``table:NAME``."""
    widths = tuple(sorted(int_widths))
    models = [
        CostModel("bitops", UNITS["bitops"], bitops_mac, "a*w + g*w + a*g per MAC (FracTrain, CPT)"),
        CostModel("macs", UNITS["macs"], macs_mac, "three MACs per forward MAC, bits ignored"),
        CostModel("int_units", UNITS["int_units"], lambda x, y: int_units_mac(x, y, widths),
                  f"widths rounded up to {'/'.join(map(str, widths))}-bit units; fp32 at 32x32"),
        CostModel("energy", UNITS["energy"], energy_mac_pj, "Horowitz ISSCC 2014, 45 nm"),
        CostModel("memory", UNITS["memory"], None, "operand reads at their widths + fp32 weight gradient"),
    ]
    if table is not None:
        models.append(CostModel(f"table:{table.name}", table.unit, table.mac, "user table"))
    return models


def check_model_name(name: str, field_name: str = "objective", allowed: Sequence[str] = MODEL_NAMES) -> str:
    """A cost model's name (a built-in one, or ``table:NAME`` with a name): the one rule for a sweep spec's
    ``objective`` and every ``--objective`` flag."""
    if name not in allowed and not (name.startswith("table:") and len(name) > len("table:")):
        raise ConfigError.single(field_name, name, "allowed: " + ", ".join(allowed) + ", table:NAME")
    return name

