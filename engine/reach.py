"""A gated config's exact cp reach before training (docs/methods.md §6.4, "Cost bases"): the network built on
the CPU as a run builds it, each block priced at each option (a skip at what its path runs), and the targets
checked against the lowest and highest cp its options give, as ``fractune train`` checks them once it has
built the network. ``validate`` and a sweep's checks call it where the config alone cannot decide
(``engine.config.experiment.target_undecided``), so a target no run can reach is refused before any trial."""

from __future__ import annotations

import json
from functools import lru_cache

from engine.config.experiment import ExperimentConfig, parse_config, target_problems, target_undecided
from engine.errors import ConfigError
from engine.models.catalog import is_language_model

# the fields that move a target, not the network or its prices: a sweep over targets builds one network
_TARGET_FIELDS = ("target_cp", "cp0", "cp_total", "cp_step", "num_turning_points", "band", "relax")


def parse_checked(tree: dict, source: str | None = None) -> ExperimentConfig:
    """``parse_config``, then the exact reach where the config alone cannot decide: the check of a config that
    is about to run (``validate``, every point of a sweep or an ablation before it starts)."""
    cfg = parse_config(tree, source)
    if problems := exact_target_problems(cfg):
        raise ConfigError(problems, source)
    return cfg


def exact_target_problems(cfg: ExperimentConfig) -> list[tuple[str, object, str]]:
    """The config's unreachable cp targets on its built network; [] where the config alone decides, and for a
    language model on the whole-model basis (its output layer's size is the corpus's vocabulary, known once the
    corpus is read: ``train`` checks it then)."""
    if not target_undecided(cfg) or (cfg.schedule.cost_basis == "model" and is_language_model(cfg.model.name)):
        return []
    return target_problems(cfg, _reach(_network_key(cfg)))


def _network_key(cfg: ExperimentConfig) -> str:
    tree = cfg.model_dump(mode="json", include={"model", "data", "quant", "schedule", "cost"})
    tree["data"] = {k: tree["data"][k] for k in ("dataset", "seq_len")}
    for key in _TARGET_FIELDS:
        tree["schedule"].pop(key, None)
    return json.dumps(tree, sort_keys=True)


@lru_cache(maxsize=64)
def _reach(key: str) -> tuple[float, float]:
    import torch

    from engine.data.catalog import INFO
    from engine.dfq.gated_runner import cost_bases
    from engine.train import prepare

    cfg = ExperimentConfig.model_validate(json.loads(key))  # the targets at their defaults: not checked here
    model, counter = prepare(cfg, INFO[cfg.data.dataset], torch.device("cpu"))
    _, bases = cost_bases(cfg.schedule, model, counter, cfg.model.name)
    return bases[cfg.schedule.cost_basis].reach()
