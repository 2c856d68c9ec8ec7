"""The ``schedule`` section of an experiment: one class per ``kind`` (a discriminated union in
experiment.py). Each kind knows its name in tables (``label()``) and whether a gate prices it (``gated``).

fp32 / static (docs/methods.md §1), pfq (FracTrain PFQ, §4) and cpt (+ its precision range test, §5) here; the
gated kinds, dfq (§6) and fractrain (§7), in ``engine.config.gated_schedule``. Defaults follow the reference
code; the options it lacks are fields that default to its behaviour.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from annotated_types import Ge, Le
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine.config.types import MAX_ITERATIONS, Bits, Strict, increasing_fractions
from engine.numerics.precision import Precision


def _weights(bits: int | None) -> str:
    return f" W{bits}" if bits is not None else ""


class FP32Schedule(Strict):
    """Full precision: the reference point of every cost ratio."""

    kind: Literal["fp32"] = "fp32"
    gated: ClassVar[bool] = False  # a gate picks each input's precision (DFQ, FracTrain: methods.md §6)

    def label(self) -> str:
        """The method's name in tables, figures and run lists: the resolved values, defaults included."""
        return "FP32"


class StaticSchedule(Strict):
    """FWn/BWm for the whole run (e.g. the SBM FW8/BW8 baseline); weights at ``fw`` unless set."""

    kind: Literal["static"] = "static"
    fw: Bits = 8
    bw: Bits = 8
    weight_bits: Bits | None = None

    def precision(self) -> Precision:
        return Precision.fwbw(self.fw, self.bw, self.weight_bits)

    gated: ClassVar[bool] = False

    def label(self) -> str:
        return f"FW{self.fw}/BW{self.bw}{_weights(self.weight_bits)}"

MAX_STAGES = 100  # PFQ's stages, and so its turning points (FracTrain's: GatedSettings)


class IndicatorSettings(Strict):
    """PFQ's loss indicator (engine.schedules.indicator), shared by pfq and fractrain."""

    epsilon: float = Field(0.15, gt=0.0, le=100.0)  # initial threshold (--initial_threshold; README 0.05)
    alpha: float = Field(0.4, gt=0.0, le=1.0)  # threshold decay (--decay; README 0.3)
    window: int = Field(5, ge=2, le=1000)  # K: the current window loss against the K-1 before it
    scale_windows: int = Field(10, ge=1, le=10000)  # S = mean loss of the first windows, then frozen
    # the turning points after which eps *= alpha
    decay_after: list[Annotated[int, Ge(1), Le(MAX_STAGES)]] = Field(default_factory=lambda: [1, 2],
                                                                     max_length=MAX_STAGES)
    eval_every: int = Field(400, ge=1, le=MAX_ITERATIONS)  # the indicator's "epoch": 400 iterations in PFQ, 390 in FracTrain
    eval_unit: Literal["iterations", "epochs"] = "iterations"
    # or the run split into this many windows, whatever its length (the reference: 160 in 64,000 iterations)
    eval_windows: int | None = Field(None, ge=1, le=100000)
    force_final_at: float | None = Field(None, gt=0.0, le=1.0)  # reach the last stage by this fraction

    @model_validator(mode="before")
    @classmethod
    def _one_window(cls, data):
        """eval_windows with an eval_every or eval_unit of its own is refused; their defaults (as a resolved
        config's dump holds them) are not."""
        if not isinstance(data, dict) or data.get("eval_windows") is None:
            return data
        fields = cls.model_fields
        if (data.get("eval_every", fields["eval_every"].default) != fields["eval_every"].default
                or data.get("eval_unit", fields["eval_unit"].default) != fields["eval_unit"].default):
            raise PydanticCustomError("windows", "eval_windows sets the window length; allowed: eval_windows or "
                                                 "eval_every / eval_unit, not both")
        return data


class PFQSchedule(IndicatorSettings):
    """Progressive fractional quantization (FracTrain 3.1): precision rises stage by stage.

    ``manual`` switches stages at fractions of the run (uniform by default); ``auto`` switches at the loss
    indicator's turning points with the reference's exact semantics.
    """

    kind: Literal["pfq"] = "pfq"
    fw: list[Bits] = Field(default_factory=lambda: [3, 4, 6, 8], min_length=1, max_length=MAX_STAGES)  # FW per stage
    bw: list[Bits] = Field(default_factory=lambda: [6, 6, 8, 8], min_length=1, max_length=MAX_STAGES)  # BW per stage
    weight_bits: Bits | None = None  # None: weights at the stage's FW bits (the reference)
    mode: Literal["auto", "manual"] = "auto"
    switch_at: list[float] | None = None  # manual: where stages 2.. start (fractions); None: uniform stages
    num_turning_points: int | None = Field(None, ge=0)  # None: one per stage switch (len(fw) - 1)

    @field_validator("bw")
    @classmethod
    def _same_length(cls, v: list[int], info: ValidationInfo) -> list[int]:
        fw = info.data.get("fw")
        if fw is not None and len(fw) != len(v):
            raise PydanticCustomError("stages", f"allowed: one entry per stage, like schedule.fw ({len(fw)} stages)")
        return v

    @field_validator("switch_at")
    @classmethod
    def _switches(cls, v: list[float] | None, info: ValidationInfo) -> list[float] | None:
        increasing_fractions(v, "switch_at")
        fw = info.data.get("fw")
        if v is not None and fw is not None and len(v) != len(fw) - 1:
            raise PydanticCustomError("stages", f"allowed: {len(fw) - 1} fractions, one per stage after the first")
        return v

    @field_validator("num_turning_points")
    @classmethod
    def _turns(cls, v: int | None, info: ValidationInfo) -> int | None:
        fw = info.data.get("fw")
        if v is not None and fw is not None and v > len(fw) - 1:
            raise PydanticCustomError("stages", f"allowed: <= {len(fw) - 1} (one fewer than the stages)")
        return v

    @property
    def turning_points(self) -> int:
        return len(self.fw) - 1 if self.num_turning_points is None else self.num_turning_points

    def stage_precision(self, stage: int) -> Precision:
        return Precision.fwbw(self.fw[stage], self.bw[stage], self.weight_bits)

    gated: ClassVar[bool] = False

    def label(self) -> str:
        fw, bw = "-".join(map(str, self.fw)), "-".join(map(str, self.bw))
        return f"PFQ {self.mode} FW{fw}/BW{bw}{_weights(self.weight_bits)}"


class PRTConfig(Strict):
    """Precision range test (CPT 3.3; not in either reference repo): train from scratch, raising the forward
    bits step by step; ``fw_min`` is the first bit width whose mean training accuracy gain over the previous
    one exceeds ``threshold``."""

    candidates: list[Bits] = Field(default_factory=lambda: [2, 3, 4, 5, 6, 7, 8], min_length=2)
    iterations_per_bit: int = Field(50, ge=1, le=MAX_ITERATIONS)
    window: int = Field(20, ge=1)  # iterations averaged at the end of each bit width
    threshold: float = Field(0.01, ge=0.0, le=1.0)  # accuracy gain that marks the switching point
    bw: Bits = 8  # gradient bits during the test

    @field_validator("candidates")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if list(v) != sorted(set(v)):
            raise PydanticCustomError("prt", "allowed: strictly increasing bit widths")
        return v

    @field_validator("iterations_per_bit")
    @classmethod
    def _run_length(cls, v: int, info: ValidationInfo) -> int:
        bits = len(info.data.get("candidates") or ())
        if bits and bits * v > MAX_ITERATIONS:
            raise PydanticCustomError("prt", f"allowed: <= {MAX_ITERATIONS // bits} (a test of at most "
                                             f"{MAX_ITERATIONS:.0e} iterations over {bits} candidates)")
        return v

    @field_validator("window")
    @classmethod
    def _fits(cls, v: int, info: ValidationInfo) -> int:
        per_bit = info.data.get("iterations_per_bit")
        if per_bit is not None and v > per_bit:
            raise PydanticCustomError("prt", f"allowed: <= iterations_per_bit ({per_bit})")
        return v


class CPTSchedule(Strict):
    """Cyclic precision training (CPT): cosine cycles of the forward bits per iteration."""

    kind: Literal["cpt"] = "cpt"
    fw_min: Bits | Literal["auto"] = 3  # "auto": chosen by the precision range test before training
    fw_max: Bits = 8
    bw_min: Bits = 8  # gradient bits: fixed at 8 by default (bw_min == bw_max), cyclic when bw_min < bw_max
    bw_max: Bits = 8
    num_cycles: int = Field(32, ge=1)  # the paper's 32 (the reference script's default is 1)
    rounding: Literal["rint", "ceil"] = "rint"  # rint: the reference code; ceil: the paper's formula
    weight_bits: Bits | None = None  # None: weights at the forward bits (the reference)
    prt: PRTConfig = PRTConfig()

    @field_validator("fw_max")
    @classmethod
    def _fw_range(cls, v: int, info: ValidationInfo) -> int:
        lo = info.data.get("fw_min")
        if isinstance(lo, int) and lo > v:
            raise PydanticCustomError("range", f"allowed: >= fw_min ({lo})")
        return v

    @field_validator("bw_max")
    @classmethod
    def _bw_range(cls, v: int, info: ValidationInfo) -> int:
        lo = info.data.get("bw_min")
        if lo is not None and lo > v:
            raise PydanticCustomError("range", f"allowed: >= bw_min ({lo})")
        return v

    gated: ClassVar[bool] = False

    def label(self) -> str:
        bws = f"{self.bw_min}" if self.bw_min == self.bw_max else f"{self.bw_min}->{self.bw_max}"
        return f"CPT FW{self.fw_min}->{self.fw_max}/BW{bws}{_weights(self.weight_bits)}"
