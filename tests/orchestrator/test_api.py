"""The Python API (orchestrator/api.py): docs/api.md's example run as it is (real Ray, a real sqlite MLflow
store), the CLI's errors raised, the front's DataFrame as `fractune pareto --json` gives it, a light import."""

from __future__ import annotations

import contextlib
import io
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engine.errors import ConfigError
from orchestrator import api
from orchestrator._result_types import FRONT_COLUMNS
from tests.conftest import ROOT, run_main

DOC = ROOT / "docs" / "api.md"


def doc_example() -> str:
    """The one ```python block of docs/api.md."""
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.S | re.M)
    assert len(blocks) == 1, f"docs/api.md should hold one python example, found {len(blocks)}"
    return blocks[0]


@pytest.mark.slow
def test_the_docs_example_runs_and_its_front_is_the_clis(ray_local, tmp_path, store_template, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(store_template, tmp_path / "mlflow.db")  # the example's sqlite:///mlflow.db, migrated once
    ns: dict = {}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(doc_example(), str(DOC), "exec"), ns)  # noqa: S102  the documentation's own example
    printed = buf.getvalue()

    run, sweep, trials, front, rep = ns["run"], ns["sweep"], ns["trials"], ns["front"], ns["rep"]
    assert isinstance(run, api.TrainResult) and 0 <= run.accuracy <= 1 and run.train_bitops > 0
    assert len(run.history) == 1 and list(ns["epochs"]["epoch"]) == [1]
    assert isinstance(sweep, api.SweepResult) and sweep.trials == 2 and sweep.errored == 0 and sweep.ok
    assert sweep.raw["sweep_id"] == sweep.sweep_id and "***" not in sweep._uri
    # one row per trial run, the rows the sweep's own outcome came from
    assert len(trials) == 2 and set(trials["status"]) == {"FINISHED"} and trials["complete"].all()
    assert sorted(trials["schedule"]) == ["fp32", "static"]
    assert set(front["run_id"]) == {p["run_id"] for p in sweep.pareto} <= set(trials["run_id"])
    # the report's files, by figure name
    assert rep.html.is_file() and rep.html.parent == tmp_path / "report"
    assert rep.figures["pareto"].is_file() and rep.figures["pareto"].suffix == ".png"
    # the bad spec's ConfigError: field, value and what is allowed
    assert "schedule.fw" in printed and "99" in printed and "1..32" in printed

    # `fractune pareto --json` on the same sweep: the same members, the DataFrame's columns its entries' keys
    code, _, cli = run_main("pareto", "digits_api", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                            "--json")
    assert code == 0 and cli["sweep_id"] == sweep.sweep_id
    assert cli["pareto"] and all(list(front.columns) == list(e) for e in cli["pareto"])
    assert list(front.columns) == list(FRONT_COLUMNS)
    assert front.to_dict("records") == [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                         for k, v in r.items()} for r in cli["pareto"]]
    typed = api.pareto_front("digits_api", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert typed.model_dump(include=set(cli) - {"pareto"}) == {k: v for k, v in cli.items() if k != "pareto"}
    capsys.readouterr()


def test_a_bad_spec_raises_the_clis_config_error(tmp_path, sqlite_uri, capsys):
    spec = {"name": "bad", "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits"},
                                    "schedule": {"kind": "static"}},
            "parameters": {"schedule.fw": {"grid": [4, 99]}, "optim.lr": {"grid": [-1.0]}}}
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    with pytest.raises(ConfigError) as caught:
        api.sweep(spec, tracking_uri=uri, storage=str(tmp_path / "runs"))
    fields = {field.split(": ")[-1]: (value, allowed) for field, value, allowed in caught.value.problems}
    assert fields["schedule.fw"][0] == 99 and "1..32" in fields["schedule.fw"][1]
    assert "optim.lr" in fields, caught.value.problems  # every problem at once
    assert not (tmp_path / "runs").exists() and not (tmp_path / "new.db").exists()  # nothing created

    # the same problems, the same lines, as the CLI prints them (exit 2)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError) as from_file:
        api.validate(path)
    code, _, _ = run_main("validate", str(path))
    err = [x for x in capsys.readouterr().err.splitlines() if x]
    assert code == 2 and err == [f"fractune validate: error: {line}" for line in from_file.value.lines()]

    # a config, an unknown sweep and an unknown cost model: ConfigError naming the field
    with pytest.raises(ConfigError, match="schedule.fw: got 40"):
        api.train({"model": {"name": "tiny"}, "data": {"dataset": "digits"}}, overrides=["schedule.kind=static",
                                                                                        "schedule.fw=40"])
    with pytest.raises(ConfigError) as unknown:
        api.pareto("no_such_sweep", tracking_uri=sqlite_uri)
    assert unknown.value.problems[0][:2] == ("sweep", "no_such_sweep")
    with pytest.raises(ConfigError, match="--objective: got 'joules'"):
        api.sweep(spec, tracking_uri=uri, objective="joules")
    assert isinstance(unknown.value, api.FractuneError) and api.SweepError.exit_code == 1


def test_importing_the_api_loads_no_ray_mlflow_torch_or_pandas():
    code = ("import sys, orchestrator.api as a; assert a.__all__; "
            "print(','.join(m for m in ('ray', 'mlflow', 'torch', 'pandas', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == ""


def test_every_public_function_is_documented():
    text = DOC.read_text()
    for name in api.__all__:
        obj = getattr(api, name)
        if callable(obj) and not isinstance(obj, type):
            doc = obj.__doc__ or ""
            assert "Returns:" in doc and "Raises:" in doc and "Args:" in doc, name
            assert f"`{name}(" in text, f"docs/api.md lacks {name}"
    assert Path(ROOT / "docs" / "usage.md").read_text().count("api.md") >= 1
