"""`fractune compare` on two real sweeps of one spec with different seeds (run on the session's Ray into a sqlite
store): one figure, one table with each method in both and the differences, `--json`, the same from the API; bad
input refused in one line with exit 2 and nothing written."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import hand_logged_sweep, run_main

SPEC = {"name": "cmp", "base": {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64},
                                "optim": {"epochs": 1}},
        "parameters": {"schedule": {"grid": [{"kind": "fp32"}, {"kind": "static", "fw": 4, "bw": 8}]}},
        # one trial at a time: the sweep's trials share one trial process
        "budget": {"max_concurrent_trials": 1}, "resources": {"cpu": 1}}


@pytest.fixture(scope="module")
def two_sweeps(ray_local, tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    ids = []
    for seed in (0, 1):
        spec = folder / f"cmp{seed}.yaml"
        spec.write_text(yaml.safe_dump({**SPEC, "seeds": [seed]}))
        code, out, result = run_main("sweep", str(spec), "--tracking-uri", uri, "--storage", str(folder / "runs"),
                                     "--quiet", "--no-report", "--json")
        assert code == 0, out
        ids.append(result["sweep_id"])
    return {"uri": uri, "ids": ids, "folder": folder}


@pytest.mark.slow
def test_compare_puts_two_sweeps_on_one_figure_and_one_table(two_sweeps, tmp_path, capsys):
    from orchestrator import api
    from results import runs

    uri, (first, second) = two_sweeps["uri"], two_sweeps["ids"]
    out_md = tmp_path / "cmp.md"
    code, text, out = run_main("compare", first, "cmp", "--tracking-uri", uri, "--out", str(out_md), "--json")
    assert code == 0, text
    assert [s["sweep_id"] for s in out["sweeps"]] == [first, second]  # "cmp": its latest run
    assert out["task"] == "accuracy max" and out["plot"].endswith("cmp_fronts.png")
    assert (tmp_path / "cmp_fronts.png").stat().st_size > 10_000 and list(tmp_path.glob("*.png")) == [
        tmp_path / "cmp_fronts.png"]  # one figure
    # one entry per method, each with its means in both sweeps, read back from MLflow, and their differences
    data = [runs.load(uri, "cmp", i) for i in (first, second)]
    assert {m["method"] for m in out["methods"]} == {"FP32", "FW4/BW8"}
    for m in out["methods"]:
        rows = [next(r for r in d.rows if r["method"] == m["method"]) for d in data]
        a, b = (m["sweeps"][i] for i in (first, second))
        assert (a["accuracy"], b["accuracy"]) == (rows[0]["accuracy"], rows[1]["accuracy"]) and a["n"] == b["n"] == 1
        assert a["tbitops"] == pytest.approx(rows[0]["train_bitops"] / 1e12, rel=1e-12)
        assert m["diff"][second]["accuracy"] == pytest.approx(b["accuracy"] - a["accuracy"], abs=1e-12)
        assert m["diff"][second]["tbitops_pct"] == pytest.approx(100 * (b["tbitops"] / a["tbitops"] - 1), abs=1e-9)
    # the page: a row per sweep, then the table: a row per method with both sweeps' figures and the difference
    page = out_md.read_text()
    assert f"| `{first}` | 2 | 2 |" in page and f"| `{second}` | 2 | 2 |" in page
    fw4 = next(x for x in page.splitlines() if x.startswith("| FW4/BW8 |")).split(" | ")
    entry = next(m for m in out["methods"] if m["method"] == "FW4/BW8")
    assert fw4[1] == f"{entry['sweeps'][first]['accuracy']:.4f}" and fw4[4] == f"{entry['sweeps'][second]['accuracy']:.4f}"
    assert fw4[7] == f"{entry['diff'][second]['accuracy']:+.4f}" and "![fronts](cmp_fronts.png)" in page
    # the API gives the same
    res = api.compare([first, second], tracking_uri=uri, out=str(tmp_path / "api.md"))
    assert res.methods == out["methods"] and res.plot.is_file() and res.markdown.is_file()


@pytest.mark.slow
def test_compare_refuses_what_it_cannot_compare_in_one_line(two_sweeps, tmp_path, capsys):
    from results import store

    uri, (first, second) = two_sweeps["uri"], two_sweeps["ids"]
    # a language model's sweep (its trial logs test perplexity) in the same store
    c = store.client(uri)
    _, parent, _ = hand_logged_sweep(c, "lm_sweep", "lm_sweep-20260101-000000", {
        "perplexity": 80.0, "accuracy": 0.2, "train_bitops": 1e12, "epoch": 1})
    c.set_terminated(parent.info.run_id)
    capsys.readouterr()
    cases = [((first, "nosuch"), "sweep: got 'nosuch'; no sweep of that name"),
             ((first, "lm_sweep"), "allowed: sweeps of one task objective"),
             ((first,), "sweeps: got '" + first + "'; allowed: two or more sweeps"),
             ((first, first), "given twice"),
             (("bad name", "bad name"), "sweep: got 'bad name'; allowed: letters, digits"),  # one bad name twice: one line
             ((second, "cmp"), "named twice")]
    for sweeps, line in cases:
        out = tmp_path / "c.md"
        code, text, _ = run_main("compare", *sweeps, "--tracking-uri", uri, "--out", str(out))
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert code == 2 and len(err) == 1 and line in err[0], (sweeps, err)
        assert not out.exists() and not list(tmp_path.glob("*.png")), sweeps  # nothing written
