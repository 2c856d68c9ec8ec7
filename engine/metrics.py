"""The names that cross fractune's layers, defined once: the metric keys a run reports, the task a model learns
and its objective, and the keys of the training cost under each cost model.

The engine reports these keys (engine/train.py); the tracker logs them to MLflow, and the orchestrator, the
dashboards and the benches read them back. Pure Python: every layer may import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum
from typing import NamedTuple

# What a run reports each epoch and in its summary (the last epoch's values).
EPOCH = "epoch"
ITERATION = "iteration"
ACCURACY = "accuracy"  # test accuracy (a language model: next-token accuracy)
VAL_ACCURACY = "val_accuracy"
PERPLEXITY = "perplexity"  # a language model's test perplexity, exp(mean CE)
VAL_PERPLEXITY = "val_perplexity"
TRAIN_BITOPS = "train_bitops"  # exact training BitOPs so far (methods.md §2)
FP32_BITOPS = "fp32_bitops"  # the same iterations at FP32
FW8BW8_BITOPS = "fw8bw8_bitops"  # the same iterations at FW8/BW8
CP = "cp"  # the run's computation percentage (DFQ, FracTrain: methods.md §6)
CUM_CP = "cum_cp"
DIVERGED = "diverged"

COST_PREFIX = "train_cost_"  # the cumulative training cost under a cost model other than BitOPs
EPOCH_COST_PREFIX = "epoch_cost_"
TERA = 1e12  # the scale of the readable cost companions (readable_key)


def cost_key(model: str) -> str:
    """The key of a cost model's cumulative training cost: ``train_bitops`` for BitOPs, ``train_cost_<model>``
    for the others (``table:x`` -> ``train_cost_table_x``; engine/cost/cost_models.py)."""
    return TRAIN_BITOPS if model == "bitops" else COST_PREFIX + model.replace(":", "_")


def readable_key(key: str) -> str | None:
    """The readable companion of an exact cost metric (a count in the 10^12 to 10^16 range that MLflow's run list
    cuts off), or None for any other metric: the same key with its quantity word prefixed by ``t`` (tera,
    value / 10^12, a float): ``train_bitops`` -> ``train_tbitops``, ``step_bitops`` -> ``step_tbitops``,
    ``train_cost_energy`` -> ``train_tcost_energy`` (pJ -> J), ``epoch_cost_memory`` -> ``epoch_tcost_memory``
    (bytes -> TB). The engine's own scaled keys (``cum_gbitops``, ``train_gbitops``) and per-unit ones
    (``bitops_per_token``) have none."""
    head, _, last = key.rpartition("_")
    if last == "bitops":
        return f"{head}_tbitops" if head else "tbitops"
    for prefix in (COST_PREFIX, EPOCH_COST_PREFIX):
        if key.startswith(prefix) and len(key) > len(prefix):
            return f"{prefix[:-5]}tcost_{key[len(prefix):]}"
    return None


TRAIN_TBITOPS = readable_key(TRAIN_BITOPS)
READABLE_FIGURES = 4  # the significant figures of a readable companion: what a person reads off a column
CP_PCT = "cp_pct"  # the readable companion of cum_cp (the run's computation percentage so far)
CP_GATED = "cp_gated"  # DFQ/FracTrain: an epoch's cp on the gated blocks (methods.md §6)
CP_GATED_PCT = "cp_gated_pct"  # its readable companion
PERCENT_COMPANIONS = {CUM_CP: CP_PCT, CP_GATED: CP_GATED_PCT}  # the percentages the MLflow view shows as columns
# the readable companion that puts training cost on a log scale: MLflow's scatter charts have a linear axis only,
# on which FP32 (decades dearer) squeezes every quantized trial against the axis
TRAIN_BITOPS_LOG10 = "train_bitops_log10"


def readable_value(value: float) -> float:
    """``value`` to ``READABLE_FIGURES`` significant figures (NaN and infinities as they are)."""
    return float(f"{value:.{READABLE_FIGURES}g}") if math.isfinite(value) else value


def readable_companions(key: str, value: float) -> dict[str, float]:
    """The readable companions of one reported metric, each rounded to what a person reads, for the columns and
    charts of MLflow's UI (the exact value stays in its own metric): an exact cost in tera-units
    (``readable_key``), ``cum_cp`` and ``cp_gated`` as ``cp_pct`` and ``cp_gated_pct``, and ``train_bitops`` also
    as its base-10 logarithm
    (``train_bitops_log10``, to 4 decimals: 18 and 19 TBitOPs stay apart)."""
    out = {}
    if (tera := readable_key(key)) is not None:
        out[tera] = readable_value(value / TERA)
    if key in PERCENT_COMPANIONS:
        out[PERCENT_COMPANIONS[key]] = readable_value(value)
    if key == TRAIN_BITOPS and value > 0 and math.isfinite(value):
        out[TRAIN_BITOPS_LOG10] = round(math.log10(value), 4)
    return out


class Objective(NamedTuple):
    """A metric to optimise and its direction (``max`` or ``min``)."""

    key: str
    mode: str


class Task(StrEnum):
    """What a model learns; it decides the quality objective of a sweep, its fronts and its tables."""

    CLASSIFIER = "classifier"
    LANGUAGE_MODEL = "language_model"

    @property
    def objective(self) -> Objective:
        """Accuracy (max) for a classifier, test perplexity (min) for a language model."""
        return Objective(PERPLEXITY, "min") if self is Task.LANGUAGE_MODEL else Objective(ACCURACY, "max")

    @classmethod
    def of_rows(cls, rows: Iterable[dict]) -> Task:
        """The task of logged runs: a language model's runs are those that report a test perplexity."""
        lm = any(math.isfinite(r.get(PERPLEXITY, math.nan)) for r in rows)
        return cls.LANGUAGE_MODEL if lm else cls.CLASSIFIER
