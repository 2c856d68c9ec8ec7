"""Where a restored trial continues (``trainables.tune_trainable.resume_point``), on real checkpoints written by
the engine: the furthest readable one of the trial's checkpoints, a damaged one passed over and named, the epochs
Tune's own checkpoint had not seen reported again, and a finished run not trained again."""

from __future__ import annotations

from engine import checkpoint
from engine.config.experiment import parse_config
from engine.train import train_and_evaluate
from trainables.tune_trainable import finished, resume_point

BASE = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 3}}


def _trial_dir(tmp_path):
    cfg = parse_config(BASE)
    train_and_evaluate(cfg, report=lambda m, save: save(tmp_path / f"checkpoint_{m['epoch'] - 1:06d}"))
    return cfg, tmp_path


def test_the_furthest_readable_checkpoint_wins_and_a_damaged_one_is_passed_over(tmp_path, capsys):
    cfg, trial = _trial_dir(tmp_path)
    path, state, seen = resume_point(trial / "checkpoint_000000")  # Tune's state lagged two epochs behind
    assert path.name == "checkpoint_000002" and seen == 1 and finished(cfg, state)
    assert [h["epoch"] for h in state["history"] if h["epoch"] > seen] == [2, 3]  # reported again, not retrained
    (trial / "checkpoint_000002" / checkpoint.FILENAME).write_bytes(b"\x00" * 100)
    path, state, seen = resume_point(trial / "checkpoint_000002")  # Tune's own is the damaged one
    err = capsys.readouterr().err
    assert path.name == "checkpoint_000001" and seen == 0 and not finished(cfg, state)
    assert "checkpoint_000002/state.pt is damaged" in err and "passed over" in err
    for name in ("checkpoint_000000", "checkpoint_000001"):
        (trial / name / checkpoint.FILENAME).write_bytes(b"")
    assert resume_point(trial / "checkpoint_000001") is None  # none readable: the trial starts over
