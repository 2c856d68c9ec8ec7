"""Run names a person reads: over every sweep spec of the repository, each trial's name is short, unique within
its sweep (its stage) and carries what tells it from the others; the rest of its configuration stays in params."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from engine.config.experiment import read_yaml
from search_spaces import naming, trial
from search_spaces.ablation import load_ablation
from search_spaces.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted([*(ROOT / "search_spaces").glob("*.yaml"), *(ROOT / "docs" / "studies").glob("*.yaml")])
MAX_NAME = 40


def _points(loaded) -> list[dict]:
    """Every grid point of a sweep (a range parameter at one probe value)."""
    if getattr(loaded, "points", None) is not None:
        return [dict(p) for p in loaded.points]
    params = loaded.spec.parameters
    grid = {p: (v.grid if v.kind == "grid" else v.choice) for p, v in params.items() if v.kind in ("grid", "choice")}
    ranged = {p: v.probe_values()[0] for p, v in params.items() if v.kind not in ("grid", "choice")}
    return [{**dict(zip(grid, combo)), **ranged} for combo in itertools.product(*grid.values())]


def _names(loaded, stage: str | None = None) -> list[str]:
    """The run names the tracker gives a sweep's trials (seeds included), in order, made unique as it does."""
    varied, taken, out = naming.variation(loaded), set(), []
    for point in _points(loaded):
        for seed in loaded.spec.seeds:
            tree = trial.resolved_tree(trial.encode("s", loaded.base_tree, point, seed))
            name = naming.unique_name(naming.run_name(point, seed, varied, tree["schedule"]["kind"], stage), taken)
            taken.add(name)
            out.append(name)
    return out


def _load(path: Path):
    return load_ablation(path) if "ablation" in read_yaml(path) else load_spec(path)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_specs_run_names_are_short_and_unique_without_a_suffix(path):
    loaded = _load(path)
    for stage, sub in [(s.stage.name, s) for s in loaded.stages] or [(None, loaded)]:
        names = _names(sub, stage)
        assert all(len(n) <= MAX_NAME for n in names), max(names, key=len)
        assert not any("#" in n for n in names), names  # apart by their values, no disambiguator needed
        seeds = sub.spec.seeds
        assert all(n.endswith(f" s{seeds[i % len(seeds)]}") for i, n in enumerate(names))


def _of(name: str) -> list[str]:
    loaded = _load(next(p for p in SPECS if p.stem == name))
    subs = [(s.stage.name, s) for s in loaded.stages] or [(None, loaded)]
    return [n for stage, sub in subs for n in _names(sub, stage) if n.endswith(" s0") or n.endswith(" s3")]


def test_names_carry_the_swept_values_and_the_method_where_methods_differ():
    assert _of("study_fmnist_fractrain_targets") == [
        "cp0=2+0.5 ff0.8 stats:computed s3", "cp0=2.5+0.5 ff0.8 stats:computed s3",
        "cp0=1.5+1 ff0.8 stats:computed s3", "cp0=2+0.5 ff0.65 stats:computed s3", "cp0=2+0.5 ff0.5 stats:computed s3",
        "cp0=1.5+0.5 ff0.8 stats:batch s3", "cp0=2.5+0.25 ff0.8 stats:computed s3",
        "cp0=2.75+0.25 ff0.8 stats:computed s3"]
    assert _of("study_fmnist") == [
        "fp32 s0", "static fw8/bw8 s0", "static fw6/bw8 s0", "pfq manual s0", "pfq auto s0", "cpt s0",
        "dfq cp1.5 masked s0", "dfq cp3 masked s0", "dfq cp1.5 routed s0", "dfq cp3 routed s0", "fractrain s0"]
    # a staged sweep: the stage leads; its retrain row once read "retrain-fractrain paper w4 cp0=1.5+0.5 eps0.1 a0.5
    # ev10 ff0.8 routed option_stateshared routed_sample_fraction1 routed_statisticscomputed s0"
    assert _of("fmnist_finetune") == ["pretrain-fp32 s0", "retrain-fp32 s0", "retrain-static s0", "retrain-pfq s0",
                                      "retrain-cpt s0", "retrain-dfq s0", "retrain-fractrain s0"]
    assert _of("study_fmnist_long_fractrain") == ["state:shared stats:batch s0", "state:skip_apart stats:computed s0"]
    # masked rows beside routed ones that pin routed's own settings: execution alone tells them apart
    assert _of("study_fmnist_option_state") == ["paper masked s3", "6/12-6/8-4/12-4/6-3~ masked s3",
                                                "paper routed s3"]
    assert _of("pfq_eps_alpha")[:2] == ["eps0.02 a0.3 s0", "eps0.02 a0.5 s0"]  # two swept values, one method


def test_a_range_parameter_is_always_named_and_a_tie_gets_a_short_disambiguator():
    spec = parse_spec({"name": "r", "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits"},
                                             "schedule": {"kind": "static", "fw": 8, "bw": 8}},
                       "parameters": {"optim.lr": {"loguniform": [0.01, 0.2]}, "schedule.bw": {"choice": [6, 8]}},
                       "search": {"algorithm": "random", "num_samples": 2}})
    varied = naming.variation(spec)
    assert varied == {"common": ["optim.lr", "schedule.bw"], "by_kind": {}, "kinds": False}
    first = naming.run_name({"optim.lr": 0.01234, "schedule.bw": 8}, 0, varied, "static")
    assert first == "lr0.0123 bw8 s0"
    again = naming.run_name({"optim.lr": 0.012341, "schedule.bw": 8}, 0, varied, "static")  # equal as printed
    assert naming.unique_name(again, {first}) == "lr0.0123 bw8 s0 #2"
    assert naming.run_name({}, 3, {"common": [], "by_kind": {}, "kinds": False}, "dfq") == "dfq s3"  # seeds only
