"""Files fractune reads and writes, under hostile conditions: a refused ``--resume`` leaves ``--history`` byte
for byte as it was and a successful one appends; every reader fed random YAML documents (aliases, deep
nesting, duplicate keys, random bytes) ends with exit 0 or exit 2 and one line, within a time and memory bound.
(That the local Ray ``fractune sweep`` starts opens no port off loopback that answers without Ray's token is
checked in tests/test_safety.py, with the loopback dashboard, on one Ray.)"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli.main import main
from tests.conftest import ROOT, write_yaml

TINY = """
name: hostile_tiny
model: {name: tiny}
data: {dataset: digits, batch_size: 64}
optim: {epochs: 2}
schedule: {kind: static, fw: 6, bw: 8}
"""


def _main(*args: str) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    return code, [x for x in err.getvalue().splitlines() if x.strip()]


def test_refused_resume_keeps_history_and_a_successful_one_appends(tmp_path, monkeypatch):
    from engine import train

    cfg = write_yaml(tmp_path / "tiny.yaml", TINY)
    hist, ck = tmp_path / "h.jsonl", tmp_path / "ck"
    hist.write_text('{"note": "lines from before"}\n')
    real_epoch, calls = train.Trainer.train_epoch, []

    def one_epoch_then_interrupt(self):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_epoch(self)

    monkeypatch.setattr(train.Trainer, "train_epoch", one_epoch_then_interrupt)
    code, _ = _main("train", str(cfg), "--checkpoint-dir", str(ck), "--history", str(hist))
    assert code == 130  # interrupted after epoch 1: its line and checkpoint are written
    monkeypatch.setattr(train.Trainer, "train_epoch", real_epoch)
    before = hist.read_bytes()
    assert [json.loads(x).get("epoch") for x in before.decode().splitlines()] == [None, 1]

    code, err = _main("train", str(cfg), "--set", "optim.lr=0.05", "--resume", str(ck), "--history", str(hist))
    assert code == 2 and len(err) == 1 and "different configuration" in err[0], err
    assert hist.read_bytes() == before  # byte for byte

    code, err = _main("train", str(cfg), "--resume", str(ck), "--history", str(hist))
    assert code == 0, err
    after = hist.read_bytes()
    assert after.startswith(before)
    assert [json.loads(x).get("epoch") for x in after.decode().splitlines()] == [None, 1, 2]


class NotPlainData:
    """Unpickling this would import and build an object of this module: code, which weights_only refuses."""


def test_checkpoint_holding_code_is_refused_in_one_line(tmp_path):
    import torch

    folder = tmp_path / "ck"
    folder.mkdir()
    torch.save({"format": 2, "x": NotPlainData()}, folder / "state.pt")
    code, err = _main("train", str(write_yaml(tmp_path / "tiny.yaml", TINY)), "--resume", str(folder))
    assert code == 2 and len(err) == 1, err
    assert "refused" in err[0] and "weights_only" not in err[0], err[0]


# -- fuzz: random YAML documents to every reader ------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), st.text(max_size=12),
                    st.sampled_from(["tiny", "digits", "static", "fp32", "grid", "ofat", ".inf", "~", "8/8"]))
keys = st.sampled_from(["name", "base", "set", "parameters", "seeds", "search", "model", "data", "optim", "schedule",
                        "kind", "fw", "bw", "grid", "ablation", "factors", "baseline", "epochs", "lr", "resources"])


def _yaml_of(value) -> str:
    return json.dumps(value)  # JSON is YAML: flow style, any nesting


@st.composite
def documents(draw) -> bytes:
    kind = draw(st.sampled_from(["tree", "aliases", "deep", "dupkeys", "bytes", "mixed"]))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "deep":
        n = draw(st.integers(50, 5000))
        opener = draw(st.sampled_from(["[", "{a: "]))
        closer = "]" if opener == "[" else "}"
        return ("x: " + opener * n + "1" + closer * n).encode()
    if kind == "aliases":
        width, levels = draw(st.integers(2, 12)), draw(st.integers(1, 12))
        lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
        lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
        if draw(st.booleans()):
            lines.append("c: &c [*c]" if draw(st.booleans()) else "d: *nosuch")
        return "\n".join(lines).encode()
    tree = draw(st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(keys, c, max_size=5)),
                             max_leaves=30))
    text = "\n".join(f"{k}: {_yaml_of(v)}" for k, v in (tree.items() if isinstance(tree, dict) else [("name", tree)]))
    if kind == "dupkeys":
        text += "\nname: again"
    if kind == "mixed":
        text += "\n" + draw(st.text(max_size=40))
    return text.encode()


def _readers(f, good, spec):
    """Every reader of a user's YAML, as commands that stop before any training when the document is valid:
    a config (validate, schedule), a sweep or ablation spec (validate), a spec's base file, a --set value,
    notes (results: refused for its missing store once the notes are read)."""
    text = f.read_bytes().decode(errors="replace")[:300]
    return [["validate", str(f)], ["schedule", str(f)], ["validate", str(spec)],
            ["schedule", str(good), "--set", f"schedule.fw={text}"], ["results", "x", "--notes", str(f)]]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(doc=documents(), which=st.integers(0, 4))
def test_fuzz_every_reader_refuses_in_one_line_within_bounds(doc, which, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    f = tmp_path / "doc.yaml"
    f.write_bytes(doc)
    good = write_yaml(tmp_path / "good.yaml", TINY)
    spec = write_yaml(tmp_path / "spec.yaml", "name: fz\nbase: doc.yaml\nparameters: {schedule.fw: {grid: [4]}}\n")
    argv = _readers(f, good, spec)[which]
    started = time.perf_counter()
    code, err = _main(*argv)
    assert time.perf_counter() - started < 20, argv[:2]
    assert code in (0, 2), (code, err)
    if code == 2:
        assert 1 <= len(err) <= 20 and not any("Traceback" in x for x in err), err  # one line per problem


@pytest.mark.slow
def test_fuzz_hostile_documents_in_real_processes_are_bounded(tmp_path):
    """The worst documents in a real process: exit 2, one line, seconds, and a peak memory within a small margin
    of the same command refusing a two-line document (the imports' own footprint differs between machines: torch's
    CUDA wheel alone is 0.5 to 1.6 GB resident, so only the document's share is bounded)."""
    bomb = "a: &a ['x','x','x','x','x','x','x','x','x']\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(9))
    cases = {"bomb.yaml": bomb, "deep.yaml": "x: " + "[" * 100000 + "]" * 100000,  # the others: in process
             "plain.yaml": "schedule: {method: nosuch}\n"}  # the baseline: a plain refusal
    for name, text in cases.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    procs = {name: subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "validate", name], cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)}) for name in cases}
    started = time.perf_counter()
    peaks = {}
    for name, proc in procs.items():  # all at once: the bound holds under contention too
        _, _, rusage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        err = proc.stderr.read().decode().strip().splitlines()
        proc.stdout.close()
        proc.stderr.close()
        assert len(err) == 1 and "error:" in err[0], (name, err)
        assert wall < 90, (name, wall)
        peaks[name] = rusage.ru_maxrss  # KiB
        print(f"{name}: {wall:.1f} s, peak {rusage.ru_maxrss / 1024:.0f} MiB")
    for name in ("bomb.yaml", "deep.yaml"):  # a billion-laughs expansion or a 100k-deep recursion would be GBs
        assert peaks[name] < peaks["plain.yaml"] + 256 * 1024, (name, peaks)


def test_oversized_file_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n#" + "y" * (2 << 20))
    started = time.perf_counter()
    code, err = _main("validate", str(big))
    assert code == 2 and len(err) == 1 and "at most 1048576 bytes" in err[0], err
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize("flag", ["--plot", "--history"])
def test_output_path_refused_before_the_work(tmp_path, flag, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = write_yaml(tmp_path / "tiny.yaml", TINY)
    cmd = "schedule" if flag == "--plot" else "train"
    started = time.perf_counter()
    code, err = _main(cmd, str(cfg), flag, str(tmp_path))
    assert code == 2 and len(err) == 1 and flag in err[0], err
    assert time.perf_counter() - started < 5  # before any training


def test_a_sweep_tune_gives_up_on_leaves_its_parent_run_failed_with_the_cause(sqlite_uri):
    from orchestrator.sweep.driver import mark_failed
    from orchestrator.tracking.tracker import MLflowTracker
    from results import store

    uri = sqlite_uri
    tracker = MLflowTracker(uri, "refused", "refused-20261124-000000", {"spec": "refused"}, {"name": "refused"})
    tracker.setup()  # what Tune's fit() does first: the parent run exists, RUNNING
    parent_id = tracker.state["parent_run_id"]
    assert store.client(uri).get_run(parent_id).info.status == "RUNNING"
    mark_failed(tracker, "Ray Tune could not finish sweep refused-20261124-000000: ValueError: bad space")
    run = store.client(uri).get_run(parent_id)
    assert run.info.status == "FAILED"
    assert "bad space" in run.data.tags["fractune.error"]


@pytest.mark.slow
def test_schedule_preview_of_a_huge_run_is_bounded_in_memory_and_time():
    import tracemalloc

    from engine.config.experiment import parse_config
    from engine.preview import EXACT_UP_TO, preview

    cfg = parse_config({"model": {"name": "tiny"}, "data": {"dataset": "digits"}, "optim": {"iterations": 10**9},
                        "schedule": {"kind": "cpt", "fw_min": 3, "fw_max": 8, "bw_min": 8, "bw_max": 8,
                                     "num_cycles": 32}})
    tracemalloc.start()
    started = time.perf_counter()
    out = preview(cfg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out["iterations"] == 10**9 and out["sampled"].startswith(f"{EXACT_UP_TO} evenly spaced")
    assert 3 < out["mean_fw_bits"] < 8
    assert peak < 5 << 20, peak  # a few MiB whatever the iteration count (one entry per iteration: 8 GB)
    assert time.perf_counter() - started < 600  # seconds unloaded; tracemalloc and a shared CI slow it
