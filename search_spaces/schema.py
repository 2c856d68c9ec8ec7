"""The fields of a sweep spec (docs/sweeps.md), as pydantic models: ``SweepSpec`` with its parameters (``Param``: one
of grid, choice, uniform, loguniform, int), ``Search``, ``Scheduler``, ``Budget``, ``Resources``, staged sweeps'
``Stage`` and the paired test's ``Paired``. Each model checks its own fields; what needs the base experiment (every
point's config, the stages' references, the pairs' selectors) is checked when a spec is loaded
(``search_spaces.spec``)."""

from __future__ import annotations

import builtins
import math
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine.config.experiment import NAME_PATTERN
from engine.config.sections import Head
from engine.config.types import Items, Seed, Strict
from engine.errors import ConfigError

MAX_VALUES = 10_000  # values of one grid/choice parameter, seeds of one sweep
INT_BOUND = 2**62  # int parameter bounds (Tune samples them as int64)


class Param(Strict):
    """Exactly one of the five kinds."""

    grid: list[Any] | None = None
    choice: list[Any] | None = None
    uniform: Items(tuple[float, float] | None) = None
    loguniform: Items(tuple[float, float] | None) = None
    int: Items(tuple[builtins.int, builtins.int] | None) = None  # inclusive bounds

    @model_validator(mode="after")
    def _one_kind(self) -> Param:
        set_kinds = [k for k in ("grid", "choice", "uniform", "loguniform", "int") if getattr(self, k) is not None]
        if len(set_kinds) != 1:
            raise ValueError("give exactly one of grid, choice, uniform, loguniform, int")
        for k in ("grid", "choice"):
            if getattr(self, k) is not None and not getattr(self, k):
                raise ValueError(f"{k} needs at least one value")
        for k in ("uniform", "loguniform", "int"):
            rng = getattr(self, k)
            if rng is not None and not rng[0] < rng[1]:
                raise ValueError(f"{k} needs [low, high] with low < high")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError("loguniform needs low > 0")
        for k in ("grid", "choice"):
            if len(getattr(self, k) or ()) > MAX_VALUES:
                raise ValueError(f"{k} of {len(getattr(self, k))} values; allowed: at most {MAX_VALUES}")
        if self.int is not None and not -INT_BOUND <= self.int[0] < self.int[1] <= INT_BOUND:
            raise ValueError(f"int bounds must lie within -2**62..2**62; got {list(self.int)}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("grid", "choice", "uniform", "loguniform", "int") if getattr(self, k) is not None)

    def probe_values(self) -> list[Any]:
        """Values that must each give a valid config: every listed value, or both ends of a range."""
        return list(getattr(self, self.kind))


class Search(Strict):
    algorithm: Literal["grid", "random", "optuna"] = "grid"
    sampler: Literal["tpe", "nsga2"] = "tpe"  # optuna only: multi-objective TPE (Optuna 5 default) or NSGA-II
    num_samples: int = Field(1, ge=1, le=100000)  # grid: repeats of the grid; random/optuna: trials
    seed: int | None = Field(0, ge=0, le=2**32 - 1)  # the sampler's seed


class Scheduler(Strict):
    """Early stopping. ASHA stops trials on accuracy, so their BitOPs are not comparable: see docs."""

    kind: Literal["none", "asha"] = "none"
    grace_period: int = Field(1, ge=1, le=100000)
    reduction_factor: float = Field(4, gt=1, le=1000)


class Budget(Strict):
    max_concurrent_trials: int | None = Field(None, ge=1, le=10000)
    time_limit_s: float | None = Field(None, gt=0, le=10**8)
    max_failures: int = Field(1, ge=0, le=100)  # retries of a failed trial from its last checkpoint


class Resources(Strict):
    """What one trial gets. ``workers`` > 1: the trial trains data-parallel on that many Ray Train workers
    (docs/methods.md §12), each with ``cpu`` and ``gpu``; its trials' configs carry ``workers``."""

    cpu: float = Field(1.0, gt=0, le=1024)
    gpu: float = Field(0.0, ge=0, le=64)
    workers: int = Field(1, ge=1, le=1024)


class Stage(Strict):
    """One stage of a staged sweep: its own overrides and grid over the spec's base, seeds and resources. With
    ``init_from`` (an earlier stage of one trial per seed), each trial starts from the weights of that stage's run
    of the same seed (``init.checkpoint``, ``head``: keep or reset the classifier). ``seeds``: the stage's own
    (a control run on one seed, say), for a stage no other starts from and that starts from none."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    set: dict[str, Any] = Field(default_factory=dict)  # dotted overrides applied after the spec's own ``set``
    parameters: dict[str, Param] = Field(default_factory=dict)  # grid parameters only
    init_from: str | None = None
    head: Head = "keep"  # init.head for init_from; the supplement retrains the same model: keep
    seeds: list[Seed] | None = Field(None, min_length=1, max_length=MAX_VALUES)  # None: the spec's seeds

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v: list[int] | None) -> list[int] | None:
        return _distinct_seeds(v)

    @field_validator("parameters")
    @classmethod
    def _paths(cls, v: dict[str, Param]) -> dict[str, Param]:
        return _check_paths(v)


class Pair(Strict):
    """One arm and its twin of a paired test: dotted config paths with the values that pick each one's runs
    (``schedule.kind: dfq``, ``schedule.target_cp: 3.152``), compared on the resolved config of every run. A
    ``control`` pair is shown beside the others and left out of the decision."""

    arm: dict[str, Any] = Field(min_length=1)
    twin: dict[str, Any] = Field(min_length=1)
    control: bool = False

    @field_validator("arm", "twin")
    @classmethod
    def _paths(cls, v: dict[str, Any]) -> dict[str, Any]:
        for path in v:
            if not all(part.isidentifier() for part in path.split(".")):
                raise PydanticCustomError("pair", "allowed: dotted config paths, e.g. schedule.kind (not '{p}')",
                                          {"p": path})
        return v


def config_value(tree: dict, path: str) -> Any:
    """The value at a dotted ``path`` of a resolved config's dump; ``KeyError`` where it has none."""
    node: Any = tree
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise KeyError(path)
        node = node[key]
    return node


def picks(selector: dict[str, Any], tree: dict) -> bool:
    """Whether a resolved config's dump has every value of a pair's ``selector`` (numbers to 1e-9)."""
    for path, want in selector.items():
        try:
            have = config_value(tree, path)
        except KeyError:
            return False
        if isinstance(want, int | float) and isinstance(have, int | float) and not isinstance(want, bool):
            if not math.isclose(float(want), float(have), rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif want != have:
            return False
    return True


class Paired(Strict):
    """A claim decided by paired differences (docs/sweeps.md, "Paired tests"): per seed, each pair's arm against
    its twin on the task objective (accuracy: arm minus twin in points; perplexity: how many percent lower the
    arm's is). The rule, stated on the results page before the numbers: the claim holds when every difference of
    the deciding pairs is >= 0 and their mean > 0; it is refuted when every difference is < 0 and their mean is
    below -``refute_margin``; otherwise it is undecided."""

    claim: str = Field(min_length=1, max_length=500)
    pairs: list[Pair] = Field(min_length=1, max_length=100)
    refute_margin: float = Field(0.3, ge=0.0, le=100.0)


# A sweep's id is its name plus "-YYYYMMDD-HHMMSS" and, for another sweep of the name in the same second,
# "-NN"; the id names each trial's experiment, whose name rule (NAME_PATTERN) it must meet.
SWEEP_NAME_LENGTH = 100 - len("-YYYYMMDD-HHMMSS-NN")


class SweepSpec(Strict):
    name: str
    description: str = ""
    base: dict[str, Any] | str = Field(default_factory=dict)
    set: dict[str, Any] = Field(default_factory=dict)  # dotted overrides applied to the base
    parameters: dict[str, Param] = Field(default_factory=dict)
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_VALUES)
    search: Search = Search()
    scheduler: Scheduler = Scheduler()
    budget: Budget = Budget()
    resources: Resources = Resources()
    stages: list[Stage] = Field(default_factory=list)  # a staged sweep: run in order under one parent run
    objective: str = "bitops"  # the cost axis: a cost model of engine/cost/cost_models.py
    paired: Paired | None = None  # a claim decided by per-seed differences of twin runs (the results page)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(NAME_PATTERN, v) or len(v) > SWEEP_NAME_LENGTH:
            raise PydanticCustomError("name", "allowed: letters, digits, '.', '_' and '-', starting with a letter or "
                                      f"digit, at most {SWEEP_NAME_LENGTH} characters (the sweep id adds 19)")
        return v

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        from engine.cost.cost_models import check_model_name

        try:
            return check_model_name(v)
        except ConfigError as err:
            raise PydanticCustomError("objective", err.problems[0][2]) from None

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        return _distinct_seeds(v)

    @field_validator("parameters")
    @classmethod
    def _paths(cls, v: dict[str, Param]) -> dict[str, Param]:
        return _check_paths(v)


def _check_paths(v: dict[str, Param]) -> dict[str, Param]:
    for path in v:
        if path == "seed":
            raise ValueError("'seed' is swept through 'seeds', not as a parameter")
        if not all(part.isidentifier() for part in path.split(".")):
            raise ValueError(f"parameter path {path!r} must be dotted identifiers, e.g. schedule.fw")
    return v


def _distinct_seeds(v: list[int] | None) -> list[int] | None:
    """A spec's or a stage's seeds, each once (each seed's range: ExperimentConfig.seed's type)."""
    if v is not None and len(set(v)) != len(v):
        raise PydanticCustomError("seeds", "allowed: distinct seeds")
    return v
