"""Hostile and bad input, every subcommand: each case of tests/data/bad gives exit code 2 and one line per
problem naming the field, no traceback, no secret, and nothing created or changed in the folder it runs in
(its listing and the MLflow store it holds are compared before and after). Spec, config and YAML parsing raise
nothing but the project's own error type, whatever the input, within a time and memory bound.

A case file starts with header comments: ``# expect: FIELD`` (the field the line must name), optionally
``# argv: COMMAND ARGS`` (default ``validate {file}``; ``{file}`` is the case file, ``{bad}`` this folder),
``# lines: N`` (problems reported, default 1) and ``# secret: TEXT`` (must appear in no output). Cases run in a
fresh folder holding ``adir/``, ``afile``, ``history.jsonl``, a FIFO named ``FIFO`` and an MLflow store
``mlflow.db`` (the default tracking URI)."""

from __future__ import annotations

import errno
import os
import re
import shlex
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.config.experiment import parse_config
from engine.errors import FractuneError
from orchestrator.cli.main import main
from search_spaces.ablation import parse_ablation
from search_spaces.spec import parse_spec
from tests.conftest import ROOT, copy_store, snapshot

BAD_DIR = ROOT / "tests" / "data" / "bad"
BAD = sorted(BAD_DIR.glob("*.yaml"))


def header(path) -> dict[str, str]:
    out = {}
    for line in path.read_bytes().decode(errors="replace").splitlines():
        m = re.match(r"# (expect|argv|lines|secret): (.*)$", line)
        if not m:
            break
        out[m.group(1)] = m.group(2).strip()
    return out


def argv_of(path) -> list[str]:
    h = header(path)
    text = h.get("argv", "validate {file}")
    return [a.replace("{file}", str(path)).replace("{bad}", str(BAD_DIR)) for a in shlex.split(text)]


@pytest.fixture
def case_dir(tmp_path, store_template, monkeypatch):
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "keep.txt").write_text("keep")
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "history.jsonl").write_text('{"epoch": 1}\n')
    os.mkfifo(tmp_path / "FIFO")
    copy_store(store_template, tmp_path / "mlflow.db")  # an MLflow store with its tables
    for var in ("MLFLOW_TRACKING_URI", "FRACTUNE_STORAGE", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_corpus_is_large_enough_and_covers_every_subcommand():
    assert len(BAD) >= 120
    from orchestrator.cli.parser import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    covered = {argv_of(p)[0] for p in BAD}
    assert commands <= covered, commands - covered


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_input_exits_2_with_one_line_per_problem_and_changes_nothing(path, case_dir, capsys):
    h = header(path)
    before = snapshot(case_dir)
    started = time.perf_counter()
    try:
        code = main(argv_of(path))
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    wall = time.perf_counter() - started
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(err) == int(h.get("lines", 1)), err
    assert not any("Traceback" in line for line in err)
    expected = h["expect"]
    assert any(f"{expected}:" in line or f" {expected} " in line for line in err), err
    if "secret" in h:
        assert h["secret"] not in captured.err + captured.out
    assert snapshot(case_dir) == before, "the case created or changed files"
    assert wall < 30, f"refused after {wall:.0f} s"


@pytest.mark.slow
def test_real_process_exit_codes(run_cli, tmp_path):
    # (every bad file also runs in-process in test_bad_input_exits_2_with_one_line_per_problem_and_changes_nothing)
    r = run_cli("validate", str(BAD_DIR / "42_spec_invalid_grid_point.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # the special files and the credentials as a user would give them, in a real process and folder
    os.mkfifo(tmp_path / "FIFO")
    for args in (["validate", "/dev/zero"], ["train", "FIFO"], ["validate", str(BAD_DIR / "support" / "bomb.yaml")],
                 ["pareto", "x", "--tracking-uri", "http://bob:hunter2pw@127.0.0.1:1"]):
        r = run_cli(*args, cwd=tmp_path, timeout=240, env={"PYTHONPATH": str(ROOT)})  # this checkout, in any folder
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "hunter2pw" not in r.stderr + r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FIFO"]


# what safe_load gives: JSON's values and YAML's own (dates, timestamps, !!binary bytes, !!set sets, mappings whose
# keys are not text)
yaml_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40), st.floats(allow_nan=True),
                      st.text(max_size=20), st.dates(), st.datetimes(), st.binary(max_size=8),
                      st.sets(st.integers(0, 9), max_size=3))
KEYS = st.sampled_from(["name", "base", "set", "parameters", "seeds", "search", "scheduler", "budget", "resources",
                        "model", "data", "optim", "quant", "schedule", "kind", "fw", "bw", "grid", "choice",
                        "uniform", "int", "loguniform", "algorithm", "cpu", "gpu", "schedule.fw", "optim.lr",
                        "epochs", "dataset", "target_cp", "options", "x", "ablation", "mode", "factors",
                        "baseline", "importance", "verdict", "ofat"])
tree = st.recursive(yaml_leaf, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(st.one_of(KEYS, st.integers(0, 3)), children, max_size=5)),
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
@example({"name": None, "parameters": {"name": None, 0: None}}, {})  # mixed keys: no order among them
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


def test_a_refused_path_names_the_argument_it_came_from():
    """An OSError that no check caught is mapped back to the argument whose value the path is or lies under
    (as given, made absolute, or inside a sqlite URI): bad input, exit 2, where a bad path gives that error; a
    full disk under it, or a path of no argument: exit 1."""
    import argparse

    from orchestrator.cli.failures import path_problem
    from orchestrator.cli.parser import build_parser

    sweep = build_parser()._subparsers._group_actions[0].choices["sweep"]
    args = argparse.Namespace(command="sweep", spec="s.yaml", storage="runs", report_dir=None,
                              tracking_uri="sqlite:///db/m.db", overrides=[])
    too_long = os.strerror(errno.ENAMETOOLONG)
    inside = path_problem(sweep, args, OSError(errno.ENAMETOOLONG, too_long, os.path.abspath("runs/sweep-1/x")))
    assert inside.exit_code == 2 and inside.lines()[0].startswith("--storage: got 'runs'; File name too long")
    store = path_problem(sweep, args, OSError(errno.ELOOP, os.strerror(errno.ELOOP), "db/m.db"))
    assert store.exit_code == 2 and store.lines()[0].startswith("--tracking-uri: got 'sqlite:///db/m.db'")
    other = path_problem(sweep, args, OSError(errno.EIO, os.strerror(errno.EIO), "/var/elsewhere"))
    assert other.exit_code == 1 and other.lines() == [f"path '/var/elsewhere': {os.strerror(errno.EIO)}"]
    full = path_problem(sweep, args, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.abspath("runs/x")))
    assert full.exit_code == 1 and full.lines()[0].startswith("--storage 'runs': path ")  # the machine's, not input
    pipe = path_problem(sweep, args, BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)))
    assert pipe.exit_code == 1 and pipe.lines() == [os.strerror(errno.EPIPE)]


def test_a_reason_repeating_a_hostile_value_stays_one_bounded_line(tmp_path, capsys):
    """A value thousands of characters long is cut in the middle wherever the line repeats it (the reason too,
    not only after "got"); a long real path is printed whole."""
    from tests.conftest import run_main

    hostile = str(tmp_path / ("x" * 5000))
    assert run_main("pareto", "demo", "--tracking-uri", hostile)[0] == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and len(err[0]) < 1000 and "--tracking-uri: got " in err[0], err
    assert err[0].endswith(f"xxx ({os.strerror(errno.ENAMETOOLONG)})")
    real = tmp_path / ("d" * 100) / ("e" * 100) / "m.db"  # over 200 characters, missing
    assert run_main("pareto", "demo", "--tracking-uri", str(real))[0] == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"no tracking store at {real} " in err[0], err


def test_a_tracking_uri_with_a_byte_that_is_not_utf8_is_refused_naming_the_flag(tmp_path, capsys):
    """A file name's non-UTF-8 byte reaches Python as a lone surrogate; MLflow's stores take UTF-8 text only, so
    every command refuses it in one line before it opens or creates anything."""
    from tests.conftest import run_main

    for args in (("pareto", "demo"), ("sweep", str(ROOT / "search_spaces" / "demo.yaml"))):
        assert run_main(*args, "--tracking-uri", f"sqlite:///{tmp_path}/m\udcff.db")[0] == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "--tracking-uri: got " in err[0] and "not UTF-8 text" in err[0], err
    assert not list(tmp_path.iterdir())
