"""Hostile and bad input: every file of tests/data/bad gives exit code 2 and one line naming the field;
spec and config parsing raise nothing but the project's own error type, whatever the input."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.errors import FractuneError
from orchestrator.cli import main
from search_spaces.ablation import parse_ablation
from search_spaces.spec import parse_spec
from tests.conftest import ROOT

BAD = sorted((ROOT / "tests" / "data" / "bad").glob("*.yaml"))


def test_the_corpus_is_large_enough():
    assert len(BAD) >= 30


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_file_exits_2_with_one_line_naming_the_field(path, capsys):
    expected = re.match(r"# expect: (\S+)", path.read_text()).group(1)
    code = main(["validate", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    assert f"{expected}:" in err[0] or f" {expected} " in err[0] or err[0].split("error: ")[-1].startswith(expected), err[0]


def test_real_process_exit_codes(run_cli):
    for name in ("04_bits_too_high.yaml", "23_malformed_yaml.yaml", "42_spec_invalid_grid_point.yaml"):
        r = run_cli("validate", str(ROOT / "tests" / "data" / "bad" / name))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40), st.floats(allow_nan=True),
                      st.text(max_size=20))
KEYS = st.sampled_from(["name", "base", "set", "parameters", "seeds", "search", "scheduler", "budget", "resources",
                        "model", "data", "optim", "quant", "schedule", "kind", "fw", "bw", "grid", "choice",
                        "uniform", "int", "loguniform", "algorithm", "cpu", "gpu", "schedule.fw", "optim.lr",
                        "epochs", "dataset", "target_cp", "options", "x", "ablation", "mode", "factors",
                        "baseline", "importance", "verdict", "ofat"])
tree = st.recursive(json_leaf, lambda children: st.one_of(st.lists(children, max_size=4),
                                                          st.dictionaries(KEYS, children, max_size=5)),
                    max_leaves=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, tree, max_size=6))
def test_fuzz_spec_parsing_raises_only_fractune_errors(doc):
    try:
        parse_spec(doc)
    except FractuneError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, tree, max_size=6), st.dictionaries(KEYS, tree, max_size=4))
def test_fuzz_ablation_parsing_raises_only_fractune_errors(doc, section):
    try:
        parse_ablation({**doc, "ablation": section})
    except FractuneError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, tree, max_size=6))
def test_fuzz_config_parsing_raises_only_fractune_errors(doc):
    try:
        parse_config(doc)
    except FractuneError:
        pass
