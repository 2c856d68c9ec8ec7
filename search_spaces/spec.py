"""A sweep spec loaded and checked: ``load_spec`` / ``parse_spec`` give a ``LoadedSpec``, the validated spec (its
fields: ``search_spaces.schema``) with its resolved base experiment. A spec names a base experiment (inline, or a
YAML path relative to the spec) and parameters over any config field by dotted path, each one of ``grid``,
``choice``, ``uniform``, ``loguniform`` or ``int`` (inclusive bounds). ``seeds`` repeat every point. Two objectives
(``orchestrator.sweep.space.objectives``): the task objective, final test ``accuracy`` (max), or test ``perplexity``
(min) for a language model, and the total training cost (min) under the cost model ``objective`` (``bitops`` by
default; any model of engine/cost/cost_models.py, e.g. ``energy`` or ``int_units``). ``load_spec`` reports every
error at once, before any trial: the spec's own fields, and the experiment config of every grid point and of both
ends of every range.
"""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.config.experiment import parse_config, read_yaml, set_path
from engine.config.problems import validation_problems
from engine.errors import ConfigError
from engine.reach import parse_checked
from search_spaces import trial
from search_spaces.schema import Stage, SweepSpec, picks

MAX_CHECKED_POINTS = 2000  # grid points validated one by one (beyond this, each value on its own)
MAX_TRIALS = 100_000  # planned trials of one sweep (a grid's points x num_samples x seeds)
INIT_PLACEHOLDER = "/fractune-stage-init"  # the checkpoint path a stage's points are validated with (set per trial)


class LoadedSpec:
    """A validated spec with its resolved base experiment tree."""

    def __init__(self, spec: SweepSpec, base_tree: dict, source: Path | None):
        self.spec, self.base_tree, self.source = spec, base_tree, source
        self.stages: list[LoadedSpec] = [stage_spec(self, st) for st in spec.stages]
        self.stage: Stage | None = None  # set on the LoadedSpec of one stage

    @property
    def name(self) -> str:
        return self.spec.name

    def point_tree(self, values: dict[str, Any], seed: int) -> dict:
        """The experiment tree of one point: what a trial with these swept values and seed runs."""
        return trial.resolved_tree(trial.encode(self.spec.name, self.base_tree, values, seed))

    def with_objective(self, objective: str, field: str = "--objective") -> LoadedSpec:
        """The same spec with another cost axis (``fractune sweep --objective``), checked like the spec's own."""
        from engine.cost.cost_models import check_model_name

        check_model_name(objective, field)
        spec = self.spec.model_copy(update={"objective": objective})
        problems = _check_objective(spec, self.base_tree)
        if problems:
            raise ConfigError([(field, v, a) for _, v, a in problems])
        return LoadedSpec(spec, self.base_tree, self.source)

    def base_trial(self) -> dict:
        """The trial dict of the base point (no parameter applied, the first seed): planned lengths."""
        return trial.encode(self.spec.name, self.base_tree, {}, self.spec.seeds[0])

    def grid_size(self) -> int:
        n = 1
        for p in self.spec.parameters.values():
            if p.kind == "grid":
                n *= len(p.grid)
        return n

    def num_trials(self) -> int | None:
        if self.stages:
            return sum(st.num_trials() for st in self.stages)
        s = self.spec
        if s.search.algorithm == "grid":
            return self.grid_size() * s.search.num_samples * len(s.seeds)
        if s.search.algorithm == "random":
            return self.grid_size() * s.search.num_samples * len(s.seeds)
        return s.search.num_samples


def load_spec(path: str | Path) -> LoadedSpec:
    p = Path(path)
    tree = read_yaml(p)
    return parse_spec(tree, source=p)


def parse_spec(tree: dict, source: Path | None = None) -> LoadedSpec:
    src = str(source) if source else None
    try:
        spec = SweepSpec.model_validate(tree)
    except ValidationError as exc:
        problems = validation_problems(exc, SweepSpec)
        # Report the experiment points' errors too when the sections they need are themselves valid.
        bad_sections = {f.split(".")[0].split(":")[0] for f, _, _ in problems}
        point_keys = ("base", "set", "parameters", "seeds")
        if not bad_sections & set(point_keys):
            partial = {k: tree[k] for k in point_keys if k in tree}
            try:
                problems += _point_problems(SweepSpec.model_validate({"name": "check", **partial}), source)
            except ValidationError:
                pass
        raise ConfigError(dedupe_problems(problems), src) from None
    problems = _point_problems(spec, source)
    if problems:
        raise ConfigError(dedupe_problems(problems), src)
    return _load(spec, source)


def _base_tree(spec: SweepSpec, source: Path | None) -> tuple[dict, list]:
    problems: list[tuple[str, object, str]] = []
    base_tree: dict = {}
    if isinstance(spec.base, str):
        base_path = Path(spec.base)
        if not base_path.is_absolute() and source is not None:
            base_path = source.parent / base_path  # unresolved: read_yaml names a path no file can have
        try:
            base_tree = read_yaml(base_path)
        except ConfigError as err:
            problems += [("base", spec.base, allowed) for _, _, allowed in err.problems]
    else:
        base_tree = copy.deepcopy(spec.base)
    try:
        for path, value in spec.set.items():
            set_path(base_tree, path, value)
    except ConfigError as err:
        problems += [(f"set.{f}", v, a) for f, v, a in err.problems]
    workers = spec.resources.workers
    if workers > 1 and isinstance(base_tree, dict):  # every trial of the sweep runs on the workers it asks for
        named = base_tree.get("workers", workers)
        if named != workers:
            problems.append(("resources.workers", workers, f"allowed: the base's workers ({named}), or one of the "
                             "two left out"))
        base_tree["workers"] = workers
    elif isinstance(base_tree, dict) and base_tree.get("workers", 1) != 1:  # the trial's resources must know
        problems.append(("base.workers", base_tree["workers"], "allowed: 1; a sweep names its trials' workers in "
                         "resources.workers"))
    if "workers" in spec.parameters:
        problems.append(("parameters.workers", "(swept)", "allowed: resources.workers, the same for every trial"))
    return base_tree, problems


def _load(spec: SweepSpec, source: Path | None) -> LoadedSpec:
    return LoadedSpec(spec, _base_tree(spec, source)[0], source)


def _point_problems(spec: SweepSpec, source: Path | None) -> list[tuple[str, object, str]]:
    base_tree, problems = _base_tree(spec, source)
    if problems:
        return problems
    if spec.stages:
        problems = _check_stages(spec) + _check_objective(spec, base_tree)
        if problems:
            return problems
        loaded = LoadedSpec(spec, base_tree, source)
        for stage, sub in zip(spec.stages, loaded.stages):
            problems += [(f"stages.{stage.name}: {f}", v, a) for f, v, a in _check_search(sub.spec) + _check_points(sub)]
        return problems or _stage_references(loaded) + _check_pairs(loaded)
    loaded = LoadedSpec(spec, base_tree, source)
    size = _size_problems(loaded)
    if size:
        return size
    out = _check_search(spec) + _check_objective(spec, base_tree) + _check_points(loaded)
    return out or _run_problems(loaded) + _check_pairs(loaded)


def _size_problems(loaded: LoadedSpec) -> list[tuple[str, object, str]]:
    n = loaded.num_trials()
    if n is not None and n > MAX_TRIALS:
        return [("parameters", f"{n} trials", f"allowed: at most {MAX_TRIALS} trials in one sweep (grid points x "
                 "search.num_samples x seeds); split the sweep")]
    return []


def _run_problems(loaded: LoadedSpec) -> list[tuple[str, object, str]]:
    """What Tune and the trials would refuse at run time, checked on the base point."""

    spec, out = loaded.spec, []
    cfg = parse_config(loaded.point_tree({}, spec.seeds[0]))
    if spec.scheduler.kind == "asha":
        epochs = cfg.run_length().epochs
        if spec.scheduler.grace_period > epochs:
            out.append(("scheduler.grace_period", spec.scheduler.grace_period,
                        f"allowed: <= the trials' {epochs} epochs (ASHA stops trials at rungs within the run)"))
    if cfg.device == "cuda" and spec.resources.gpu == 0:
        out.append(("resources.gpu", 0, "allowed: > 0 when the trials run with device: cuda"))
    return out


def _check_objective(spec: SweepSpec, base_tree: dict) -> list[tuple[str, object, str]]:
    """``objective: table:NAME`` needs the base experiment's ``cost.table`` to be the table named NAME."""
    if not spec.objective.startswith("table:"):
        return []
    from engine.cost.cost_models import load_cost_table

    path = (base_tree.get("cost") or {}).get("table")
    try:
        name = load_cost_table(path).name if path else None
    except ConfigError:
        return []  # the config check reports the table's own problem
    if name != spec.objective.removeprefix("table:"):
        return [("objective", spec.objective, "allowed with a user table: table:NAME where NAME is the name of "
                 f"the base experiment's cost.table ({'table:' + name if name else 'none set'})")]
    return []


def stage_spec(loaded: LoadedSpec, stage: Stage) -> LoadedSpec:
    """One stage as a sweep of its own (same name, seeds, search, budget, resources): the spec's base tree, then
    the stage's ``set``, then (``init_from``) an ``init`` whose checkpoint each trial gets from its seed's run."""
    spec = loaded.spec.model_copy(update={"stages": [], "parameters": dict(stage.parameters), "set": {},
                                          "seeds": stage.seeds or loaded.spec.seeds})
    tree = copy.deepcopy(loaded.base_tree)
    for path, value in stage.set.items():
        set_path(tree, path, value)
    if stage.init_from:
        set_path(tree, "init", {"checkpoint": INIT_PLACEHOLDER, "head": stage.head})
    sub = LoadedSpec(spec, tree, loaded.source)
    sub.stage = stage
    return sub


def _check_stages(spec: SweepSpec) -> list[tuple[str, object, str]]:
    """The stages' own rules: names, references to earlier stages of one trial per seed, grid search only."""
    out: list[tuple[str, object, str]] = []
    if spec.parameters:
        out.append(("parameters", sorted(spec.parameters), "allowed: {} with stages (each stage has its own)"))
    if spec.search.algorithm != "grid" or spec.search.num_samples != 1:
        out.append(("search.algorithm", spec.search.algorithm, "allowed: grid with num_samples 1 in a staged sweep"))
    earlier: dict[str, Stage] = {}
    for i, stage in enumerate(spec.stages):
        where = f"stages[{i}]"
        if stage.name in earlier:
            out.append((f"{where}.name", stage.name, "allowed: a name no other stage has"))
        for path, p in stage.parameters.items():
            if p.kind != "grid":
                out.append((f"{where}.parameters.{path}", p.kind, "allowed: grid (stages are grid searches)"))
        if stage.init_from is not None and any(k == "init" or k.startswith("init.") for k in stage.set):
            out.append((f"{where}.set.init", {k: v for k, v in stage.set.items() if k.startswith("init")},
                        "allowed: no init with init_from (each trial's init.checkpoint is its seed's earlier run)"))
        sources = {s.init_from for s in spec.stages}
        if stage.seeds is not None and (stage.init_from is not None or stage.name in sources):
            out.append((f"{where}.seeds", stage.seeds, "allowed: unset in a stage that starts from another or that "
                        "another starts from (their trials pair up by seed)"))
        if stage.init_from is not None:
            ref = earlier.get(stage.init_from)
            if ref is None:
                out.append((f"{where}.init_from", stage.init_from,
                            f"allowed: an earlier stage ({', '.join(earlier) or 'none before this one'})"))
            elif ref.parameters:
                out.append((f"{where}.init_from", stage.init_from, "allowed: a stage with no parameters (one run "
                            "per seed, which the trial of the same seed starts from)"))
        earlier[stage.name] = stage
    return out


def _stage_references(loaded: LoadedSpec) -> list[tuple[str, object, str]]:
    """A stage starts from another's weights: same model; same data set's classes unless the head is reset."""
    out: list[tuple[str, object, str]] = []
    by_name = {sub.stage.name: sub for sub in loaded.stages}
    for i, sub in enumerate(loaded.stages):
        stage = sub.stage
        if not stage.init_from:
            continue
        ref = by_name[stage.init_from]
        seed = loaded.spec.seeds[0]
        here, there = parse_config(sub.point_tree({}, seed)), parse_config(ref.point_tree({}, seed))
        if here.model.name != there.model.name:
            out.append((f"stages[{i}].init_from", stage.init_from, f"allowed: a stage of this stage's model "
                        f"{here.model.name} (stage {ref.stage.name} trains {there.model.name})"))
        if stage.head == "keep" and here.data.dataset != there.data.dataset:
            out.append((f"stages[{i}].head", "keep", f"allowed: reset when the data sets differ "
                        f"({there.data.dataset} -> {here.data.dataset})"))
    return out


def _check_pairs(loaded: LoadedSpec) -> list[tuple[str, object, str]]:
    """Every side of a pair picks at least one grid point of the sweep, and the arm and its twin different ones:
    a misspelt path or value would otherwise pair nothing, silently."""
    paired = loaded.spec.paired
    if paired is None:
        return []
    trees = []
    for part in loaded.stages or [loaded]:  # a staged sweep: every stage's points
        grid = {k: p for k, p in part.spec.parameters.items() if p.kind == "grid"}
        if part.spec.search.algorithm != "grid" or len(grid) != len(part.spec.parameters):
            return [("paired", "pairs", "allowed: a grid search (a pair names grid points)")]
        keys = list(grid)
        trees += [parse_config(part.point_tree(dict(zip(keys, combo)), part.spec.seeds[0])).to_dict()
                  for combo in itertools.product(*(grid[k].grid for k in keys))]
    out = []
    for i, pair in enumerate(paired.pairs):
        chosen = {}
        for side in ("arm", "twin"):
            selector = getattr(pair, side)
            chosen[side] = {j for j, t in enumerate(trees) if picks(selector, t)}
            if not chosen[side]:
                out.append((f"paired.pairs.{i}.{side}", selector, "allowed: config values that pick at least one "
                            "grid point of this sweep (none does)"))
        if chosen["arm"] and chosen["arm"] == chosen["twin"]:
            out.append((f"paired.pairs.{i}.twin", pair.twin, "allowed: values that pick other grid points than "
                        "the arm's"))
    return out


def _check_search(spec: SweepSpec) -> list[tuple[str, object, str]]:
    out = []
    kinds = {path: p.kind for path, p in spec.parameters.items()}
    algo = spec.search.algorithm
    if algo == "grid":
        for path, kind in kinds.items():
            if kind != "grid":
                out.append((f"parameters.{path}", kind, "search.algorithm grid allows only grid parameters; "
                            "use random or optuna for choice/uniform/loguniform/int"))
    if algo == "random" and spec.search.num_samples > 1 and all(k == "grid" for k in kinds.values()):
        out.append(("search.num_samples", spec.search.num_samples, "allowed: 1 when no parameter is sampled "
                    "(random search draws the choice, uniform, loguniform and int parameters; with none, every "
                    "sample repeats the same trials: repeat them over seeds)"))
    if algo == "optuna":
        for path, kind in kinds.items():
            if kind == "grid":
                out.append((f"parameters.{path}", kind, "search.algorithm optuna cannot search a grid; use choice"))
        if len(spec.seeds) != 1:
            out.append(("seeds", spec.seeds, "search.algorithm optuna evaluates each point once: give one seed "
                        "(use grid or random to repeat points over seeds)"))
        if not spec.parameters:
            out.append(("parameters", {}, "search.algorithm optuna needs at least one parameter"))
        for path, p in spec.parameters.items():
            odd = [v for v in (p.choice or []) if v is not None and not isinstance(v, bool | int | float | str)]
            if odd:
                out.append((f"parameters.{path}.choice", odd[0], "search.algorithm optuna keeps its choices in "
                            "a journal: allowed: null, true/false, numbers and strings (sweep whole sections "
                            "with random or grid)"))
    return out


def _check_points(loaded: LoadedSpec) -> list[tuple[str, object, str]]:
    spec = loaded.spec
    seed = spec.seeds[0]
    out: list[tuple[str, object, str]] = []

    def check(values: dict[str, Any], label: str) -> None:
        try:
            parse_checked(loaded.point_tree(values, seed))
        except ConfigError as err:
            out.extend((f"{label}: {f}", v, a) for f, v, a in err.problems)

    check({}, "base")
    if out:
        return out
    grid = {k: p for k, p in spec.parameters.items() if p.kind == "grid"}
    others = {k: p for k, p in spec.parameters.items() if p.kind != "grid"}
    grid_points = math.prod(len(p.grid) for p in grid.values()) if grid else 1
    if grid and grid_points <= MAX_CHECKED_POINTS:
        keys = list(grid)
        for combo in itertools.product(*(range(len(grid[k].grid)) for k in keys)):
            values = {k: grid[k].grid[i] for k, i in zip(keys, combo)}
            check(values, "parameters " + ", ".join(f"{k}[{i}]" for k, i in zip(keys, combo)))
    else:
        for k, p in grid.items():
            for i, v in enumerate(p.grid):
                check({k: v}, f"parameters.{k}.grid[{i}]")
    for k, p in others.items():
        for i, v in enumerate(p.probe_values()):
            where = f"parameters.{k}.{p.kind}[{i}]"
            check({k: v}, where)
    for s in spec.seeds[1:]:
        try:
            parse_config(loaded.point_tree({}, s))
        except ConfigError as err:
            out.extend((f"seeds: {f}", v, a) for f, v, a in err.problems)
    return out


def dedupe_problems(problems: list[tuple[str, object, str]]) -> list[tuple[str, object, str]]:
    seen, out = set(), []
    for p in problems:
        key = (p[0], repr(p[1]), p[2])
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out
