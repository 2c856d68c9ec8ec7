"""The gated kinds of the ``schedule`` section: dfq (FracTrain DFQ, docs/methods.md §6) and fractrain (PFQ's
indicator scheduling DFQ's cp target, §7). What both share (``GatedSettings``): the options (a preset of
``OPTION_PRESETS`` or a list), the gate, the cost term, the cp controller and the execution mode, with the
defaults an unset field resolves to (methods.md §6.3). The kinds whose precision is fixed per iteration are in
``engine.config.schedule``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from engine.config.schedule import MAX_STAGES, IndicatorSettings
from engine.config.types import Bits, Strict
from engine.dfq.vocabulary import COST_BASES, EXECUTIONS, OPTION_STATES, ROUTED_ESTIMATORS, ROUTED_STATISTICS
from engine.models.catalog import is_language_model
from engine.numerics.precision import SKIP, Precision, parse_fwbw

OPTION_PRESETS = {
    "paper": ["skip", "2/6", "3/6", "4/6", "4/12", "6/8", "6/12"],  # supplement, ResNet-38/74
    "paper_mobilenetv2": ["skip", "4/8", "6/8", "6/10", "8/8"],  # supplement, MobileNetV2
    "reference": ["3/6", "4/6", "4/8", "6/8", "6/12"],  # hard-coded in train_dfq.py / train_frac.py
    "cap8": ["skip", "2/6", "3/6", "4/6", "4/8", "6/8"],  # every option <= 8 bits (the reviewers' fairness point)
}

# the gate's (gate_dim, embed_dim, hidden_dim) in the reference code: its CIFAR ResNets' (every model but
# MobileNetV2 here) and its MobileNetV2_RNN's
GATE_SIZES = {"resnet": (32, 16, 16), "mobilenetv2": (64, 32, 32)}
# its ImageNet ResNets' (execution conv): a one-layer embedding to 40, an LSTM of 20; no gate_dim
CONV_GATE_SIZES = (None, 40, 20)


def option_name(text: str) -> str:
    """An option as written (``skip``, ``SKIP``, `` 4/8``, ``04/8``) by its one name (``skip``, ``4/8``), so that
    two spellings of one option count as one; ``ValueError`` for anything else (ASCII digits, bits 1..32)."""
    text = text.strip()
    if text.lower() == "skip":
        return "skip"
    fw, bw = parse_fwbw(text)
    return f"{fw}/{bw}"


def parse_option(text: str, weight_bits: int) -> Precision:
    """``skip`` or ``FW/BW`` (e.g. ``4/12``); weights at the schedule's fixed ``weight_bits``."""
    name = option_name(text)
    if name == "skip":
        return SKIP
    fw, bw = parse_fwbw(name)
    return Precision(act=fw, weight=weight_bits, grad=bw)


def default_option_state(execution: str) -> str:
    """``option_state`` when the config leaves it unset: the reference's shared statistics for masked and conv
    execution, the skip path's kept apart for routed (methods.md §6.3)."""
    return "skip_apart" if execution == "routed" else "shared"


def default_routed_sample_fraction(execution: str, estimator: str) -> float:
    """``routed_sample_fraction`` when the config leaves it unset: half the batch runs the alternative where one
    is drawn (routed with the ``sampled`` or ``grouped`` estimator), the whole batch otherwise (methods.md §6.3)."""
    return 0.5 if execution == "routed" and estimator in ("sampled", "grouped") else 1.0


def default_routed_statistics(execution: str) -> str:
    """``routed_statistics`` when the config leaves it unset: ``batch`` for routed execution (every sample runs a
    block's training pass, as in masked), ``computed`` for masked, where it has no effect (methods.md §6.3)."""
    return "batch" if execution == "routed" else "computed"


class GatedSettings(Strict):
    """What DFQ and FracTrain share: the options, the gate, the cost term and the execution mode."""

    options: str | list[str] = "paper"  # a preset name (paper, reference, cap8) or a list like [skip, 4/8]
    weight_bits: Bits = 4  # fixed for every option (README: 4 on CIFAR, 6 on ImageNet)
    # what the cp targets are percent of FP32 over (methods.md §6.4, "Cost bases"): gated = the gated blocks (the
    # papers' cp), model = the whole model (every layer and the gate), the basis on which a static run of the
    # gated layer map costs the same at the same cp. The controller steers it; the run logs both
    cost_basis: Literal[COST_BASES] = "gated"
    # the cp controller (methods.md §6.5): dual (default: a Lagrange multiplier that prices the gate's decision,
    # updated by dual ascent) or reference (the papers' bang-bang sign rule on the cost term)
    controller: Literal["dual", "reference"] = "dual"
    # dual: each iteration the price moves this fraction of the way to the price that would have put the batch
    # on target (its logits held fixed) ...
    controller_rate: float = Field(0.2, gt=0.0, le=1.0)
    controller_gain: float = Field(0.05, ge=0.0, le=100.0)  # ... plus this times the batch's relative cp error
    beta: float = Field(0.128, ge=0.0, le=1000.0)  # cost term per sample: reference s*beta (1e-3 x batch 128), dual beta*price
    # the reference's --ada_beta (controller reference): where beta times the mean cost exceeds a tenth of the
    # batch's CE, that term is scaled down to it, its gradient alike (methods.md §6.5)
    ada_beta: bool = False
    block_cost: Literal["uniform", "macs"] | None = None  # omega_l; None: the reference (uniform for ResNets)
    # the least share of each gated block's inputs that compute it (methods.md §6.5, "Block floor"): where more
    # chose to skip, the least decided skippers compute; keeps one block from collapsing to skip. 0: off (the
    # reference has none)
    block_floor: float = Field(0.0, ge=0.0, lt=1.0)
    # masked: the reference's CIFAR networks (every option for every sample); routed: each sample at its option in
    # one pass; conv: the reference's ImageNet ResNets (one pass, each quantized conv mixing its input over the
    # options; one-layer gate embedding; no skip option)
    execution: Literal[EXECUTIONS] = "masked"
    # routed's gate gradient (methods.md §6.3): skip = computing against skipping; sampled = also the chosen
    # option against one sampled alternative per sample (one forward-only pass more); grouped = sampled over
    # forward groups (FW bit-widths); exact = every other forward group (masked's gradient, one pass each)
    routed_estimator: Literal[ROUTED_ESTIMATORS] = "sampled"
    # sampled / grouped: the fraction of each batch that runs the alternative (its contrast weighted by 1/fraction).
    # Unset: 0.5 with execution routed and estimator sampled or grouped, else 1
    routed_sample_fraction: float | None = Field(None, gt=0.0, le=1.0, validate_default=True)
    # routed: this fraction of the run's first iterations runs masked (every option for every sample), so the
    # gate starts from exact gradients (methods.md §6.3); 0 = routed from the start
    routed_warmup: float = Field(0.0, ge=0.0, lt=1.0)
    # routed: the samples a block's training pass runs over (methods.md §6.3): computed = only those that compute
    # it; batch = the samples that skip it too, each at its drawn alternative (outputs discarded), so its BN batch
    # statistics and activation range cover the whole batch as in masked execution. Unset: batch with execution
    # routed, computed with masked
    routed_statistics: Literal[ROUTED_STATISTICS] | None = Field(None, validate_default=True)
    # running statistics per block (BN, activation ranges; methods.md §6.3): shared (the reference) = one set,
    # updated by every option in turn; skip_apart = the skip path (a downsampling block's fp32 projection) keeps
    # its own, apart from the computed options'; per_option (masked only) = each option keeps its own copy.
    # Unset: shared with execution masked (the reference), skip_apart with routed
    option_state: Literal[OPTION_STATES] | None = Field(None, validate_default=True)
    # the gate's sizes (methods.md §6.1); unset: the reference's for the model (``gate_sizes``)
    gate_dim: int | None = Field(None, ge=1, le=4096)
    embed_dim: int | None = Field(None, ge=1, le=4096)
    hidden_dim: int | None = Field(None, ge=1, le=4096)

    @field_validator("ada_beta")
    @classmethod
    def _ada_beta(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("controller", "dual") != "reference":
            raise PydanticCustomError("ada_beta", "allowed: false with controller dual (it caps the reference "
                                      "controller's cost term; set controller: reference)")
        return v

    @field_validator("routed_sample_fraction")
    @classmethod
    def _routed_sample_fraction(cls, v: float | None, info: ValidationInfo) -> float:
        if v is None:
            return default_routed_sample_fraction(info.data.get("execution", "masked"),
                                                  info.data.get("routed_estimator", "sampled"))
        return v

    @field_validator("routed_statistics")
    @classmethod
    def _routed_statistics(cls, v: str | None, info: ValidationInfo) -> str:
        return default_routed_statistics(info.data.get("execution", "masked")) if v is None else v

    @field_validator("option_state")
    @classmethod
    def _option_state(cls, v: str | None, info: ValidationInfo) -> str:
        execution = info.data.get("execution", "masked")
        if v is None:
            return default_option_state(execution)
        if v == "per_option" and execution != "masked":
            raise PydanticCustomError("option_state", f"allowed: shared or skip_apart with execution {execution} "
                                      "(per_option needs execution masked)")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str):
            if v not in ("paper", "reference", "cap8"):
                raise PydanticCustomError("options", "allowed: a preset (paper, reference, cap8) or a list of "
                                          "options such as [skip, 2/6, 4/8]")
            return v
        names = []
        for item in v:
            try:
                names.append(option_name(item))
            except ValueError:
                raise PydanticCustomError("options", f"option {item!r}; allowed: skip or FW/BW with bits "
                                          "1..32, e.g. 4/8") from None
        twice = [n for i, n in enumerate(names) if n in names[:i]]
        if not 2 <= len(names) <= 32 or twice:
            raise PydanticCustomError("options", "allowed: 2 to 32 distinct options" +
                                      (f" ({', '.join(twice)} given more than once)" if twice else ""))
        return names

    def option_names(self, model_name: str) -> list[str]:
        if isinstance(self.options, list):
            return list(self.options)
        if self.options == "paper" and model_name == "mobilenetv2":
            return list(OPTION_PRESETS["paper_mobilenetv2"])
        return list(OPTION_PRESETS[self.options])

    def gate_sizes(self, model_name: str) -> tuple[int, int, int]:
        """(gate_dim, embed_dim, hidden_dim): each as set, else the reference's for the model (with execution
        conv its ImageNet ResNets', whose one-layer embedding has no gate_dim: None)."""
        reference = CONV_GATE_SIZES if self.execution == "conv" else GATE_SIZES.get(model_name, GATE_SIZES["resnet"])
        return tuple(r if v is None else v for v, r in zip((self.gate_dim, self.embed_dim, self.hidden_dim), reference))

    def option_precisions(self, model_name: str) -> list[Precision]:
        return [parse_option(o, self.weight_bits) for o in self.option_names(model_name)]

    def omega_kind(self, model_name: str) -> str:
        """omega_l: the config's ``block_cost``, else uniform for ResNets (the reference) and the blocks' MACs
        for MobileNetV2 and the language models (per token: equal blocks, so the same weights; methods.md §11.1)."""
        if self.block_cost is not None:
            return self.block_cost
        return "macs" if model_name == "mobilenetv2" or is_language_model(model_name) else "uniform"

    gated: ClassVar[bool] = True

    def gate_label(self) -> str:
        """The execution and each gate setting that differs from its default, so that two rows of a sweep over
        them get two names: ``routed (sampled)``, ``masked reference``, ``routed (sampled, whole batch) floor 0.5``."""
        opts = "" if self.options == "paper" else \
            f" {self.options if isinstance(self.options, str) else '[' + ','.join(self.options) + ']'}"
        defaults = type(self).model_fields
        opts += f" {self.controller}" if self.controller != defaults["controller"].default else ""
        opts += f" beta {self.beta:g}" if self.beta != defaults["beta"].default else ""
        opts += " ada_beta" if self.ada_beta else ""
        opts += f" floor {self.block_floor:g}" if self.block_floor else ""
        return self.execution_label() + opts

    def cp_label(self) -> str:
        """`` of the model`` where the targets are over the whole model (the papers' cp needs no word)."""
        return " of the model" if self.cost_basis == "model" else ""

    def execution_label(self) -> str:
        """``masked``, or ``routed (estimator)``; each execution setting that differs from its default (which
        depends on the execution and estimator) is named in brackets."""
        extra = [self.routed_estimator] if self.execution == "routed" else []
        p = self.routed_sample_fraction
        if p != default_routed_sample_fraction(self.execution, self.routed_estimator):
            extra.append("whole batch" if p == 1 else "half batch" if p == 0.5 else f"alternative for {p:g}")
        if self.routed_statistics != default_routed_statistics(self.execution):
            extra.append(f"{self.routed_statistics} statistics")
        if self.option_state != default_option_state(self.execution):
            extra.append(f"{self.option_state} state")
        if self.routed_warmup:
            extra.append(f"masked warm-up {self.routed_warmup:g}")
        return f"{self.execution} ({', '.join(extra)})" if extra else self.execution


class DFQSchedule(GatedSettings):
    """Dynamic fractional quantization: a gate picks each block's precision per input, steered to a cp."""

    kind: Literal["dfq"] = "dfq"
    target_cp: float = Field(3.0, gt=0.0, le=100.0)  # percent of the FP32 cost over the gated blocks
    relax: float = Field(0.0, ge=0.0, le=100.0)  # the reference's relax band around the target

    def label(self) -> str:
        return f"DFQ cp {self.target_cp:g}%{self.cp_label()} {self.gate_label()}"


class FracTrainSchedule(GatedSettings, IndicatorSettings):
    """FracTrain: PFQ's indicator raises DFQ's cp target at each turning point, cp_i = cp0 + i * cp_step."""

    kind: Literal["fractrain"] = "fractrain"
    cp0: float | None = Field(None, gt=0.0, le=100.0)  # first-stage target (--target_ratio); None: 1.5 (README)
    cp_total: float | None = Field(None, gt=0.0, le=100.0, validate_default=True)  # or the overall cp (eq. 1)
    cp_step: float = Field(0.5, ge=0.0, le=100.0)  # --target_ratio_step
    num_turning_points: int = Field(3, ge=0, le=MAX_STAGES)
    band: float = Field(0.0, ge=0.0, le=100.0)  # --target_ratio_range: s = 0 inside [T, T + band)
    loss: Literal["ce", "total"] = "ce"  # what the indicator reads; total = CE + cost term (the reference)
    eval_every: int = Field(390, ge=1)  # the reference's FracTrain window

    @field_validator("cp_total")
    @classmethod
    def _one_target(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("cp0") is not None:
            raise PydanticCustomError("targets", "allowed: cp0 or cp_total, not both")
        return v

    def first_target(self) -> float:
        if self.cp_total is not None:
            return cp0_for_total(self.cp_total, self.cp_step, self.num_turning_points + 1)
        return 1.5 if self.cp0 is None else self.cp0

    def targets(self) -> list[float]:
        c0 = self.first_target()
        return [c0 + i * self.cp_step for i in range(self.num_turning_points + 1)]

    def label(self) -> str:
        return f"FracTrain cp {self.first_target():g}+{self.cp_step:g}{self.cp_label()} {self.gate_label()}"


def cp0_for_total(cp_total: float, step: float, stages: int) -> float:
    """Supplement eq. 1: cp_total = mean of cp_0 + i * step over M stages, so cp_0 = cp_total - step (M-1)/2
    (equal stage lengths assumed; the realised per-stage cp is measured and reported)."""
    return cp_total - step * (stages - 1) / 2.0
