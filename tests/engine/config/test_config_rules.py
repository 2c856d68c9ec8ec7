"""Each configuration rule lives in one place (architecture rule 4): every entry point that can take a setting
(a config file, a sweep spec's point, a CPT schedule built directly, ``fractune cost``'s flags) is refused by the same rule, with the same ``(field, value, allowed)``; and the rules' code is not copied
back into the modules that used to re-implement them."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from engine.config.experiment import parse_config
from engine.config.gated_schedule import GatedSettings
from engine.dfq import gated
from engine.errors import ConfigError
from engine.models import build_model
from engine.numerics.precision import SKIP, Precision
from engine.run_length import RunLength
from engine.schedules.curves import CPT
from search_spaces.spec import parse_spec
from tests.conftest import ROOT, run_main

DIGITS = {"model": {"name": "tiny"}, "data": {"dataset": "digits"}, "optim": {"iterations": 20}}


def config_problems(tree: dict) -> list[tuple]:
    with pytest.raises(ConfigError) as info:
        parse_config(tree)
    return info.value.problems


def spec_problems(base: dict, **spec) -> list[tuple]:
    with pytest.raises(ConfigError) as info:
        parse_spec({"name": "rules", "base": base, **spec})
    return info.value.problems


# the gate's settings: (config field, value, the execution). GatedSettings is their one rule; GatedModel,
# below engine.config, holds a model built directly to the same choices (see the last tests)
GATED = [
    ("block_floor", 1.0, "routed"),
    ("routed_estimator", "every", "routed"),
    ("routed_statistics", "half", "routed"),
    ("option_state", "per_option", "routed"),
    ("option_state", "per_block", "masked"),
    ("routed_sample_fraction", 0.0, "routed"),
    ("gate_dim", 0, "masked"),
]


@pytest.mark.parametrize(("field", "value", "execution"), GATED)
def test_a_gate_setting_is_refused_alike_by_a_config_and_a_sweep_point(field, value, execution):
    tree = {**DIGITS, "schedule": {"kind": "dfq", "execution": execution, field: value}}
    from_config = config_problems(tree)
    assert [p[0] for p in from_config] == [f"schedule.{field}"]
    assert spec_problems(tree) == [(f"base: {f}", v, a) for f, v, a in from_config]


CONV = {"kind": "dfq", "execution": "conv", "options": ["3/6", "4/8"], "target_cp": 2.0}


@pytest.mark.parametrize(("tree", "field", "value", "allowed"), [
    ({**DIGITS, "schedule": {**CONV, "options": "paper"}}, "schedule.options", "paper", "options without skip"),
    ({**DIGITS, "schedule": {**CONV, "options": ["skip", "3/6"], "target_cp": 1.0}}, "schedule.options",
     ["skip", "3/6"], "options without skip"),
    ({**DIGITS, "schedule": {**CONV, "gate_dim": 8}}, "schedule.gate_dim", 8, "null with schedule.execution conv"),
    ({"model": {"name": "transformer_tiny"}, "data": {"dataset": "fortunes"}, "optim": {"iterations": 20},
      "schedule": CONV}, "schedule.execution", "conv", "masked or routed with a language model"),
], ids=["preset-with-skip", "list-with-skip", "gate-dim", "language-model"])
def test_execution_conv_is_refused_where_it_cannot_run(tree, field, value, allowed):
    """Execution conv (FracTrain's ImageNet design): every sample computes every block, the convs of an image
    network's blocks mix their inputs, its gate embeds with one layer. A config and a sweep point alike."""
    from_config = config_problems(tree)
    assert [(f, v) for f, v, _ in from_config] == [(field, value)] and allowed in from_config[0][2]
    assert spec_problems(tree) == [(f"base: {f}", v, a) for f, v, a in from_config]
    with pytest.raises(ValueError, match="no skip option"):
        gated.GatedModel(build_model("tiny", 1, 10), [SKIP, Precision(act=3, weight=4, grad=6)], "conv")


def test_execution_conv_takes_the_reference_imagenet_gate_and_shared_statistics():
    cfg = parse_config({**DIGITS, "schedule": CONV})
    assert cfg.schedule.gate_sizes("tiny") == (None, 40, 20) and cfg.schedule.option_state == "shared"
    assert cfg.schedule.execution_label() == "conv"


def test_cpt_cycles_are_refused_alike_by_a_config_and_a_schedule_built_directly():
    from engine.config.schedule import CPTSchedule

    from_config = config_problems({**DIGITS, "schedule": {"kind": "cpt", "num_cycles": 32}})
    assert from_config == [("schedule.num_cycles", 32, "allowed: <= the run's 20 iterations (a cycle needs at "
                                                        "least one iteration)")]
    with pytest.raises(ConfigError) as info:
        CPT(CPTSchedule(num_cycles=32), RunLength(20, 10))
    assert info.value.problems == from_config


def test_bit_widths_model_names_and_seeds_are_one_rule_each():
    (_, _, bits), = config_problems({"schedule": {"kind": "static", "fw": 40}})
    with pytest.raises(ConfigError) as info:
        Precision(act=40)
    assert info.value.problems == [("precision.act", 40, bits)]

    from_config = config_problems({"model": {"name": "nosuch"}})
    with pytest.raises(ConfigError) as info:
        build_model("nosuch", 1, 10)
    assert info.value.problems == from_config

    (_, _, seed_allowed), = config_problems({"seed": 2**31})
    assert spec_problems(DIGITS, seeds=[0, 2**31]) == [("seeds.1", 2**31, seed_allowed)]


def test_a_spec_objective_and_an_objective_flag_share_one_rule():
    from engine.cost.cost_models import check_model_name

    for bad in ("nosuch", "table:"):
        with pytest.raises(ConfigError) as info:
            check_model_name(bad)
        assert spec_problems(DIGITS, objective=bad) == info.value.problems


def test_fractune_cost_flags_are_checked_by_the_config_rules(capsys):
    code, _, _ = run_main("cost", "--model", "transformer_tiny", "--dataset", "digits", "--precision", "8/8")
    (_, _, allowed), = config_problems({"model": {"name": "transformer_tiny"}, "data": {"dataset": "digits"}})
    assert code == 2 and allowed.replace("data.dataset", "--dataset") in capsys.readouterr().err
    code, _, _ = run_main("cost", "--model", "tiny", "--dataset", "digits", "--precision", "8/8", "--seq-len", "0")
    (_, _, allowed), = config_problems({"data": {"seq_len": 0}})
    assert code == 2 and f"--seq-len: got 0; {allowed}" in capsys.readouterr().err


# a rule's code, and the one file allowed to hold it: a copy elsewhere is a second place the rule lives
ONE_PLACE = [
    (r"MIN_BITS\s*<=", "engine/numerics/precision.py"),
    (r"\bin MODELS\b", "engine/models/__init__.py"),
    (r"num_cycles\s*>", "engine/schedules/curves.py"),
    (r"2\s*\*\*\s*31\s*-\s*1", "engine/config/types.py"),
    (r"execution\s*!=\s*\"masked\"", "engine/config/gated_schedule.py"),
    (r"\bis_text\b\s*[!=]=|[!=]=\s*\w*is_text\b", "engine/config/experiment.py"),
    (r"MODEL_NAMES\s+and|not in MODEL_NAMES|not in allowed and", "engine/cost/cost_models.py"),
]
CHECKED = ("engine", "search_spaces", "orchestrator")


@pytest.mark.parametrize(("pattern", "home"), ONE_PLACE)
def test_each_rule_is_written_in_one_place(pattern, home):
    skip = {"engine/numerics/gpu_kernels.py"}  # SEED_HIGH: the kernels' RNG seed range, not a config rule
    holders = sorted(str(p.relative_to(ROOT)) for pkg in CHECKED for p in (ROOT / pkg).rglob("*.py")
                     if str(p.relative_to(ROOT)) not in skip and re.search(pattern, Path(p).read_text()))
    assert holders == [home]


def test_the_gated_model_writes_no_rule_message_of_its_own():
    """GatedModel's settings are refused with (field, value, allowed) by engine.config.gated_schedule's GatedSettings at
    the boundary, never by a copy of its rules in engine/dfq; the choices themselves are defined once, in dfq."""
    for path in sorted((ROOT / "engine" / "dfq").glob("*.py")):
        texts = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                 and isinstance(n.value, str)]
        assert not [t for t in texts if "allowed: " in t], path
    fields = GatedSettings.model_fields
    for field, choices in (("execution", gated.EXECUTIONS), ("routed_estimator", gated.ROUTED_ESTIMATORS),
                           ("routed_statistics", gated.ROUTED_STATISTICS), ("option_state", gated.OPTION_STATES)):
        assert set(choices) == {c for arg in typing.get_args(fields[field].annotation)
                                for c in (typing.get_args(arg) or [arg]) if c is not type(None)}


def test_a_gated_model_built_directly_refuses_a_misspelt_choice():
    backbone = build_model("resnet8", 1, 10)
    with pytest.raises(ValueError, match="routed_estimator 'sample' is not one of skip, sampled, grouped, exact"):
        gated.GatedModel(backbone, [SKIP, Precision.fwbw(4, 8)], execution="routed", routed_estimator="sample")
