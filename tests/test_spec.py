"""Sweep specs: every error at once, before any trial; presets all valid."""

from __future__ import annotations

import copy

import pytest

from engine.errors import ConfigError
from search_spaces import PRESETS_DIR, load_spec, parse_spec
from tests.conftest import ROOT, write_yaml

STUDIES_DIR = ROOT / "docs" / "studies"  # the one-off experiment specs behind the notes pages, run by path

OK = {"name": "s", "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits"}},
      "parameters": {"schedule": {"grid": [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8}]}}}


def test_presets_are_valid():
    """Every preset of search_spaces/ and every one-off spec of docs/studies/ loads; no two share a name (the
    MLflow experiment a sweep logs to)."""
    names = []
    from engine.config.experiment import read_yaml
    from search_spaces.ablation import load_ablation

    studies = sorted(STUDIES_DIR.glob("*.yaml"))
    assert studies, STUDIES_DIR
    for path in sorted(PRESETS_DIR.glob("*.yaml")) + studies:
        loaded = load_ablation(path) if "ablation" in read_yaml(path) else load_spec(path)
        assert loaded.num_trials() >= 1
        names.append(loaded.name)
    assert len(names) == len(set(names))
    assert {"demo", "baselines", "pfq_sensitivity", "cifar10_resnet38_pfq_sensitivity"} <= set(names)
    assert {"study_fmnist", "study_fmnist_long", "study_fmnist_deep"} <= {p.stem for p in PRESETS_DIR.glob("*.yaml")}
    assert load_spec(PRESETS_DIR / "demo.yaml").num_trials() >= 6


def test_counts_trials():
    loaded = parse_spec({**OK, "seeds": [0, 1, 2]})
    assert loaded.num_trials() == 6 and loaded.grid_size() == 2


def test_several_errors_are_reported_at_once():
    bad = {
        "name": "bad name/../x",
        "base": {"model": {"name": "tiny"}},
        "parameters": {"optim.lr": {"uniform": [0.5, 0.1]}, "schedule.fw": {"grid": [4], "choice": [8]}},
        "search": {"algorithm": "bayes"},
        "resources": {"cpu": -1},
    }
    with pytest.raises(ConfigError) as info:
        parse_spec(bad)
    text = "\n".join(info.value.lines())
    assert "name: got 'bad name/../x'" in text
    assert "parameters.optim.lr: " in text and "low < high" in text
    assert "parameters.schedule.fw: " in text and "exactly one of" in text
    assert "search.algorithm: got 'bayes'; allowed: 'grid', 'random' or 'optuna'" in text
    assert "resources.cpu: got -1" in text
    assert len(info.value.lines()) == 5  # parameters are malformed, so no point is checked


def test_the_longest_sweep_name_leaves_room_for_its_ids_stamp():
    """A trial's experiment is named by its sweep's id, the name plus ``-YYYYMMDD-HHMMSS`` (and ``-NN`` for a
    second sweep in the same second): a name too long for that is refused before any trial, not by each."""
    from engine.config.experiment import parse_config
    from search_spaces import trial

    longest = parse_spec({**OK, "name": "s" * 81})
    sweep_id = f"{longest.spec.name}-20261201-231230-99"
    assert trial.decode(trial.encode(sweep_id, longest.base_tree, {}, 0)).name == sweep_id
    with pytest.raises(ConfigError, match=r"^name: got 's{82}'; allowed: .* at most 81 characters"):
        parse_spec({**OK, "name": "s" * 82})
    parse_config({"name": "s" * 100})  # an experiment's own name may take the whole 100


def test_every_grid_point_and_range_end_is_checked():
    bad = {**OK, "parameters": {"schedule": {"grid": [{"kind": "static", "fw": 40, "bw": 8}, {"kind": "fp33"}]},
                                "optim.lr": {"grid": [0.1, -3.0]}, "data.batch_size": {"grid": [0]}}}
    with pytest.raises(ConfigError) as info:
        parse_spec(bad)
    text = "\n".join(info.value.lines())
    assert "schedule[0]" in text and "schedule.fw: got 40; allowed: an integer 1..32" in text
    assert "schedule[1]" in text and "schedule.kind: got 'fp33'" in text
    assert "optim.lr: got -3.0" in text and "data.batch_size: got 0" in text
    rnd = {**OK, "parameters": {"schedule.fw": {"int": [1, 40]}}, "base": {**OK["base"], "schedule": {"kind": "static"}},
           "search": {"algorithm": "random", "num_samples": 4}}
    with pytest.raises(ConfigError, match=r"parameters.schedule.fw.int\[1\]: schedule.fw: got 40"):
        parse_spec(rnd)


def test_search_algorithm_rules():
    with pytest.raises(ConfigError, match="optuna cannot search a grid"):
        parse_spec({**OK, "search": {"algorithm": "optuna"}})
    with pytest.raises(ConfigError, match="only grid parameters"):
        parse_spec({**OK, "parameters": {"optim.lr": {"uniform": [0.01, 0.1]}}})
    with pytest.raises(ConfigError, match="give one seed"):
        parse_spec({**OK, "seeds": [0, 1], "parameters": {"optim.lr": {"loguniform": [0.01, 0.1]}},
                    "search": {"algorithm": "optuna"}})


def test_base_from_a_file_and_set(tmp_path):
    write_yaml(tmp_path / "exp.yaml", "model: {name: tiny}\ndata: {dataset: digits}\n")
    spec = write_yaml(tmp_path / "s.yaml", "name: s\nbase: exp.yaml\nset: {optim.epochs: 2}\n"
                      "parameters: {schedule.kind: {grid: [fp32]}}\n")
    loaded = load_spec(spec)
    assert loaded.base_tree["optim"]["epochs"] == 2 and loaded.base_tree["model"]["name"] == "tiny"
    missing = write_yaml(tmp_path / "m.yaml", "name: s\nbase: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="base: got 'nowhere.yaml'"):
        load_spec(missing)


def test_validate_cli_exit_codes(tmp_path, capsys):
    from tests.conftest import run_main

    code, _, good = run_main("validate", str(PRESETS_DIR / "demo.yaml"), "--json")
    assert code == 0 and good["valid"] is True and good["trials"] == 7
    bad = write_yaml(tmp_path / "bad.yaml", "name: x\nparameters: {schedule.fw: {grid: [40]}}\n"
                     "base: {schedule: {kind: static}}\nresources: {gpu: -1}\n")
    capsys.readouterr()
    code = run_main("validate", str(bad))[0]
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2  # the spec's own field and the grid point, reported together
    assert "resources.gpu: got -1" in lines[0] and "schedule.fw: got 40" in lines[1]


def test_a_trial_dict_decodes_to_the_config_of_its_point():
    from results.store import flatten
    from search_spaces import trial

    loaded = parse_spec({**OK, "set": {"optim.epochs": 2}})
    base = copy.deepcopy(loaded.base_tree)
    point = {"schedule": {"kind": "static", "fw": 4, "bw": 8}, "optim.lr": 0.05}
    t = trial.encode("s-20261123-101500", loaded.base_tree, point, 3)
    cfg = trial.decode(t)
    assert (cfg.schedule.fw, cfg.schedule.bw, cfg.optim.lr, cfg.optim.epochs, cfg.seed) == (4, 8, 0.05, 2, 3)
    assert cfg.name == "s-20261123-101500" and loaded.base_tree == base  # the base is never changed
    assert trial.swept_values(t) == point and trial.decode(loaded.base_trial()).schedule.kind == "fp32"
    assert loaded.point_tree(point, 3) == {**trial.resolved_tree(t), "name": "s"}
    # the point as MLflow keeps it: the JSON tag, else rebuilt typed from the flattened params
    assert trial.point_of(trial.point_tag(point), {}, []) == point
    params = flatten(cfg.to_dict())
    assert trial.point_of("", params, ["schedule", "optim.lr"]) == {
        "schedule": {"kind": "static", "fw": 4, "bw": 8, "weight_bits": None}, "optim.lr": 0.05}
    assert trial.point_tag({"schedule.options": ["4/8"] * 2000}) == ""  # too long for a tag: params instead


def test_run_names_say_what_the_trial_is_and_stay_unique():
    """A trial named with every swept value (``naming.every_value``: a tracker pickled before it knew the
    sweep's variation) reads as its method and values."""
    from search_spaces import naming

    def name(point: dict, seed: int = 0, kind: str | None = None) -> str:
        kind = (point.get("schedule") or {}).get("kind", kind)
        return naming.run_name(point, seed, naming.every_value(point), kind)

    assert name({"schedule": {"kind": "static", "fw": 6, "bw": 8}}, 1) == "static fw6/bw8 s1"
    assert name({"schedule.epsilon": 0.1, "schedule.alpha": 0.5}, kind="pfq") == "pfq eps0.1 a0.5 s0"
    assert name({"schedule": {"kind": "dfq", "options": "paper", "target_cp": 3.0, "execution": "routed"}}) == \
        "dfq paper cp3 routed s0"
    assert name({"schedule": {"kind": "fractrain", "cp0": 1.5, "cp_step": 0.5}}) == "fractrain cp0=1.5+0.5 s0"
    assert name({"schedule.fw_min": 3, "schedule.fw_max": 8, "optim.lr": 0.012345}, kind="cpt") == \
        "cpt fw3-8 lr0.0123 s0"
    assert name({"schedule": {"kind": "fp32"}}, 2) == "fp32 s2"
    # FW4/BW8 and FW6/BW8 differ by name; a repeated point (random search) gets a suffix
    taken = {"static fw6/bw8 s1", "static fw6/bw8 s1 #2"}
    assert naming.unique_name("static fw6/bw8 s1", taken) == "static fw6/bw8 s1 #3"
    assert naming.unique_name("static fw4/bw8 s1", taken) == "static fw4/bw8 s1"


def test_objective_is_any_cost_model(tmp_path):
    from search_spaces.spec import parse_spec

    spec = {"name": "obj", "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits"}}}
    assert parse_spec(spec).spec.objective == "bitops"
    assert parse_spec({**spec, "objective": "energy"}).spec.objective == "energy"
    with pytest.raises(ConfigError, match="objective: got 'joules'; allowed: bitops, macs, int_units, energy"):
        parse_spec({**spec, "objective": "joules"})
    table = tmp_path / "acc.yaml"
    table.write_text("name: acc\nfp32: 4\ncosts: {'8x8': 0.3}\n")
    with_table = {**spec, "set": {"cost.table": str(table)}}
    assert parse_spec({**with_table, "objective": "table:acc"}).spec.objective == "table:acc"
    with pytest.raises(ConfigError, match=r"objective: got 'table:other'.*\(table:acc\)"):
        parse_spec({**with_table, "objective": "table:other"})
    with pytest.raises(ConfigError, match=r"--objective: got 'table:x'.*none set"):
        parse_spec(spec).with_objective("table:x")
    assert parse_spec(spec).with_objective("int_units").spec.objective == "int_units"


def test_a_paired_test_names_grid_points_of_its_sweep():
    """Each side of a pair picks at least one grid point, and the twin other points than the arm: a misspelt path
    or value is refused naming the pair, instead of pairing nothing."""
    static = {"kind": "static", "fw": 4, "bw": 8, "weight_bits": 4}
    spec = {**OK, "parameters": {"schedule": {"grid": [static, {**static, "fw": 6}]}},
            "paired": {"claim": "c", "pairs": [{"arm": {"schedule.fw": 6}, "twin": {"schedule.fw": 4}}]}}
    assert parse_spec(spec).spec.paired.pairs[0].twin == {"schedule.fw": 4}
    bad = copy.deepcopy(spec)
    bad["paired"]["pairs"] = [{"arm": {"schedule.fw": 5}, "twin": {"schedule.fww": 4}},
                              {"arm": {"schedule.kind": "static"}, "twin": {"schedule.bw": 8}}]
    with pytest.raises(ConfigError) as err:
        parse_spec(bad)
    fields = [f for f, _, _ in err.value.problems]
    assert fields == ["paired.pairs.0.arm", "paired.pairs.0.twin", "paired.pairs.1.twin"]
    assert "pick at least one grid point" in err.value.problems[0][2]
    with pytest.raises(ConfigError, match=r"paired.pairs.0.arm.*dotted config paths, e\.g\. schedule\.kind \(not "
                                          r"'schedule fw'\)$"):
        parse_spec({**spec, "paired": {"claim": "c", "pairs": [{"arm": {"schedule fw": 6}, "twin": {"x": 1}}]}})


def test_a_stage_may_run_on_its_own_seeds_unless_stages_chain():
    grid = {"schedule": {"grid": [{"kind": "fp32"}]}}
    spec = {"name": "s", "base": OK["base"], "seeds": [0, 1, 2],
            "stages": [{"name": "a", "parameters": grid}, {"name": "b", "parameters": grid, "seeds": [0]}]}
    loaded = parse_spec(spec)
    assert [st.spec.seeds for st in loaded.stages] == [[0, 1, 2], [0]] and loaded.num_trials() == 4
    chained = copy.deepcopy(spec)
    chained["stages"][1]["init_from"] = "a"
    with pytest.raises(ConfigError, match=r"stages\[1\].seeds: got \[0\]; allowed: unset in a stage that starts"):
        parse_spec(chained)


@pytest.mark.slow
def test_the_fair_study_gives_each_dfq_arm_its_static_twins_whole_model_cost():
    """study_fmnist_fair's DFQ targets are its static twins' whole-model cp (to 1e-4 pp), from the BitOPs counter
    on the same layer map, and its pairs join each DFQ arm with that twin."""
    import torch

    from engine.config.experiment import parse_config
    from engine.data.catalog import INFO
    from engine.train import prepare
    from search_spaces.schema import picks

    loaded = load_spec(PRESETS_DIR / "study_fmnist_fair.yaml")
    trees = [parse_config(st.point_tree({"schedule": s}, 0)) for st in loaded.stages
             for s in st.spec.parameters["schedule"].grid]
    cp = {}
    for cfg in trees:
        if cfg.schedule.kind == "static":
            net, counter = prepare(cfg, INFO["fashion-mnist"], torch.device("cpu"))
            cp[cfg.schedule.fw, cfg.schedule.bw] = 100 * counter.per_sample(cfg.schedule.precision()) / \
                counter.fp32_per_sample()
    for pair in loaded.spec.paired.pairs:
        arm = [c for c in trees if picks(pair.arm, c.to_dict())]
        twin = [c for c in trees if picks(pair.twin, c.to_dict())]
        assert len(twin) == 1 and arm and all(c.schedule.cost_basis == "model" for c in arm)
        for c in arm:
            assert c.schedule.target_cp == pytest.approx(cp[twin[0].schedule.fw, twin[0].schedule.bw], abs=1e-4)
            assert c.layer_map(True) == twin[0].layer_map(True)
