"""What a sweep optimises, defined once: the task objective (``Objective``: the metric a trial is judged by, its
direction, how it is labelled, scaled and printed) and the cost models of the cost axis.

Every registered objective is one entry of ``OBJECTIVES``. A sweep's objective is resolved once, where its trials
are read (``of_rows``: the objective whose metric the trials report; ``of_task``: the one a model's task
optimises, at sweep time), then carried: ``results.runs.SweepRuns.task`` for rows read back from MLflow, and an
argument of every front, table and view. Nothing downstream works it out again; adding a quality metric is one
``register`` call.

The cost models (``COST_MODELS``, the engine's ``engine.cost.cost_models.MODEL_NAMES`` plus a user table) are named
here for the CLI's help, the API and the views.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from engine.cost.cost_models import MODEL_NAMES, UNITS
from engine.metrics import ACCURACY, PERPLEXITY, Task


class Direction(StrEnum):
    """Which way an objective improves; its value is the short form (``max``, ``min``)."""

    MAX = "max"
    MIN = "min"

    @property
    def optuna(self) -> str:
        """The direction as Optuna and the JSON name it: ``maximize`` or ``minimize``."""
        return "maximize" if self is Direction.MAX else "minimize"

    def best(self, values: Iterable[float]) -> float:
        return (max if self is Direction.MAX else min)(values)


@dataclass(frozen=True)
class Objective:
    """A task objective, resolved: the metric ``key`` a trial reports, its ``direction`` and how it is shown.

    ``label``: the axis title (``test accuracy``); ``word``: the name in running text (``accuracy``); ``column``:
    a table's column of its values (``accuracy %``); ``short``: the abbreviation in a delta's column (``acc.``);
    ``scale`` and ``unit``: a value as tables show it (accuracy x 100, in %); ``fmt``: a raw value printed
    (progress lines, hovers). ``relative``: two values compare by their relative change in percent (perplexity)
    rather than their difference in points of ``scale``; ``tolerance``: how far a value may fall short of a
    reference and still count as comparable (points, or percent when ``relative``). ``inverse``: the
    hypervolume's quality axis is ``1 / value`` (from a reference of infinity) rather than the value (from 0).
    ``task``: the model task that optimises it by default (None: chosen only where trials report it)."""

    key: str
    direction: Direction
    label: str
    word: str
    column: str
    short: str
    scale: float = 1.0
    unit: str = ""
    fmt: str = ".4f"
    relative: bool = False
    tolerance: float = 1.0
    inverse: bool = False
    task: Task | None = None

    @property
    def mode(self) -> str:
        return self.direction.value

    def __str__(self) -> str:  # "accuracy max"
        return f"{self.key} {self.direction.value}"

    def value_text(self, value: float) -> str:
        """``accuracy 0.9123``, ``perplexity 51.20``: a raw value as a progress line or a hover names it."""
        return f"{self.key} {value:{self.fmt}}"

    def quality(self, value: float) -> float:
        """The value on the hypervolume's quality axis (higher is better, 0 at the reference point)."""
        if self.inverse:
            return 1.0 / value if value > 0 else 0.0
        return value


OBJECTIVES: dict[str, Objective] = {}  # key -> objective, in registration order (the default first)


def register(objective: Objective) -> Objective:
    """Add ``objective`` to the registry (replacing one of the same key); returns it."""
    OBJECTIVES[objective.key] = objective
    return objective


def unregister(key: str) -> None:
    OBJECTIVES.pop(key, None)


ACCURACY_OBJECTIVE = register(Objective(ACCURACY, Direction.MAX, "test accuracy", ACCURACY, "accuracy %", "acc.",
                                        scale=100.0, unit="%", fmt=".4f", tolerance=1.0, task=Task.CLASSIFIER))
PERPLEXITY_OBJECTIVE = register(Objective(PERPLEXITY, Direction.MIN, "test perplexity", "test perplexity",
                                          "test perplexity", "ppl.", fmt=".2f", relative=True, tolerance=2.0,
                                          inverse=True, task=Task.LANGUAGE_MODEL))
DEFAULT = ACCURACY_OBJECTIVE


def of_rows(rows: Iterable[dict]) -> Objective:
    """The objective of logged trials: the latest registered one (the default aside) whose metric they report,
    else the default (accuracy)."""
    rows = list(rows)
    for objective in reversed(list(OBJECTIVES.values())):
        if objective is not DEFAULT and any(math.isfinite(r.get(objective.key, math.nan)) for r in rows):
            return objective
    return DEFAULT


def of_task(task: Task) -> Objective:
    """The objective a model's task optimises (accuracy for a classifier, test perplexity for a language model)."""
    return next((o for o in OBJECTIVES.values() if o.task is task), DEFAULT)


def of_spec(loaded) -> Objective:
    """The objective of a sweep (a ``search_spaces.spec.LoadedSpec``, or one stage's), from its model's task."""
    from engine.models import task_of
    from search_spaces import trial

    return of_task(task_of(trial.decode(loaded.base_trial()).model.name))


def of_key(key: str) -> Objective:
    """The registered objective of the metric ``key`` (an ablation's ``ablation.json`` names its objective)."""
    return OBJECTIVES.get(key, DEFAULT)


# The cost models of the cost axis: the engine's, then a user's table (``table:NAME``); each one's unit.
COST_MODELS = (*MODEL_NAMES, "table:NAME")
COST_UNITS = UNITS


def cost_models_text(last: str = "or") -> str:
    """``bitops, macs, int_units, energy, memory or table:NAME``: the cost models as help texts list them."""
    return f"{', '.join(COST_MODELS[:-1])} {last} {COST_MODELS[-1]}"
