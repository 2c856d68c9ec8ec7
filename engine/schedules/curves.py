"""Precision as a function of training progress (architecture rule 5; docs/methods.md §4, §5).

A runtime schedule answers ``precision(iteration)`` before every optimizer step and ``observe``s the loss
after it. Static, manual PFQ and CPT are pure functions of the iteration; auto PFQ asks the one stateful
piece, ``LossIndicator``, whose state travels in every checkpoint. ``SCHEDULE_BUILDERS[kind]`` builds the runtime
schedule from its config section (the keys are the config union's ``kind`` values). ``events`` records
every stage switch (turning points, manual switches, forced final stages).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import ConfigError
from engine.numerics.precision import FP32, Precision
from engine.run_length import RunLength
from engine.schedules.indicator import Staging

if TYPE_CHECKING:  # the config's schedule sections name the arguments; engine.config imports this module
    from engine.config.schedule import CPTSchedule, FP32Schedule, PFQSchedule, StaticSchedule


class RunSchedule:
    """Base runtime schedule: constant precision, no state."""

    def __init__(self, prec: Precision):
        self._prec = prec
        self.events: list[dict] = []

    def precision(self, iteration: int) -> Precision:  # noqa: ARG002
        return self._prec

    def observe(self, iteration: int, loss: float) -> None:
        """Called after every iteration with the loss the schedule listens to."""

    def epoch_metrics(self) -> dict[str, float]:
        """Extra per-epoch metrics (stage, ...)."""
        return {}

    def state_dict(self) -> dict:
        return {"events": list(self.events)}

    def load_state_dict(self, state: dict) -> None:
        self.events = list(state.get("events", []))


class ManualPFQ(RunSchedule):
    """PFQ with stages switched at fixed fractions of the run (the supplement's manual PFQ)."""

    def __init__(self, cfg: PFQSchedule, run: RunLength):
        super().__init__(cfg.stage_precision(0))
        self.cfg = cfg
        n = len(cfg.fw)
        fractions = cfg.switch_at if cfg.switch_at is not None else [i / n for i in range(1, n)]
        self.starts = [round(f * run.total_iterations) for f in fractions]

    def stage(self, iteration: int) -> int:
        return sum(1 for s in self.starts if iteration >= s)

    def precision(self, iteration: int) -> Precision:
        return self.cfg.stage_precision(self.stage(iteration))

    def observe(self, iteration: int, loss: float) -> None:
        if iteration + 1 in self.starts:
            st = self.stage(iteration + 1)
            self.events.append(_event(iteration + 1, st, self.cfg.stage_precision(st), "manual"))

    def epoch_metrics(self) -> dict[str, float]:
        return {"stage": float(len(self.events))}


class AutoPFQ(RunSchedule):
    """PFQ driven by the loss indicator's staging (methods.md §4.2-4.3); ``force_final_at`` optionally
    guarantees the last stage."""

    def __init__(self, cfg: PFQSchedule, run: RunLength):  # noqa: D107  (no super().__init__: events live in the staging)
        self._prec, self.cfg = cfg.stage_precision(0), cfg
        self.staging = Staging(cfg, cfg.turning_points, run, lambda st: _bits(cfg.stage_precision(st)))

    @property
    def events(self) -> list[dict]:
        return self.staging.events

    @property
    def stage(self) -> int:
        return self.staging.stage

    def precision(self, iteration: int) -> Precision:
        self.staging.before(iteration)
        return self.cfg.stage_precision(self.stage)

    def observe(self, iteration: int, loss: float) -> None:
        self.staging.observe(iteration, loss)

    def epoch_metrics(self) -> dict[str, float]:
        return {"stage": float(self.stage), "pfq_epsilon": self.staging.indicator.epsilon}

    def state_dict(self) -> dict:
        return self.staging.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.staging.load_state_dict(state)


def cyclic_bits(t: int, lo: int, hi: int, period: float, rounding: str = "rint") -> int:
    """CPT's rising half-cosine inside each cycle: lo at the cycle start, about hi at its end (methods.md §5.1).

    b(t) = round(lo + (hi - lo) * (1 - cos(pi * (t mod T) / T)) / 2), rint = half to even (the code),
    ceil = the paper's formula. T may be fractional (total iterations / cycles), so the cycles tile the whole
    run exactly and the last iteration is at the top of the last cycle, whatever the run length.

    The value is computed as the reference writes it, ``lo + 0.5 (hi - lo) (1 + cos(pi ((t mod T) / T) + pi))``:
    where the exact value is halfway between two widths (at a third, half or two thirds of a cycle, for some
    ranges) the two algebraically equal forms land on either side of the half in double, and rint then picks
    different widths.
    """
    if lo == hi:  # a fixed width (CPT's gradients, as the papers run it): the formula gives lo exactly
        return lo
    x = lo + 0.5 * (hi - lo) * (1.0 + math.cos(math.pi * ((t % period) / period) + math.pi))
    if rounding == "ceil":
        return int(math.ceil(x - 1e-9))
    return int(round(x))  # Python's round is half-to-even, like numpy's rint


def cycles_problem(num_cycles: int, total_iterations: int) -> tuple[str, object, str] | None:
    """CPT's cycles against the run's length (a cycle needs at least one iteration): the one rule, read by
    ``CPT`` (a schedule built directly) and by the config's ``cross_field_problems`` (engine.config sits above)."""
    if num_cycles > total_iterations:
        return ("schedule.num_cycles", num_cycles,
                f"allowed: <= the run's {total_iterations} iterations (a cycle needs at least one iteration)")
    return None


class CPT(RunSchedule):
    def __init__(self, cfg: CPTSchedule, run: RunLength, fw_min: int | None = None):
        fw_min = cfg.fw_min if fw_min is None else fw_min
        if fw_min == "auto":
            raise ConfigError.single("schedule.fw_min", "auto", "resolved by the precision range test before "
                                     "training; pass the chosen value")
        self.cfg, self.fw_min = cfg, int(fw_min)
        problem = cycles_problem(cfg.num_cycles, run.total_iterations)  # the config's rule (a period >= 1)
        if problem:
            raise ConfigError([problem])
        # total / cycles, not floor division: with a remainder, floor division starts an extra cycle at the
        # run's end, so the final iterations (and the final evaluation) would run at fw_min (reference runs
        # have 64000 / 32 = 2000 exactly, where both agree)
        self.period = run.total_iterations / cfg.num_cycles
        # one Precision per (fw, bw) pair the cycle visits, built and validated once: a preview asks for
        # hundreds of thousands of iterations (engine/preview.py), each otherwise a new, checked object
        self._widths: dict[tuple[int, int], Precision] = {}
        super().__init__(self.precision(0))

    def precision(self, iteration: int) -> Precision:
        c = self.cfg
        fw = cyclic_bits(iteration, self.fw_min, c.fw_max, self.period, c.rounding)
        bw = cyclic_bits(iteration, c.bw_min, c.bw_max, self.period, c.rounding)
        prec = self._widths.get((fw, bw))
        if prec is None:
            prec = self._widths[fw, bw] = Precision.fwbw(fw, bw, c.weight_bits)
        return prec

    def epoch_metrics(self) -> dict[str, float]:
        return {"cpt_fw_min": float(self.fw_min)}


def _bits(prec: Precision) -> dict:
    return {"fw_bits": prec.act, "bw_bits": prec.grad, "weight_bits": prec.weight}


def _event(iteration: int, stage: int, prec: Precision, reason: str) -> dict:
    return {"iteration": iteration, "stage": stage, **_bits(prec), "reason": reason}


SCHEDULE_BUILDERS: dict[str, Callable[..., RunSchedule]] = {}


def register_schedule(kind: str):
    def deco(fn):
        SCHEDULE_BUILDERS[kind] = fn
        return fn

    return deco


@register_schedule("fp32")
def _fp32(cfg: FP32Schedule, run: RunLength, **_) -> RunSchedule:
    return RunSchedule(FP32)


@register_schedule("static")
def _static(cfg: StaticSchedule, run: RunLength, **_) -> RunSchedule:
    return RunSchedule(cfg.precision())


@register_schedule("pfq")
def _pfq(cfg: PFQSchedule, run: RunLength, **_) -> RunSchedule:
    return ManualPFQ(cfg, run) if cfg.mode == "manual" else AutoPFQ(cfg, run)


@register_schedule("cpt")
def _cpt(cfg: CPTSchedule, run: RunLength, fw_min: int | None = None, **_) -> RunSchedule:
    return CPT(cfg, run, fw_min)


def build_schedule(cfg: FP32Schedule | StaticSchedule | PFQSchedule | CPTSchedule, run: RunLength, **resolved) -> RunSchedule:
    return SCHEDULE_BUILDERS[cfg.kind](cfg, run, **resolved)


@dataclass
class PrecisionTrace:
    """Mean forward/backward bits over a span of iterations (for per-epoch metrics)."""

    fw_sum: float = 0.0
    bw_sum: float = 0.0
    n: int = 0

    def add(self, fw: float, bw: float) -> None:
        self.fw_sum += fw
        self.bw_sum += bw
        self.n += 1

    def means(self) -> tuple[float, float]:
        return (self.fw_sum / self.n, self.bw_sum / self.n) if self.n else (0.0, 0.0)
