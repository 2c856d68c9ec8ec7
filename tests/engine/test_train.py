"""The training loop end to end on the tiny digits set: learning, BitOPs totals, repeatability, exact resume."""

from __future__ import annotations

import math

import pytest
import torch

from engine import checkpoint
from engine.config.experiment import parse_config
from engine.errors import CheckpointError
from engine.optim import lr_at
from engine.train import train_and_evaluate

BASE = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 3}}


def cfg_with(**schedule):
    return parse_config({**BASE, "schedule": schedule or {"kind": "fp32"}})


def test_learns_and_counts_bitops():
    result = train_and_evaluate(cfg_with(kind="static", fw=8, bw=8))
    m = result.metrics
    assert m["accuracy"] > 0.6 and m["epochs"] == 3 and len(result.history) == 3
    assert m["iterations"] == 3 * math.ceil(1293 / 64)
    # every layer of the static map at 8/8 except the fp32 FC: savings just under 0.9375
    assert 0.93 < m["savings_vs_fp32"] < 0.9375
    assert m["train_bitops"] == m["fw8bw8_bitops"] and m["savings_vs_fw8bw8"] == 0.0
    assert m["cp"] == pytest.approx(100 * (1 - m["savings_vs_fp32"]))
    cum = [h["cum_gbitops"] for h in result.history]
    assert cum == sorted(cum) and cum[-1] == pytest.approx(m["train_bitops"] / 1e9)
    assert {h["fw_bits"] for h in result.history} == {8.0}


def test_fp32_run_costs_the_fp32_reference():
    m = train_and_evaluate(parse_config({**BASE, "optim": {"epochs": 1}})).metrics
    assert m["train_bitops"] == m["fp32_bitops"] and m["savings_vs_fp32"] == 0.0 and m["cp"] == 100.0
    assert m["savings_vs_fw8bw8"] < 0  # fp32 costs 16x FW8/BW8


@pytest.mark.slow
def test_same_seed_same_run_and_other_seed_differs():
    a = train_and_evaluate(cfg_with(kind="static", fw=4, bw=8)).history
    b = train_and_evaluate(cfg_with(kind="static", fw=4, bw=8)).history
    assert [h["loss"] for h in a] == [h["loss"] for h in b]
    c = train_and_evaluate(parse_config({**BASE, "seed": 1, "schedule": {"kind": "static", "fw": 4, "bw": 8}})).history
    assert [h["loss"] for h in a] != [h["loss"] for h in c]


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    cfg = cfg_with(kind="static", fw=4, bw=6)
    saved = {}

    def report(metrics, save):
        saved[metrics["epoch"]] = save(tmp_path / f"epoch{metrics['epoch']}")

    full = train_and_evaluate(cfg, report=report)
    resumed = train_and_evaluate(cfg, resume_from=tmp_path / "epoch1")
    assert len(resumed.history) == 3
    for key in ("loss", "accuracy", "val_accuracy", "cum_gbitops"):
        assert [h[key] for h in resumed.history] == [h[key] for h in full.history], key
    assert resumed.metrics["train_bitops"] == full.metrics["train_bitops"]


def test_resume_refuses_another_config(tmp_path):
    cfg = parse_config({**BASE, "optim": {"epochs": 1}})
    train_and_evaluate(cfg, report=lambda m, save: save(tmp_path))
    other = parse_config({**BASE, "optim": {"epochs": 2}})
    with pytest.raises(CheckpointError, match="different configuration"):
        train_and_evaluate(other, resume_from=tmp_path)


def test_checkpoints_load_weights_only(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    torch.save({"format": 1, "x": Evil()}, tmp_path / "state.pt")
    with pytest.raises(CheckpointError, match="refused \\(loading it could run code\\)"):
        checkpoint.load(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nowhere")


@pytest.mark.parametrize("damage", ["truncated", "flipped bytes", "garbage", "empty"])
def test_a_damaged_checkpoint_is_named_damaged_not_foreign(tmp_path, damage):
    """Corruption on disk is "damaged"; only a file that asks for code is "objects other than tensors"."""
    cfg = parse_config({**BASE, "optim": {"epochs": 1}})
    train_and_evaluate(cfg, report=lambda m, save: save(tmp_path))
    path = tmp_path / checkpoint.FILENAME
    data = path.read_bytes()
    broken = {"truncated": data[: len(data) // 2], "flipped bytes": data[:200] + bytes(b ^ 0xFF for b in data[200:260])
              + data[260:], "garbage": bytes(range(256)) * 4, "empty": b""}[damage]
    path.write_bytes(broken)
    with pytest.raises(CheckpointError, match="is damaged") as err:
        checkpoint.load(tmp_path)
    assert "could run code" not in str(err.value) and "\n" not in str(err.value)


def test_lr_schedules():
    piece = parse_config({"optim": {"epochs": 1, "lr": 0.1, "milestones": [0.5, 0.75]}})
    assert [lr_at(piece, i, 100) for i in (0, 49, 50, 74, 75, 99)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    cos = parse_config({"optim": {"lr_schedule": "cosine", "lr": 0.2, "warmup_iters": 10, "warmup_lr": 0.01}})
    assert lr_at(cos, 5, 100) == 0.01
    # from lr to lr * lr_floor (0.01 unless set, the reference's anneal_cosine)
    assert lr_at(cos, 50, 100) == pytest.approx(0.101)
    assert lr_at(cos, 100, 100) == pytest.approx(0.002)
    to_zero = parse_config({"optim": {"lr_schedule": "cosine", "lr": 0.2, "lr_floor": 0.0}})
    assert [lr_at(to_zero, i, 100) for i in (0, 50, 100)] == pytest.approx([0.2, 0.1, 0.0])


def test_iteration_budget_overrides_epochs():
    cfg = parse_config({**BASE, "optim": {"epochs": 1, "iterations": 30}})
    m = train_and_evaluate(cfg).metrics
    assert m["iterations"] == 30 and m["epochs"] == 2  # 21 iterations per epoch


def test_a_run_sleeps_per_iteration_only_while_its_sleep_while_file_exists(tmp_path, monkeypatch):
    """``debug.sleep_while``: a fault test's run is slow until the test removes the file, then runs at full speed
    (here the file goes after the fifth sleep; without the option every iteration sleeps)."""
    import engine.train

    gate = tmp_path / "pace"
    slept = []

    def sleep(seconds):  # time.sleep itself (the module's attribute): only the run's own sleeps of 0.5 s count
        if seconds == 0.5:
            slept.append(seconds)
        if len(slept) == 5:
            gate.unlink(missing_ok=True)

    monkeypatch.setattr(engine.train.time, "sleep", sleep)
    one_epoch = {**BASE, "data": {**BASE["data"], "train_subset": 640}, "optim": {"epochs": 1}}  # 10 iterations
    gate.touch()
    m = train_and_evaluate(parse_config({**one_epoch, "debug": {"sleep_per_iteration": 0.5,
                                                                "sleep_while": str(gate)}})).metrics
    assert slept == [0.5] * 5 and m["iterations"] > 5
    slept.clear()
    train_and_evaluate(parse_config({**one_epoch, "debug": {"sleep_per_iteration": 0.5}}))
    assert len(slept) == m["iterations"]
