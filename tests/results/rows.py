"""Trial rows built in memory, as ``results.summary`` receives them: each with its point, resolved config, seed,
task objective, training BitOPs and the costs it logged."""

from __future__ import annotations

from engine.config.experiment import parse_config, set_path


def config_of(point: dict):
    """The resolved config of a point, as `fractune results` gets it (the engine parses the logged config)."""
    tree = {"model": {"name": "tiny"}, "data": {"dataset": "digits"}, "optim": {"epochs": 3}}
    for path, value in point.items():
        set_path(tree, path, value)
    return parse_config(tree)


def row(point, seed, acc, ops, cp=float("nan"), **costs):
    return {"point": point, "config": config_of(point), "seed": seed, "accuracy": acc, "train_bitops": ops, "cp": cp,
            "costs": {"bitops": ops, **costs}}
