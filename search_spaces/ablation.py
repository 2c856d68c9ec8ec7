"""Ablation specs: a sweep spec whose ``parameters`` come from an ``ablation:`` section.

```yaml
ablation:
  mode: ofat                      # ofat: one factor at a time around the baseline | grid: every combination
  factors:                        # dotted config paths -> their levels (scalars, lists or whole sections)
    schedule.epsilon: [0.02, 0.05, 0.15]
    schedule.alpha: [0.3, 0.5, 1.0]
  baseline: {schedule.epsilon: 0.05, schedule.alpha: 0.5}   # ofat: one level of every factor
  importance: fanova              # fanova | ped_anova | mdi (Optuna's evaluators)
  verdict: {moderate: 2.0, sensitive: 4.0}   # thresholds on range of level means / pooled seed std
```

The points (one dict of factor values each) become one grid of a normal sweep (``orchestrator.sweep.driver``), every
point repeated over ``seeds``. ``parse_ablation`` reports every error at once, like ``parse_spec``: the
section's own fields, the rest of the spec, and every point as a complete experiment config.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from engine.config.experiment import read_yaml
from engine.config.problems import validation_problems
from engine.config.types import Strict
from engine.errors import ConfigError
from engine.reach import parse_checked
from search_spaces.spec import MAX_CHECKED_POINTS, MAX_TRIALS, LoadedSpec, dedupe_problems, parse_spec


class Verdict(Strict):
    moderate: float = Field(2.0, gt=0)  # ratio at or above this: moderate (noise alone: median 1.2-1.7)
    sensitive: float = Field(4.0, gt=0)  # ... sensitive (noise alone reaches it ~5% of the time)


class Ablation(Strict):
    mode: Literal["ofat", "grid"] = "ofat"
    factors: dict[str, list[Any]]
    baseline: dict[str, Any] = Field(default_factory=dict)
    importance: Literal["fanova", "ped_anova", "mdi"] = "fanova"
    verdict: Verdict = Verdict()


MAX_LEVELS = 1000  # levels of one factor


def level_label(value: Any) -> str:
    """A level's name in tables, JSON keys and Optuna's categorical choices: strings as they are, the rest
    as compact JSON (0.05 -> "0.05", [3, 4] -> "[3, 4]"); what JSON cannot hold (a YAML date, bytes or set, a
    mapping with mixed keys) by its repr, so that the check of the level's point names it."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


class LoadedAblation(LoadedSpec):
    """A validated ablation: the sweep spec, its base tree and the explicit list of points."""

    def __init__(self, loaded: LoadedSpec, ablation: Ablation, points: list[dict[str, Any]]):
        super().__init__(loaded.spec, loaded.base_tree, loaded.source)
        self.ablation, self.points = ablation, points

    def grid_size(self) -> int:
        return len(self.points)

    def num_trials(self) -> int:
        return len(self.points) * self.spec.search.num_samples * len(self.spec.seeds)

    def meta(self) -> dict:
        """What reports need to know of the design (logged as ``ablation.json`` on the sweep's parent run)."""
        a = self.ablation
        return {"mode": a.mode, "factors": {k: list(v) for k, v in a.factors.items()},
                "labels": {k: [level_label(v) for v in levels] for k, levels in a.factors.items()},
                "baseline": {k: level_label(v) for k, v in a.baseline.items()}, "importance": a.importance,
                "verdict": a.verdict.model_dump(), "points": self.points, "seeds": list(self.spec.seeds)}


def make_points(ab: Ablation) -> list[dict[str, Any]]:
    """ofat: the baseline, then each factor's other levels with the rest at baseline. grid: the product."""
    if ab.mode == "grid":
        keys = list(ab.factors)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(ab.factors[k] for k in keys))]
    points = [dict(ab.baseline)]
    for path, levels in ab.factors.items():
        for value in levels:
            if level_label(value) != level_label(ab.baseline[path]):
                points.append({**ab.baseline, path: value})
    return points


def _section_problems(ab: Ablation) -> list[tuple[str, object, str]]:
    out: list[tuple[str, object, str]] = []
    if not ab.factors:
        out.append(("ablation.factors", {}, "give at least one factor: a dotted config path and its levels"))
    paths = list(ab.factors)
    for path, levels in ab.factors.items():
        where = f"ablation.factors.{path}"
        if path == "seed" or not all(part.isidentifier() for part in path.split(".")):
            out.append((where, path, "a dotted config path, e.g. schedule.epsilon ('seed' goes in seeds)"))
        if len(levels) < 2:
            out.append((where, levels, "at least two levels"))
        if len(levels) > MAX_LEVELS:
            out.append((where, f"{len(levels)} levels", f"allowed: at most {MAX_LEVELS} levels per factor"))
            continue
        labels = [level_label(v) for v in levels]
        if len(set(labels)) != len(labels):
            out.append((where, levels, "distinct levels"))
        for other in paths:
            if other.startswith(path + "."):
                out.append((where, other, "factors must not nest (one is a section of the other)"))
    if ab.mode == "ofat":
        for path, levels in ab.factors.items():
            if path not in ab.baseline:
                out.append((f"ablation.baseline.{path}", None, "ofat needs a baseline level for every factor"))
            elif level_label(ab.baseline[path]) not in {level_label(v) for v in levels}:
                out.append((f"ablation.baseline.{path}", ab.baseline[path],
                            f"one of the factor's levels {[level_label(v) for v in levels]}"))
    for path in ab.baseline:
        if path not in ab.factors:
            out.append((f"ablation.baseline.{path}", ab.baseline[path], f"allowed keys: the factors {paths}"))
    if ab.verdict.moderate >= ab.verdict.sensitive:
        out.append(("ablation.verdict", ab.verdict.model_dump(), "moderate < sensitive"))
    if ab.mode == "grid":
        n = 1
        for levels in ab.factors.values():
            n *= len(levels)
        if n > MAX_CHECKED_POINTS:
            out.append(("ablation.factors", n, f"at most {MAX_CHECKED_POINTS} grid points"))
    return out


def load_ablation(path: str | Path) -> LoadedAblation:
    p = Path(path)
    return parse_ablation(read_yaml(p), source=p)


def parse_ablation(tree: dict, source: Path | None = None) -> LoadedAblation:
    src = str(source) if source else None
    problems: list[tuple[str, object, str]] = []
    ab = _section(tree, problems)
    rest = {k: v for k, v in tree.items() if k != "ablation"}
    if rest.get("parameters"):
        problems.append(("parameters", sorted(map(str, rest["parameters"])) if isinstance(rest["parameters"], dict)
                         else rest["parameters"], "an ablation sweeps its ablation.factors: leave parameters out"))
        rest.pop("parameters")
    search = rest.get("search")
    if isinstance(search, dict) and search.get("algorithm", "grid") != "grid":
        problems.append(("search.algorithm", search["algorithm"], "an ablation runs a grid: allowed: 'grid'"))
        rest["search"] = {k: v for k, v in search.items() if k != "algorithm"}
    loaded = None
    try:
        loaded = parse_spec(rest, source)
    except ConfigError as err:
        problems += err.problems
        try:  # the points need only a valid base: check them too, so every error comes out at once
            point_keys = {k: rest[k] for k in ("base", "set", "seeds") if k in rest}
            loaded = parse_spec({**point_keys, "name": "check"}, source)
        except ConfigError:
            pass
    design_ok = ab is not None and not any(f.startswith(("ablation.factors", "ablation.baseline"))
                                           for f, _, _ in problems)
    if design_ok and loaded is not None:
        n = len(make_points(ab)) * loaded.spec.search.num_samples * len(loaded.spec.seeds)
        if n > MAX_TRIALS:
            problems.append(("ablation.factors", f"{n} trials", f"allowed: at most {MAX_TRIALS} trials (points x "
                             "search.num_samples x seeds)"))
            design_ok = False
    if loaded is not None and design_ok:
        problems += _point_problems(loaded, ab)
    if problems:
        raise ConfigError(dedupe_problems(problems), src)
    return LoadedAblation(loaded, ab, make_points(ab))


def _section(tree: dict, problems: list) -> Ablation | None:
    """The validated section, adding its problems; fields pydantic rejects are dropped so that the design
    checks (levels, baseline) still run on the rest."""
    if "ablation" not in tree:
        problems.append(("ablation", None, "an ablation spec needs an ablation section (mode, factors, baseline; "
                         "docs/ablations.md); use fractune sweep for a plain sweep"))
        return None
    section = tree["ablation"]
    try:
        ab = Ablation.model_validate(section)
    except ValidationError as exc:
        problems += validation_problems(exc, Ablation, prefix="ablation")
        if not isinstance(section, dict):
            return None
        bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
        try:
            ab = Ablation.model_validate({k: v for k, v in section.items() if k not in bad})
        except ValidationError:
            return None
        extra = _section_problems(ab)
        if "mode" in bad:  # the baseline rules depend on the mode: with no valid mode they would only guess
            extra = [p for p in extra if not p[0].startswith("ablation.baseline")]
        problems += extra
        return None  # never run a design whose section had errors
    problems += _section_problems(ab)
    return ab


def _point_problems(loaded: LoadedSpec, ab: Ablation) -> list[tuple[str, object, str]]:
    """Every point as a complete experiment config. Each level is first checked on its own (one line per
    bad level, named by its factor and index); the combinations of a grid only once every level passes."""
    out: list[tuple[str, object, str]] = []
    seed = loaded.spec.seeds[0]

    def check(values: dict[str, Any], where: str) -> None:
        try:
            parse_checked(loaded.point_tree(values, seed))
        except ConfigError as err:
            out.extend((f"{where}: {f}", v, a) for f, v, a in err.problems)

    if ab.mode == "ofat":
        check(ab.baseline, "ablation.baseline")
        if out:
            return out
    reference = ab.baseline if ab.mode == "ofat" else {k: levels[0] for k, levels in ab.factors.items()}
    for path, levels in ab.factors.items():
        for i, value in enumerate(levels):
            check({**reference, path: value}, f"ablation.factors.{path}[{i}]")
    if ab.mode == "grid" and not out:
        for values in make_points(ab)[:MAX_CHECKED_POINTS]:
            check(values, "ablation point " + ", ".join(f"{k}={level_label(v)}" for k, v in values.items()))
    return out

