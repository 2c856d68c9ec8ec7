"""Configs: YAML loading, overrides, and errors that name the field, the value and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.config.experiment import ExperimentConfig, load_config, parse_config
from engine.errors import ConfigError
from tests.conftest import ROOT, write_yaml


def test_examples_load():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        cfg = load_config(path)
        assert isinstance(cfg, ExperimentConfig)


def test_defaults_and_overrides(tmp_path):
    p = write_yaml(tmp_path / "c.yaml", "schedule: {kind: static, fw: 6, bw: 8}\n")
    cfg = load_config(p, ["schedule.fw=4", "optim.epochs=3", "optim.milestones=[0.3, 0.6]"])
    assert cfg.schedule.fw == 4 and cfg.schedule.bw == 8 and cfg.optim.epochs == 3
    assert cfg.optim.milestones == (0.3, 0.6)
    assert cfg.model.name == "resnet20" and cfg.data.dataset == "fashion-mnist"
    with pytest.raises(ValidationError):  # frozen
        cfg.seed = 3


def test_relative_data_dir_is_made_absolute():
    cfg = parse_config({"data": {"data_dir": "some/rel"}})
    assert cfg.data.data_dir.startswith("/")


def _problems(tree):
    with pytest.raises(ConfigError) as info:
        parse_config(tree)
    return info.value.lines()


def test_a_path_no_file_name_can_hold_is_refused_in_one_line_naming_its_field(tmp_path):
    """An unpaired surrogate (YAML's "\\ud800" escape) in any path field or path flag: the field, what is allowed."""
    from engine.config.sections import check_path

    for tree, field in (({"data": {"data_dir": "d\ud800"}}, "data.data_dir"),
                        ({"init": {"checkpoint": "\ud800"}}, "init.checkpoint"),
                        ({"cost": {"table": "t\udfff.yaml"}}, "cost.table")):
        with pytest.raises(ConfigError) as err:
            parse_config(tree)
        (line,) = err.value.lines()
        assert line.startswith(f"{field}: got ") and "allowed: a path without an unpaired surrogate" in line, line
    with pytest.raises(ConfigError, match="--data-dir: got .*allowed: a path without an unpaired surrogate"):
        check_path("--data-dir", "x\ud800")
    assert check_path("--data-dir", str(tmp_path)) == str(tmp_path)
    for tree, field in (({"data": {"data_dir": ""}}, "data.data_dir"), ({"cost": {"table": " "}}, "cost.table")):
        with pytest.raises(ConfigError) as err:  # an empty path would be the working folder
            parse_config(tree)
        (line,) = err.value.lines()
        assert line.startswith(f"{field}: got ") and line.endswith("allowed: a path, not empty text"), line


def test_unknown_key_names_allowed_keys():
    (line,) = _problems({"optim": {"epochz": 3}})
    assert line.startswith("optim.epochz: got a number (not shown); unknown key; allowed keys:") and "epochs" in line


def test_bits_out_of_range():
    (line,) = _problems({"schedule": {"kind": "static", "fw": 40}})
    assert line == "schedule.fw: got 40; allowed: an integer 1..32"
    (line,) = _problems({"schedule": {"kind": "static", "bw": 0}})
    assert line == "schedule.bw: got 0; allowed: an integer 1..32"


def test_wrong_types_unknown_model_dataset_kind():
    lines = _problems({"model": {"name": "vgg"}, "data": {"dataset": "mnist", "batch_size": "big"},
                       "optim": {"lr": -1}, "schedule": {"kind": "magic"}})
    text = "\n".join(lines)
    assert "model.name: got 'vgg'; allowed: " in text and "resnet38" in text
    assert "data.dataset: got 'mnist'; allowed: 'fashion-mnist', 'digits'" in text
    assert "data.batch_size: got 'big'" in text
    assert "optim.lr: got -1; allowed: > 0.0 and <= 100.0" in text
    assert "schedule.kind: got 'magic'; allowed: 'fp32', 'static'" in text
    assert len(lines) == 5


def test_malformed_yaml_and_missing_file(tmp_path):
    p = write_yaml(tmp_path / "bad.yaml", "model: {name: resnet20\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="expected an existing YAML file"):
        load_config(tmp_path / "missing.yaml")
    p = write_yaml(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)


def test_bad_override_syntax(tmp_path):
    p = write_yaml(tmp_path / "c.yaml", "{}\n")
    with pytest.raises(ConfigError, match="--set"):
        load_config(p, ["no_equals_sign"])
    with pytest.raises(ConfigError, match="seed: got {'x': 1}; allowed: a whole number"):
        load_config(p, ["seed.x=1"])


def test_name_pattern_blocks_path_tricks():
    (line,) = _problems({"name": "../../etc"})
    assert line.startswith("name: got '../../etc'")


def test_engine_compile_takes_its_modes_and_refuses_gated_kinds():
    assert parse_config({}).engine.compile == "off"
    for mode in ("off", "default", "reduce-overhead"):
        for kind in ("fp32", "static", "pfq", "cpt"):
            assert parse_config({"engine": {"compile": mode}, "schedule": {"kind": kind}}).engine.compile == mode
    with pytest.raises(ConfigError, match=r"engine.compile: got 'fast'; allowed: 'off', 'default' or 'reduce-overhead'"):
        parse_config({"engine": {"compile": "fast"}})
    for kind in ("dfq", "fractrain"):
        with pytest.raises(ConfigError, match=rf"compile default with schedule kind {kind}; allowed: off for dfq"):
            parse_config({"engine": {"compile": "default"}, "schedule": {"kind": kind}})
        assert parse_config({"engine": {"compile": "off"}, "schedule": {"kind": kind}}).engine.compile == "off"


def test_each_schedule_kind_names_itself_and_says_whether_it_is_gated():
    from engine.config.experiment import GATED_KINDS, SCHEDULE_CONFIGS

    labels = {}
    for cls in SCHEDULE_CONFIGS:
        kind = cls.model_fields["kind"].default
        cfg = parse_config({"schedule": {"kind": kind}})
        assert cfg.schedule.gated == (kind in ("dfq", "fractrain")) == cfg.gated
        labels[kind] = cfg.schedule.label()
    assert labels == {"fp32": "FP32", "static": "FW8/BW8", "pfq": "PFQ auto FW3-4-6-8/BW6-6-8-8",
                      "cpt": "CPT FW3->8/BW8", "dfq": "DFQ cp 3% masked",
                      "fractrain": "FracTrain cp 1.5+0.5 masked"}
    assert GATED_KINDS == ("dfq", "fractrain")
    routed = parse_config({"schedule": {"kind": "dfq", "execution": "routed", "block_floor": 0.5,
                                        "routed_sample_fraction": 1.0}})
    assert routed.schedule.label() == "DFQ cp 3% routed (sampled, whole batch) floor 0.5"


@pytest.mark.parametrize("tree, field", [
    ({"data": {"batch_size": True}}, "data.batch_size"),
    ({"optim": {"lr": False}}, "optim.lr"),
    ({"seed": "7"}, "seed"),
    ({"optim": {"epochs": 3.0}}, "optim.epochs"),
    ({"data": {"augment": 1}}, "data.augment"),
    ({"optim": {"betas": [0.9, True]}}, "optim.betas.1"),
    ({"schedule": {"kind": "pfq", "fw": [3, 4], "bw": [6, "8"]}}, "schedule.bw.1"),
])
def test_values_are_taken_as_written_not_coerced(tree, field):
    """Strict types: true is no batch size, "7" no seed, 1 no switch (lax validation ran them as 1, 7, true)."""
    with pytest.raises(ConfigError, match=rf"^{field}: got .*; allowed: "):
        parse_config(tree)


def test_numpy_scalars_from_a_search_algorithm_are_taken_as_the_numbers_they_hold():
    np = pytest.importorskip("numpy")
    cfg = parse_config({"seed": np.int64(3), "data": {"batch_size": np.int64(32)},
                        "optim": {"lr": np.float32(0.5), "betas": [np.float64(0.8), 0.9]},
                        "schedule": {"kind": "pfq", "fw": [np.int64(3), 4], "bw": [6, 8]}})
    assert (cfg.seed, cfg.data.batch_size, cfg.optim.lr, cfg.optim.betas) == (3, 32, 0.5, (0.8, 0.9))
    assert cfg.schedule.fw == [3, 4] and type(cfg.seed) is int and type(cfg.schedule.fw[0]) is int


def test_dfq_options_are_named_one_way_and_each_once():
    cfg = parse_config({"schedule": {"kind": "dfq", "options": ["SKIP", " 4/8", "06/12"], "target_cp": 3.0}})
    assert cfg.schedule.options == ["skip", "4/8", "6/12"]  # what the logs and the allocations name
    for twice in (["skip", "Skip", "4/8"], ["4/8", "04/8"], ["4/8", " 4/8 "]):
        with pytest.raises(ConfigError, match=r"^schedule\.options: .*distinct options \(.* given more than once"):
            parse_config({"schedule": {"kind": "dfq", "options": twice, "target_cp": 3.0}})
    with pytest.raises(ConfigError, match=r"option '٨/8'"):
        parse_config({"schedule": {"kind": "dfq", "options": ["٨/8", "4/8"], "target_cp": 3.0}})


def test_a_value_no_member_of_a_union_takes_is_one_problem():
    with pytest.raises(ConfigError) as err:
        parse_config({"schedule": {"kind": "cpt", "fw_min": "three"}})
    assert err.value.problems == [("schedule.fw_min", "three", "allowed: an integer 1..32; or 'auto'")]
    with pytest.raises(ConfigError) as err:
        parse_config({"schedule": {"kind": "dfq", "options": ["4/8", 8]}})
    assert [f for f, _, _ in err.value.problems] == ["schedule.options.1"]  # the list member's, not the preset's


def test_a_missing_key_is_named_without_echoing_the_section_around_it():
    from search_spaces.spec import parse_spec

    with pytest.raises(ConfigError) as err:
        parse_spec({"base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}}})
    assert err.value.lines() == ["name: got nothing; required"]


def test_a_schedule_without_its_kind_names_the_kinds():
    with pytest.raises(ConfigError) as err:
        parse_config({"schedule": {"fw": 4}})
    assert err.value.lines() == ["schedule.kind: got nothing; allowed: 'fp32', 'static', 'pfq', 'cpt', 'dfq', "
                                 "'fractrain'"]


def test_the_gates_sizes_default_to_the_references_for_the_model():
    """methods.md §6.1: the reference's CIFAR ResNet gate (32/16/16) for every model but MobileNetV2, whose
    reference gate is 64/32/32; a size set in the config wins, the others keep the model's."""
    def sizes(model: str, **schedule) -> tuple[int, int, int]:
        cfg = parse_config({"model": {"name": model}, "data": {"dataset": "cifar10"},
                            "schedule": {"kind": "dfq", **schedule}})
        return cfg.schedule.gate_sizes(cfg.model.name)

    assert sizes("resnet38") == (32, 16, 16) and sizes("resnet18") == (32, 16, 16)
    assert sizes("mobilenetv2") == (64, 32, 32)
    assert sizes("mobilenetv2", embed_dim=40) == (64, 40, 32)


def test_a_wrong_type_for_a_setting_that_takes_null_says_so():
    """An optional setting (null: the reference's choice) names null among what it takes; a plain one does not."""
    base = {"model": {"name": "resnet18"}, "data": {"dataset": "cifar10"}}
    with pytest.raises(ConfigError) as optional:
        parse_config({**base, "quant": {"quantize_shortcut": "yes"}})
    assert str(optional.value).endswith("quant.quantize_shortcut: got 'yes'; allowed: true or false, or null "
                                        "(the default)")
    with pytest.raises(ConfigError) as plain:
        parse_config({**base, "quant": {"quantize_fc": "yes"}})
    assert str(plain.value).endswith("quant.quantize_fc: got 'yes'; allowed: true or false")
