"""Staged sweeps (pretrain -> retrain) on a real local Ray and a real MLflow store: validation of stages and their
references, lineage tags, a failed pretrain failing only its dependants, and a killed driver resumed without
repeating the finished stage."""

from __future__ import annotations

import json

import pytest
import yaml

from results import store
from tests.conftest import run_main
from tests.orchestrator.procs import Pace, kill_session, start_cli, wait_for

BASE = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 1}}
METHODS = [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8}]


def staged(name: str, pretrain_set: dict | None = None, retrain_set: dict | None = None, **extra) -> dict:
    return {"name": name, "base": BASE,
            "stages": [
                {"name": "pretrain", "set": {"data.split": {"by": "samples", "part": 0}, "schedule": {"kind": "fp32"},
                                             "optim.epochs": 2, **(pretrain_set or {})}},
                {"name": "retrain", "init_from": "pretrain",
                 "set": {"data.split": {"by": "samples", "part": 1}, **(retrain_set or {})},
                 "parameters": {"schedule": {"grid": METHODS}}}],
            "seeds": [0, 1], "budget": {"max_concurrent_trials": 1, "max_failures": 0}, "resources": {"cpu": 1},
            **extra}


def write(tmp_path, spec: dict):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def child_runs(uri: str, name: str) -> list:
    c = store.client(uri)
    return store.child_runs(c, store.sweep_parent(c, name))


def test_validate_reports_each_stage_and_its_reference(run_cli, tmp_path):
    r = run_cli("validate", str(write(tmp_path, staged("ok"))), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["trials"] == 6 and [(s["name"], s["trials"], s["init_from"], s["head"]) for s in out["stages"]] == [
        ("pretrain", 2, None, None), ("retrain", 4, "pretrain", "keep")]


@pytest.mark.parametrize("change, field", [
    (lambda s: s["stages"][1].update(init_from="pretrian"), "stages[1].init_from"),
    (lambda s: s["stages"].reverse(), "stages[0].init_from"),  # a reference to a later stage
    (lambda s: s["stages"][0].update(parameters={"optim.lr": {"grid": [0.1, 0.2]}}), "stages[1].init_from"),
    (lambda s: s["stages"][1]["set"].update({"model.name": "resnet8"}), "stages[1].init_from"),
    (lambda s: s["stages"][1]["set"].update({"init.checkpoint": "/x"}), "stages[1].set.init"),
    (lambda s: s["stages"][1].update(name="pretrain"), "stages[1].name"),
    (lambda s: s.update(parameters={"optim.lr": {"grid": [0.1]}}), "parameters"),
    (lambda s: s["stages"][1]["set"].update({"data.split": {"by": "classes", "part": 3}}), "stages.retrain: base:"),
])
def test_validate_refuses_bad_stages_before_anything_starts(capsys, tmp_path, change, field):
    spec = staged("bad")
    change(spec)
    code, out, result = run_main("validate", str(write(tmp_path, spec)), "--json")
    err = capsys.readouterr().err
    assert code == 2 and result is None and field in err and "Traceback" not in err, err


def test_a_bad_staged_sweep_starts_nothing(run_cli, tmp_path):
    spec = staged("bad")
    spec["stages"][1]["init_from"] = "pretrian"
    storage = tmp_path / "runs"
    r = run_cli("sweep", str(write(tmp_path, spec)), "--storage", str(storage), "--tracking-uri",
                f"sqlite:///{tmp_path}/m.db", timeout=120)
    assert r.returncode == 2 and "stages[1].init_from: got 'pretrian'; allowed: an earlier stage (pretrain)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not any(storage.glob("bad-*"))  # one line, nothing started


@pytest.mark.slow
def test_staged_sweep_links_each_retrain_run_to_its_pretrain_run_and_a_failed_pretrain_fails_only_its_own(
        ray_local, tmp_path, sqlite_uri, capsys, monkeypatch):
    # seed 1's pretrain run diverges at iteration 3: its two retrain trials fail naming it, seed 0's finish
    spec = staged("lineage", pretrain_set={"debug": {"nan_loss_at_iteration": 3, "nan_loss_seeds": [1]}})
    args = ("sweep", str(write(tmp_path, spec)), "--storage", str(tmp_path / "runs"), "--tracking-uri", sqlite_uri,
            "--quiet", "--no-report", "--json")
    code, out, result = run_main(*args)
    assert code == 1, out  # errored trials
    assert result["trials"] == 6 and result["errored"] == 3
    assert result["stages"]["pretrain"]["errored"] == 1 and result["stages"]["retrain"]["errored"] == 2
    runs = {r.info.run_name: r for r in child_runs(sqlite_uri, "lineage")}
    assert len(runs) == 6 and all(r.data.tags[store.PARENT_TAG] == result["parent_run_id"] for r in runs.values())
    pre = {int(r.data.params["seed"]): r for r in runs.values() if r.data.tags["fractune.stage"] == "pretrain"}
    assert pre[0].info.status == "FINISHED" and pre[1].info.status == "FAILED"
    retrain = [r for r in runs.values() if r.data.tags["fractune.stage"] == "retrain"]
    assert len(retrain) == 4 and all(r.info.run_name.startswith("retrain-") for r in retrain)
    for r in retrain:
        seed = int(r.data.params["seed"])
        assert r.data.tags["fractune.init_run"] == pre[seed].info.run_id  # names its pretrain run
        assert r.data.tags["fractune.init_stage"] == "pretrain"
        if seed == 0:  # the pretrained weights were really loaded: the pretrain's accuracy before any step
            assert r.info.status == "FINISHED"
            assert r.data.metrics["init_accuracy"] == pytest.approx(pre[0].data.metrics["accuracy"])
            assert r.data.params["init.run_id"] == pre[0].info.run_id
        else:
            assert r.info.status == "FAILED"
            assert f"the pretrain run {pre[1].info.run_id} of seed 1 failed" in r.data.tags["fractune.error"]
            assert "TrainingDiverged" in r.data.tags["fractune.error"]
    errors = {(e["stage"], e["seed"]) for e in result["errors"]}
    assert errors == {("pretrain", 1), ("retrain", 1)}
    failed = {f"{r.data.tags[store.METHOD_TAG]} [{name}]" for name, r in runs.items() if r.info.status == "FAILED"}
    assert len(failed) == 3 and {e["label"] for e in result["errors"]} == failed  # each named as in MLflow
    # the front is the retrain stage's (finished trials of seed 0)
    assert {e["run_id"] for e in result["pareto"]} <= {r.info.run_id for r in retrain}
    assert result["compared_stages"] == ["retrain"]
    # `fractune pareto` reads the same front back from MLflow alone, over the same stage
    code, out, front = run_main("pareto", "lineage", "--tracking-uri", sqlite_uri, "--json")
    assert code == 0 and front["compared_stages"] == ["retrain"], out
    assert [e["run_id"] for e in front["pareto"]] == [e["run_id"] for e in result["pareto"]]
    assert front["trials"] == 6 and front["finished"] == 3  # seed 0's pretrain and its two retrain trials
    # the parent run as the MLflow UI shows it: the sweep's view, the front's hypervolume, a summary and a note
    # whose front is the retrain stage's
    c = store.client(sqlite_uri)
    parent = c.get_run(result["parent_run_id"])
    assert parent.data.metrics["sweep/front_size"] == len(result["pareto"])
    assert parent.data.metrics["sweep/trials"] == 6 and "hypervolume_bitops" in parent.data.metrics
    assert f"{len(result['pareto'])} on the Pareto front of stage retrain" in parent.data.tags["mlflow.note.content"]
    view = c.get_experiment(parent.info.experiment_id).tags[f"mlflow.sharedViewState.fractune-{result['sweep_id']}"]
    assert "tags.`fractune.stage`" in json.loads(view)["selectedColumns"]
    # `fractune results` compares the retrain stage's methods, with the pretrain's accuracy for reference
    from dashboards.results_page import build_results

    res = build_results(sqlite_uri, "lineage", None, tmp_path / "results.md", log=False)
    assert res["trials"] == 4 and res["finished"] == 2 and {m["n"] for m in res["methods"]} == {1}
    assert res["stages"][0]["stage"] == "pretrain" and res["stages"][0]["n"] == 1
    assert res["stages"][0]["accuracy_mean"] == pytest.approx(pre[0].data.metrics["accuracy"])
    assert res["stages"][1]["accuracy_mean"] == pytest.approx(pre[0].data.metrics["accuracy"])  # init_accuracy
    assert "## Earlier stages (reference)" in (tmp_path / "results.md").read_text()
    # the HTML report too: front, figures and importance over the retrain stage, the pretrain for reference
    from dashboards.report import build_report

    rep = build_report(sqlite_uri, "lineage", None, tmp_path / "report", log=False)
    assert rep["trials"] == 6 and rep["finished"] == 2 and rep["stages"][0]["stage"] == "pretrain"
    assert {r["run_id"] for r in rep["pareto"]} <= {r.info.run_id for r in retrain}
    html = (tmp_path / "report" / "report.html").read_text()
    assert "<h2>Stages</h2>" in html and "savings vs FW8/BW8 %" in html and pre[0].info.run_name in html
    # resuming a finished staged sweep runs nothing again
    code, out, again = run_main(*args, "--resume")
    assert again["sweep_id"] == result["sweep_id"] and again["trials"] == 6
    assert len(child_runs(sqlite_uri, "lineage")) == 6
    check_starting_from_a_run_id(tmp_path, sqlite_uri, pre, capsys)
    # `fractune sweeps`: both sweeps of this store, newest first, each as its parent run records it
    code, out, listed = run_main("sweeps", "--tracking-uri", sqlite_uri, "--json")
    assert code == 0 and [s["sweep"] for s in listed["sweeps"]] == ["from_run", "lineage"], out
    staged_row = listed["sweeps"][1]
    assert staged_row["sweep_id"] == result["sweep_id"] and staged_row["kind"] == "staged"
    assert (staged_row["trials"], staged_row["errored"], staged_row["planned"]) == (6, 3, 6)
    assert staged_row["front_size"] == len(result["pareto"]) and staged_row["status"] == "FINISHED"
    assert listed["sweeps"][0]["kind"] == "sweep" and result["sweep_id"] in out
    code, out, one = run_main("sweeps", "lineage", "--tracking-uri", sqlite_uri, "--json")
    assert [s["sweep_id"] for s in one["sweeps"]] == [result["sweep_id"]]
    # a store of more sweeps than a listing reads: the newest, and a line saying the list is cut
    from results import listing

    monkeypatch.setattr(listing, "MAX_SWEEPS", 1)
    capsys.readouterr()
    code, out, cut = run_main("sweeps", "--tracking-uri", sqlite_uri, "--json")
    assert [s["sweep"] for s in cut["sweeps"]] == ["from_run"]
    assert "the newest 1 shown; there may be more" in capsys.readouterr().err


def check_starting_from_a_run_id(tmp_path, sqlite_uri, pre, capsys):
    """Outside a staged sweep, a config or spec names the run to start from by its MLflow id alone
    (init.run_id): train, validate and sweep resolve it to the checkpoint the run recorded when it finished."""
    from pathlib import Path

    ckpt = pre[0].data.tags["fractune.checkpoint"]  # every finished trial records its final checkpoint
    assert (Path(ckpt) / "state.pt").is_file() and "fractune.checkpoint" not in pre[1].data.tags
    retrain = {**BASE, "data": {**BASE["data"], "split": {"by": "samples", "part": 1}}}
    plain = {"name": "from_run", "base": {**retrain, "init": {"run_id": pre[0].info.run_id}},
             "parameters": {"schedule": {"grid": [{"kind": "static", "fw": 8, "bw": 8}]}}, "seeds": [0],
             "resources": {"cpu": 1}}
    code, out, res = run_main("sweep", str(write(tmp_path, plain)), "--storage", str(tmp_path / "runs"),
                              "--tracking-uri", sqlite_uri, "--quiet", "--no-report", "--json")
    assert code == 0 and res["errored"] == 0, out
    (run,) = child_runs(sqlite_uri, "from_run")
    assert run.data.tags["fractune.init_run"] == pre[0].info.run_id and "fractune.stage" not in run.data.tags
    assert run.data.metrics["init_accuracy"] == pytest.approx(pre[0].data.metrics["accuracy"])  # really loaded
    # fractune train: the same run by id; the store is --tracking-uri
    cfg = tmp_path / "from_run.yaml"
    cfg.write_text(yaml.safe_dump({**retrain, "name": "from_run", "schedule": {"kind": "fp32"},
                                   "init": {"run_id": pre[0].info.run_id}}))
    code, out, res = run_main("train", str(cfg), "--tracking-uri", sqlite_uri, "--json")
    assert code == 0 and res["init_accuracy"] == pytest.approx(pre[0].data.metrics["accuracy"]), out
    # an unknown run, and a run that failed before any checkpoint: one line each, exit 2, nothing run
    plain["base"]["init"]["run_id"] = "0123456789abcdef"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(plain))
    capsys.readouterr()
    code, out, _ = run_main("validate", str(bad), "--tracking-uri", sqlite_uri)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "init.run_id: got '0123456789abcdef'; allowed: a run in the " \
        "tracking store" in err[0], err
    cfg.write_text(yaml.safe_dump({**retrain, "name": "x", "init": {"run_id": pre[1].info.run_id}}))
    code, out, _ = run_main("train", str(cfg), "--tracking-uri", sqlite_uri)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "this run is FAILED and records none" in err[0], err


@pytest.mark.slow
def test_a_killed_driver_resumes_the_retrain_stage_without_repeating_the_pretrain(ray_local, tmp_path, sqlite_uri,
                                                                                  capsys):
    pace = Pace(tmp_path, 0.03)
    spec = staged("kill_staged", pretrain_set={"optim.epochs": 1},
                  retrain_set={"optim.epochs": 3, **{f"debug.{k}": v for k, v in pace.debug.items()}})
    spec["seeds"] = [0]
    uri = sqlite_uri  # the tables exist: this test polls the store while the sweep writes it
    # the killed driver attaches to the session's Ray (a driver's death ends its trials' actors, as a local Ray's
    # would); the resume runs in this process, on the same Ray
    args = ("sweep", str(write(tmp_path, spec)), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri,
            "--quiet", "--no-report", "--address", ray_local.get_runtime_context().gcs_address)
    env = {"RAY_ADDRESS": ""}
    proc = start_cli(*args, cwd=tmp_path, env=env)
    try:
        def retrain_running():
            try:
                runs = child_runs(uri, "kill_staged")
            except Exception:  # nothing logged yet
                return None
            c = store.client(uri)
            going = [r for r in runs if r.data.tags.get("fractune.stage") == "retrain" and r.info.status == "RUNNING"
                     and c.get_metric_history(r.info.run_id, "accuracy")]
            return runs if going else None

        before = wait_for(retrain_running, timeout=300, what="a retrain trial with an epoch logged")
    finally:
        kill_session(proc.pid)
        proc.wait(timeout=30)
        pace.release()  # the resume runs at full speed
    pretrain_before = {r.info.run_id: r.info.end_time for r in before if r.data.tags["fractune.stage"] == "pretrain"}
    assert len(pretrain_before) == 1
    # the killed sweep is listed as it was left: not FINISHED, its trials planned, its outcome not yet written
    from orchestrator import api

    (left,) = api.sweeps("kill_staged", tracking_uri=uri).sweeps
    assert left["status"] != "FINISHED" and left["planned"] == 3 and left["trials"] is None, left
    capsys.readouterr()
    code, text, out = run_main(*args, "--resume", "--json")
    err = capsys.readouterr().err
    assert code == 0, text[-3000:] + err[-3000:]
    assert "stage pretrain: finished before, not run again" in err
    after = child_runs(uri, "kill_staged")
    c = store.client(uri)
    assert len(after) == 3  # one pretrain run, two retrain runs: each exactly once
    pre = [r for r in after if r.data.tags["fractune.stage"] == "pretrain"]
    assert {r.info.run_id: r.info.end_time for r in pre} == pretrain_before  # not run again
    for r in after:
        if r.data.tags["fractune.stage"] == "retrain":
            assert r.info.status == "FINISHED" and r.data.tags["fractune.init_run"] == pre[0].info.run_id
            assert [m.step for m in c.get_metric_history(r.info.run_id, "accuracy")] == [1, 2, 3]
    assert out["trials"] == 3 and out["errored"] == 0
    (done,) = api.sweeps("kill_staged", tracking_uri=uri).sweeps
    assert (done["sweep_id"], done["status"], done["trials"], done["errored"]) == (out["sweep_id"], "FINISHED", 3, 0)
