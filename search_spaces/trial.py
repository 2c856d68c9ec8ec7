"""A trial's config as Ray Tune carries it: the one place that encodes and decodes it.

A trial is the dict ``{"sweep": sweep id, "base": the spec's base tree, "params": {dotted path: value},
"seed": int}``. The orchestrator encodes it (with Tune's search domains as the values: ``tune.grid_search``,
``tune.choice``...), Tune samples it, and the trainable, the tracker and the sweep's summary decode the sampled
dict to the ``ExperimentConfig`` the engine runs: the base tree with every swept value set at its dotted path
(``engine.config.experiment.set_path``), then the seed. The swept values also travel to MLflow, as JSON in the
``fractune.point`` tag of the trial's run, which the readers decode typed (MLflow params are strings).

No Ray here: the domains are whatever the caller puts in ``params``. ``engine.config.experiment`` (which imports torch) is
imported where a config is built, so readers of MLflow that only decode points (``fractune pareto``) start fast.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.experiment import ExperimentConfig

SWEEP, BASE, PARAMS, SEED = "sweep", "base", "params", "seed"
STAGE, INITS = "stage", "inits"  # staged sweeps: the stage's name; {seed: the earlier stage's run it starts from}
INIT_RUNS = "init_runs"  # {MLflow run id: its final checkpoint}, for trials that start from init.run_id
WORKERS = "workers"  # a data-parallel trial: {"cpu", "gpu"} of each of its Ray Train workers, "max_failures"
MAX_POINT_TAG = 7000  # characters: MLflow's tag limit is 8000; longer points fall back to the flattened params


def encode(sweep: str, base_tree: dict, params: Any, seed: Any) -> dict:
    """A trial dict; ``params`` and ``seed`` may hold Tune domains (a whole grid of points, for ablations)."""
    return {SWEEP: sweep, BASE: base_tree, PARAMS: params, SEED: seed}


def resolved_tree(trial: dict) -> dict:
    """The experiment tree of a sampled trial: the base, every swept value at its path, the seed."""
    from engine.config.experiment import set_path

    tree = copy.deepcopy(trial[BASE])
    for path, value in swept_values(trial).items():
        set_path(tree, path, value)
    tree["seed"] = int(trial[SEED])
    tree.setdefault("name", trial.get(SWEEP) or "trial")
    source = init_source(trial)
    if source and source.get("checkpoint"):  # a staged sweep: the weights of this seed's earlier run
        set_path(tree, "init.checkpoint", source["checkpoint"])
        set_path(tree, "init.run_id", source.get("run_id"))
    run_id = unresolved_run(tree)
    if run_id is not None:  # init.run_id alone: the checkpoint the orchestrator resolved for it
        checkpoint = (trial.get(INIT_RUNS) or {}).get(run_id)
        if checkpoint:
            set_path(tree, "init.checkpoint", checkpoint)
    return tree


def unresolved_run(tree: dict) -> str | None:
    """The run id an experiment tree starts from (``init.run_id``) that still needs its checkpoint, else None."""
    init = tree.get("init")
    if isinstance(init, dict) and init.get("run_id") and not init.get("checkpoint"):
        return str(init["run_id"])
    return None


def with_init_runs(trial: dict, init_runs: dict[str, str] | None) -> dict:
    """``trial`` carrying the checkpoint of each run its ``init.run_id`` may name (``results.lineage``)."""
    return {**trial, INIT_RUNS: dict(init_runs)} if init_runs else trial


def with_workers(trial: dict, cpu: float, gpu: float, max_failures: int) -> dict:
    """``trial`` carrying what each of its data-parallel workers gets, and how often its worker group may be
    restarted from its last checkpoint after losing a worker."""
    return {**trial, WORKERS: {"cpu": cpu, "gpu": gpu, "max_failures": max_failures}}


def staged(trial: dict, stage: str, inits: dict[int, dict] | None) -> dict:
    """A trial dict of one stage of a staged sweep; ``inits``: per seed, the earlier stage's run this stage's trial
    of that seed starts from (``{"checkpoint", "run_id"}``) or why there is none (``{"error", "run_id"}``)."""
    out = {**trial, STAGE: stage}
    if inits is not None:
        out[INITS] = {str(seed): dict(v) for seed, v in inits.items()}
    return out


def init_source(trial: dict) -> dict | None:
    """The earlier run a staged trial starts from (None outside staged sweeps and for a first stage)."""
    inits = trial.get(INITS)
    if not inits:
        return None
    return inits.get(str(int(trial[SEED]))) or {"error": f"no run of seed {trial[SEED]} in the earlier stage"}


def init_error(trial: dict) -> str | None:
    """Why a staged trial cannot start (its seed's run of the earlier stage failed), else None."""
    source = init_source(trial)
    return source.get("error") if source and not source.get("checkpoint") else None


def decode(trial: dict) -> ExperimentConfig:
    """The ``ExperimentConfig`` of a sampled trial (validated: a bad point raises ``ConfigError``)."""
    from engine.config.experiment import parse_config

    return parse_config(resolved_tree(trial))


def swept_values(trial: dict) -> dict[str, Any]:
    """``{dotted path: value}`` of the parameters sampled for this trial (the seed is not one of them)."""
    return dict(trial.get(PARAMS) or {})


def label(trial: dict, variation: dict) -> str | None:
    """``METHOD [RUN NAME]`` (``FW4/BW8 [static fw4/bw8 s0]``): how the sweep's progress and error lines name a
    trial, by its method label and the run name the tracker gives it (before any ``#2`` that tells apart two
    trials that read the same); ``variation``: what tells the sweep's trials apart (``naming.variation``). None
    for a config that does not decode (the caller names the trial by Tune's id)."""
    from search_spaces import naming

    try:
        schedule = decode(trial).schedule
        name = naming.run_name(swept_values(trial), trial.get(SEED), variation, schedule.kind, trial.get(STAGE))
    except Exception:  # a line naming the trial must not fail on a config it cannot read
        return None
    return f"{schedule.label()} [{name}]"


def point_tag(values: dict[str, Any]) -> str:
    """The swept values as the JSON of the ``fractune.point`` tag; empty when too long for a tag."""
    text = json.dumps(values, sort_keys=True, default=str)
    return text if len(text) <= MAX_POINT_TAG else ""


def point_of(tag: str | None, params: dict[str, str], swept: list[str]) -> dict[str, Any]:
    """A run's swept values, typed: the JSON tag, else rebuilt from the flattened params (sections as dicts)."""
    if tag:
        return json.loads(tag)
    out: dict[str, Any] = {}
    for path in swept:
        if path in params:
            out[path] = param_value(params[path])
            continue
        sub = {k[len(path) + 1:]: param_value(v) for k, v in params.items() if k.startswith(path + ".")}
        if sub:
            from engine.config.experiment import set_path

            section: dict = {}
            for key, value in sub.items():
                set_path(section, key, value)
            out[path] = section
    return out


def param_value(text: str | None) -> Any:
    """A flattened MLflow param back as a value (``"8"`` -> 8, ``"[3, 4]"`` -> [3, 4], ``"null"`` -> None)."""
    if text is None:
        return None
    from engine import safe_yaml
    from engine.errors import ConfigError

    try:
        return safe_yaml.loads(text, "param")  # the guarded reader: a store's params are input like any file
    except ConfigError:
        return text
