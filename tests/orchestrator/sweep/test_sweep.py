"""Sweeps on a real local Ray into a real sqlite MLflow store."""

from __future__ import annotations

import json

import pytest

from engine.errors import ConfigError
from orchestrator.sweep.driver import SweepOptions
from orchestrator.sweep.launch import run_sweep
from results import store
from search_spaces.spec import parse_spec
from tests.conftest import run_main

DIGITS = {
    "name": "digits_sweep",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 2}},
    "parameters": {"schedule": {"grid": [{"kind": "fp32"}, {"kind": "static", "fw": 8, "bw": 8},
                                         {"kind": "static", "fw": 4, "bw": 8}, {"kind": "static", "fw": 2, "bw": 4}]}},
    "budget": {"max_concurrent_trials": 1},
    "resources": {"cpu": 1},
}


def test_the_parent_run_records_the_spec_file(tmp_path, monkeypatch):
    """``spec_file``: relative to the project root inside it, else absolute; a submitted job's copy: the file
    submitted (FRACTUNE_SPEC_FILE); none for a spec that is no file."""
    from orchestrator.sweep.driver import spec_file_param
    from search_spaces import PRESETS_DIR, load_spec
    from tests.conftest import ROOT

    monkeypatch.delenv("FRACTUNE_SPEC_FILE", raising=False)
    assert spec_file_param(load_spec(PRESETS_DIR / "demo.yaml")) == {"spec_file": "search_spaces/demo.yaml"}
    study = "docs/studies/study_fmnist_routed_half.yaml"
    monkeypatch.chdir(ROOT / "docs")
    assert spec_file_param(load_spec("studies/study_fmnist_routed_half.yaml")) == {"spec_file": study}
    outside = tmp_path / "s.yaml"
    outside.write_text(json.dumps(DIGITS))
    monkeypatch.chdir(tmp_path)
    assert spec_file_param(load_spec("s.yaml")) == {"spec_file": str(outside.resolve())}
    assert spec_file_param(parse_spec(DIGITS)) == {}
    monkeypatch.setenv("FRACTUNE_SPEC_FILE", study)
    assert spec_file_param(load_spec("s.yaml")) == {"spec_file": study}


@pytest.mark.slow
def test_four_trial_sweep_tracks_every_trial(ray_local, tmp_path, sqlite_uri):
    out = run_sweep(parse_spec(DIGITS), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "runs"),
                                                      progress=False))
    assert out["trials"] == 4 and out["errored"] == 0
    c = store.client(sqlite_uri)
    parent = store.sweep_parent(c, "digits_sweep")
    assert parent.info.run_id == out["parent_run_id"] and parent.info.status == "FINISHED"
    assert parent.data.tags["fractune.git_sha"] and "fractune.version.torch" in parent.data.tags
    children = store.child_runs(c, parent)
    assert len(children) == 4
    assert {r.info.status for r in children} == {"FINISHED"}
    kinds = sorted(r.data.params["schedule.kind"] for r in children)
    assert kinds == ["fp32", "static", "static", "static"]
    # named by what tells the trials apart (method, then the static rows' bits) and the seed; short and unique
    by_name = {r.info.run_name: r for r in children}
    assert sorted(by_name) == ["fp32 s0", "static fw2/bw4 s0", "static fw4/bw8 s0", "static fw8/bw8 s0"]
    # the full configuration stays in the params and the point tag: what the name leaves out included
    fw4 = by_name["static fw4/bw8 s0"].data
    assert (fw4.params["schedule.fw"], fw4.params["schedule.bw"], fw4.params["seed"]) == ("4", "8", "0")
    assert {"optim.epochs", "optim.lr", "data.batch_size", "data.dataset", "model.name"} <= set(fw4.params)
    assert json.loads(fw4.tags[store.POINT_TAG]) == {"schedule": {"kind": "static", "fw": 4, "bw": 8}}
    for run in children:
        assert run.data.tags[store.TRIAL_TAG]
        assert run.data.params["model.name"] == "tiny" and run.data.params["data.dataset"] == "digits"
        for key in ("accuracy", "val_accuracy", "loss", "step_bitops", "cum_gbitops", "cp", "fw_bits", "bw_bits"):
            history = c.get_metric_history(run.info.run_id, key)
            assert [m.step for m in history] == [1, 2], key
        cum = [m.value for m in c.get_metric_history(run.info.run_id, "cum_gbitops")]
        assert cum[1] > cum[0] > 0
        artifacts = [a.path for a in c.list_artifacts(run.info.run_id)]
        assert "config.yaml" in artifacts
    # the Pareto front: tagged in MLflow, reported in the outcome, and non-dominated
    front_ids = {p["run_id"] for p in out["pareto"]}
    assert front_ids == {r.info.run_id for r in children if r.data.tags.get("pareto") == "true"}
    assert 1 <= len(front_ids) <= 4
    points = [(r.data.metrics["accuracy"], r.data.metrics["train_bitops"]) for r in children]
    for p in out["pareto"]:
        assert not any(a >= p["accuracy"] and b <= p["train_bitops"] and (a, b) != (p["accuracy"], p["train_bitops"])
                       for a, b in points)
    fp32 = next(r for r in children if r.data.params["schedule.kind"] == "fp32")
    assert fp32.data.metrics["cp"] == 100.0
    assert "pareto.json" in [a.path for a in c.list_artifacts(parent.info.run_id)]


ASHA = {
    "name": "digits_asha",
    "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 3},
             "schedule": {"kind": "static", "fw": 8, "bw": 8}},
    # one trial at a learning rate that cannot learn: ASHA stops it at its first rung
    "parameters": {"optim.lr": {"grid": [0.1, 0.05, 1e-6]}},
    "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
    "budget": {"max_concurrent_trials": 1},  # in grid order: the stopped trial meets the recorded rungs
    "resources": {"cpu": 1},
}


@pytest.mark.slow
def test_pareto_command_gives_the_sweeps_front_after_asha_stopped_a_trial(ray_local, tmp_path, sqlite_uri, run_cli,
                                                                           capsys):
    from results import runs
    from results.pareto import pareto_rows

    out = run_sweep(parse_spec(ASHA), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "runs")))
    ended = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[")]  # "[k/3] LABEL how"
    assert out["trials"] == 3 and out["errored"] == 0
    data = runs.load(sqlite_uri, "digits_asha")
    stopped = [r for r in data.rows if not r["complete"]]
    assert stopped and all(r["status"] == "FINISHED" and r["epochs"] < r["planned_epochs"] == 3 for r in stopped)
    assert {r["point"]["optim.lr"] for r in stopped} >= {1e-6}
    # a stopped trial ran fewer epochs, so it is cheap: a front over FINISHED runs alone would take it
    naive = {r["run_id"] for r in pareto_rows([r for r in data.rows if r["status"] == "FINISHED"])}
    assert naive & {r["run_id"] for r in stopped}
    assert not {p["run_id"] for p in out["pareto"]} & {r["run_id"] for r in stopped}

    r = run_cli("pareto", "digits_asha", "--tracking-uri", sqlite_uri, "--json")  # from MLflow alone
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout.strip().splitlines()[-1])
    assert again["pareto"] == json.loads(json.dumps(out["pareto"])) and again["trials"] == 3
    assert again["finished"] == 3 - len(stopped)
    # the sweep's own record on the parent run says the same
    summary = store.artifact_json(data.client, data.parent_run_id, "pareto.json")
    assert [p["run_id"] for p in summary["pareto"]] == [p["run_id"] for p in again["pareto"]]
    assert {t["run_id"] for t in summary["trials"] if not t["complete"]} == {r["run_id"] for r in stopped}
    # each stopped trial is tagged where it stopped (the MLflow view shows the tag as a column) and counted: by
    # the sweep, `pareto`, the parent run's summary and the results page
    for row in data.rows:
        tag = data.client.get_run(row["run_id"]).data.tags.get("stopped_early")
        assert tag == (f"epoch {row['epochs']} of 3" if row in stopped else None), (row["name"], tag)
    stopped_ids = sorted(r["run_id"] for r in stopped)
    assert sorted(s["run_id"] for s in out["stopped"]) == stopped_ids and sorted(again["stopped"]) == stopped_ids
    assert f"{len(stopped)} trial(s) stopped early by the scheduler" in r.stderr
    # the progress line of each trial as it ended says which: finished, or stopped early and where
    assert len(ended) == 3
    for row in data.rows:
        (line,) = [x for x in ended if f"[{row['name']}]" in x]
        assert line.endswith(f"stopped early (epoch {row['epochs']} of 3)" if row in stopped else "finished"), line
    parent = data.client.get_run(data.parent_run_id)
    assert parent.data.metrics["sweep/stopped_early"] == len(stopped)
    assert f"{len(stopped)} stopped early" in parent.data.tags["mlflow.note.content"]
    view = json.loads(data.client.get_experiment(data.experiment_id).tags[
        f"mlflow.sharedViewState.fractune-{out['sweep_id']}"])
    assert "tags.`stopped_early`" in view["selectedColumns"]
    code, text, page = run_main("results", "digits_asha", "--tracking-uri", sqlite_uri, "--out",
                                str(tmp_path / "results.md"), "--no-log", "--json")
    assert code == 0 and sorted(s["run_id"] for s in page["stopped"]) == stopped_ids
    assert f"**Stopped early:** {len(stopped)} trial(s)" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_optuna_multi_objective_sweep(ray_local, tmp_path, sqlite_uri):
    spec = {**DIGITS, "name": "digits_optuna",
            "base": {**DIGITS["base"], "optim": {"epochs": 1}, "schedule": {"kind": "static", "fw": 8, "bw": 8}},
            "parameters": {"schedule.fw": {"int": [2, 8]}, "schedule.bw": {"choice": [4, 8]}},
            "search": {"algorithm": "optuna", "sampler": "nsga2", "num_samples": 3, "seed": 1}}
    out = run_sweep(parse_spec(spec), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "runs"), progress=False))
    assert out["trials"] == 3 and out["errored"] == 0
    import optuna

    journal = tmp_path / "runs" / "optuna" / f"{out['sweep_id']}.journal"
    study = optuna.load_study(study_name=out["sweep_id"], storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))))
    assert len(study.trials) == 3 and study.directions[0].name == "MAXIMIZE"
    for p in out["pareto"]:
        assert 2 <= p["params"]["schedule.fw"] <= 8 and p["params"]["schedule.bw"] in (4, 8)


def test_resources_larger_than_the_cluster_are_refused(ray_local, tmp_path, sqlite_uri):
    spec = {**DIGITS, "name": "too_big", "resources": {"cpu": 64, "gpu": 1}}
    with pytest.raises(ConfigError) as info:
        run_sweep(parse_spec(spec), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "runs"), progress=False))
    lines = info.value.lines()
    assert any(x.startswith("resources.cpu: got 64.0; allowed: <= 2") for x in lines)
    assert any(x.startswith("resources.gpu: got 1.0; allowed: <= 0") for x in lines)
    assert store.sweep_parent(store.client(sqlite_uri), "too_big") is None  # nothing started


def test_resume_without_a_sweep_is_a_clear_error(tmp_path, sqlite_uri):
    with pytest.raises(ConfigError, match="no sweep named 'digits_sweep' to resume"):
        run_sweep(parse_spec(DIGITS), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path), resume=True))


@pytest.mark.slow
def test_a_failing_trial_does_not_kill_the_sweep(ray_local, tmp_path, sqlite_uri):
    # the second trial points at a folder without Fashion-MNIST: it raises inside the trial
    spec = {**DIGITS, "name": "one_fails", "base": {**DIGITS["base"], "optim": {"epochs": 1}},
            "parameters": {"data": {"grid": [{"dataset": "digits", "batch_size": 64},
                                             {"dataset": "fashion-mnist", "data_dir": str(tmp_path / "empty")}]}},
            "budget": {"max_failures": 0}, "resources": {"cpu": 2}}
    out = run_sweep(parse_spec(spec), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "runs"), progress=False))
    assert out["trials"] == 2 and out["errored"] == 1
    (err,) = out["errors"]
    assert "data.data_dir" in err["error"] and "dataset-fashion-mnist" in err["error"]
    c = store.client(sqlite_uri)
    runs = {r.info.status: r for r in store.child_runs(c, store.sweep_parent(c, "one_fails"))}
    assert set(runs) == {"FINISHED", "FAILED"}
    assert "data.data_dir" in runs["FAILED"].data.tags["fractune.error"]
    assert [p["run_id"] for p in out["pareto"]] == [runs["FINISHED"].info.run_id]
    # the trial's resources reached torch: two CPUs, two threads; no GPU given, so the CPU
    assert runs["FINISHED"].data.tags["fractune.torch_threads"] == "2"
    assert runs["FINISHED"].data.tags["fractune.device"] == "cpu"


def test_cli_reports_spec_and_cluster_errors_together(ray_local, tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nbase: {model: {name: tiny}, data: {dataset: digits}, schedule: {kind: static}}\n"
                    "parameters: {schedule.fw: {grid: [4, 99]}}\nresources: {cpu: 512}\n")
    code, _, _ = run_main("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri",
                          f"sqlite:///{tmp_path}/m.db")
    lines = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert code == 2, lines
    assert any("schedule.fw: got 99" in x for x in lines) and any("resources.cpu: got 512" in x for x in lines)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("bad-*"))


@pytest.mark.slow
def test_sweep_front_on_a_cost_model(ray_local, tmp_path, sqlite_uri, capsys):
    """The spec's ``objective`` picks the cost axis: on 8-bit integer units FW6/BW8 costs what FW8/BW8 costs, so
    it cannot beat FW8/BW8 on cost alone; ``fractune pareto`` gives the same front, and any other model."""
    import math

    from results import runs

    spec = {**DIGITS, "name": "digits_int_units", "objective": "int_units",
            "parameters": {"schedule": {"grid": [{"kind": "static", "fw": 8, "bw": 8},
                                                 {"kind": "static", "fw": 6, "bw": 8},
                                                 {"kind": "static", "fw": 3, "bw": 8}]}}}
    out = run_sweep(parse_spec(spec), SweepOptions(tracking_uri=sqlite_uri, storage=str(tmp_path / "runs"),
                                                    progress=False))
    assert out["errored"] == 0 and out["objective"] == "int_units"
    data = runs.load(sqlite_uri, "digits_int_units")
    assert data.objective == "int_units"
    by_fw = {r["point"]["schedule"]["fw"]: r for r in data.rows}
    assert by_fw[6]["costs"]["int_units"] == by_fw[8]["costs"]["int_units"]
    assert by_fw[6]["train_bitops"] < by_fw[8]["train_bitops"]
    finished = data.finished("int_units")
    for p in out["pareto"]:
        assert p["objective"] == "int_units" and p["cost"] == data.client.get_run(p["run_id"]).data.metrics[
            "train_cost_int_units"]
        assert not any(r["accuracy"] >= p["accuracy"] and r["costs"]["int_units"] <= p["cost"]
                       and (r["accuracy"], r["costs"]["int_units"]) != (p["accuracy"], p["cost"]) for r in finished)
    code, _, again = run_main("pareto", "digits_int_units", "--tracking-uri", sqlite_uri, "--json")
    assert code == 0 and again["objective"] == "int_units"
    assert again["pareto"] == json.loads(json.dumps(out["pareto"]))
    code, _, energy = run_main("pareto", "digits_int_units", "--tracking-uri", sqlite_uri, "--objective", "energy",
                               "--json")
    assert code == 0 and energy["objective"] == "energy"
    assert all(math.isfinite(p["cost"]) and p["cost"] == by_fw[p["params"]["schedule"]["fw"]]["costs"]["energy"]
               for p in energy["pareto"])
    capsys.readouterr()
    assert run_main("pareto", "digits_int_units", "--tracking-uri", sqlite_uri, "--objective", "joules")[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--objective" in err[0] and "energy" in err[0]
