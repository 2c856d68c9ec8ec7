"""What Tune samples a sweep's trials from: the spec's parameters as Tune domains in the trial dict
(``search_spaces.trial``), the two objectives the searcher and the front rank on, and the search algorithm
(grid, random, or Optuna's TPE / NSGA-II with a journal under the sweep's storage)."""

from __future__ import annotations

from pathlib import Path

from engine.metrics import cost_key
from search_spaces import trial
from search_spaces.spec import LoadedSpec


def tune_metrics(loaded: LoadedSpec) -> tuple[tuple[str, str], ...]:
    """The sweep's two objectives as the trials' metric keys and their directions, what Tune's search and
    scheduler optimise: the task objective (``results.objectives.of_spec``) and the training cost (min) under the
    spec's cost model (``objective``: ``train_bitops`` for bitops, ``train_cost_<model>`` otherwise)."""
    from results import objectives

    task = objectives.of_spec(loaded)
    return (task.key, task.mode), (cost_key(loaded.spec.objective), "min")


def domain(param):
    from ray import tune

    kind = param.kind
    if kind == "grid":
        return tune.grid_search(list(param.grid))
    if kind == "choice":
        return tune.choice(list(param.choice))
    if kind == "uniform":
        return tune.uniform(*param.uniform)
    if kind == "loguniform":
        return tune.loguniform(*param.loguniform)
    return tune.randint(param.int[0], param.int[1] + 1)  # inclusive bounds in the spec


def param_space(loaded: LoadedSpec, sweep_id: str, init_runs: dict[str, str] | None = None) -> dict:
    """The trial dict (``search_spaces.trial``) with Tune's domains: what Tune samples each trial from;
    ``init_runs``: the checkpoint of every ``init.run_id`` the trials may start from (``results.lineage``)."""
    from ray import tune

    spec = loaded.spec
    seeds = spec.seeds
    points = getattr(loaded, "points", None)  # an ablation: its explicit list of points, one grid over them
    params = (tune.grid_search([dict(p) for p in points]) if points is not None
              else {path: domain(p) for path, p in spec.parameters.items()})
    out = trial.with_init_runs(trial.encode(sweep_id, loaded.base_tree, params,
                                            tune.grid_search(list(seeds)) if len(seeds) > 1 else seeds[0]),
                               init_runs)
    if spec.resources.workers > 1:
        out = trial.with_workers(out, spec.resources.cpu, spec.resources.gpu, spec.budget.max_failures)
    return out


def search_algorithm(loaded: LoadedSpec, sweep_id: str, root: Path):
    s = loaded.spec.search
    if s.algorithm == "grid":
        return None
    if s.algorithm == "random":
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(random_state=s.seed)
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    journal = root / "optuna" / f"{sweep_id}.journal"
    journal.parent.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    sampler = (optuna.samplers.NSGAIISampler(seed=s.seed) if s.sampler == "nsga2"
               else optuna.samplers.TPESampler(seed=s.seed))
    # No metric/mode in TuneConfig with a list metric (it only takes strings): they go here.
    objs = tune_metrics(loaded)
    return OptunaSearch(metric=[m for m, _ in objs], mode=[d for _, d in objs], study_name=sweep_id,
                        storage=storage, sampler=sampler)
