"""A sweep's checkpoints at every moment a driver could die: the stored experiment state names only checkpoints
that exist, a snapshot taken at the worst moment restores, and finished trials keep only their last checkpoint
(orchestrator.sweep.tune_checkpoints)."""

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from ray import tune

from orchestrator.sweep import tune_checkpoints as checkpoints
from orchestrator.sweep.tune_checkpoints import (
    CheckpointPruner,
    checkpoint_config,
    newest_state,
    stored_latest,
)

EPOCHS = 16


def counting_trainable(config):
    """Reports EPOCHS checkpoints, resuming from the last one it is given."""
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        start = int((Path(ckpt.path) / "epoch").read_text())
    for epoch in range(start + 1, EPOCHS + 1):
        time.sleep(0.1)
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "epoch").write_text(str(epoch))
            tune.report({"epoch": epoch, "resumed_from": start}, checkpoint=tune.Checkpoint.from_directory(d))


class KillPoints(tune.Callback):
    """After each checkpoint registration (where Ray's num_to_keep deletes): what a driver killed now leaves."""

    def __init__(self, moments: list, snapshot: Path):
        self.moments, self.snapshot, self.active = moments, snapshot, True

    def __getstate__(self):  # pickled into tuner.pkl: the restored sweep records nothing
        return {"moments": [], "snapshot": self.snapshot, "active": False}

    def on_trial_save(self, iteration, trials, trial, **info):
        if not self.active:
            return
        exp = Path(trial.storage.experiment_fs_path)
        latest = stored_latest(newest_state(exp))
        if latest is None:  # no state yet, or one being written
            return
        present = {t.trial_id: {c.name for c in Path(t.storage.trial_fs_path).glob("checkpoint_*")}
                   for t in trials if t.storage is not None and Path(t.storage.trial_fs_path).exists()}
        self.moments.append((latest, present))
        halfway = trial.last_result.get("epoch", 0) >= EPOCHS // 2
        if halfway and not self.snapshot.exists():  # the storage as a driver killed here would leave it
            try:
                shutil.copytree(exp, self.snapshot)
            except (OSError, shutil.Error):  # a worker was writing: try at the next registration
                shutil.rmtree(self.snapshot, ignore_errors=True)
                return
            if stored_latest(newest_state(self.snapshot)) is None:
                # the state file was copied while Tune's background sync rewrote it: cut in the copy. The sweep's
                # driver puts back a kept whole copy first (restore_state); this test restores with Tune alone,
                # so it takes the snapshot at the next registration
                shutil.rmtree(self.snapshot, ignore_errors=True)


@pytest.mark.slow
def test_a_driver_killed_at_any_checkpoint_leaves_a_state_that_restores(ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0.3")  # several state saves during the short run
    # the pruner looks every 0.2 s instead of 2 s, so it prunes while the trials run (moments below), however
    # fast they are: at 2 s a run that finished within one period was pruned only at its end, and failed
    monkeypatch.setattr(checkpoints, "CHECK_EVERY_S", 0.2)
    moments: list = []
    snapshot = tmp_path / "killed_halfway"
    tuner = tune.Tuner(counting_trainable, param_space={"x": tune.grid_search([0, 1])},
                       tune_config=tune.TuneConfig(max_concurrent_trials=2),
                       run_config=tune.RunConfig(name="ckpt", storage_path=str(tmp_path / "runs"), verbose=0,
                                                 callbacks=[KillPoints(moments, snapshot), CheckpointPruner()],
                                                 checkpoint_config=checkpoint_config()))
    grid = tuner.fit()
    assert not grid.errors and all(r.metrics["epoch"] == EPOCHS for r in grid)

    assert len(moments) >= EPOCHS
    for latest, present in moments:  # every stored latest checkpoint is on storage
        for trial_id, name in latest.items():
            assert name in present[trial_id], (name, present[trial_id])
    assert any("checkpoint_000000" not in names for _, present in moments for names in present.values())  # pruned

    exp = tmp_path / "runs" / "ckpt"
    for trial_dir in (d for d in exp.iterdir() if d.is_dir()):  # a finished trial keeps its last checkpoint only
        assert [c.name for c in trial_dir.glob("checkpoint_*")] == [f"checkpoint_{EPOCHS - 1:06d}"]
    final = stored_latest(newest_state(exp))
    assert set(final.values()) == {f"checkpoint_{EPOCHS - 1:06d}"}

    assert snapshot.exists()
    killed_at = {trial_id: int(name.split("_")[1]) for trial_id, name in stored_latest(newest_state(snapshot)).items()}
    restored = tune.Tuner.restore(str(snapshot), counting_trainable, resume_unfinished=True, resume_errored=True)
    again = restored.fit()
    assert not again.errors and all(r.metrics["epoch"] == EPOCHS for r in again)
    resumed = {r.metrics["trial_id"]: r.metrics["resumed_from"] for r in again if r.metrics["resumed_from"]}
    assert resumed and all(start == killed_at[tid] + 1 for tid, start in resumed.items())  # from the stored latest


class _TrialWhoseStorageIsGone:
    trial_id = "gone"

    @property
    def run_metadata(self):
        raise FileNotFoundError(2, "No such file or directory", "/shared/runs/gone")


def test_a_pruning_failure_keeps_checkpoints_and_never_ends_the_sweep(capsys):
    pruner = CheckpointPruner()
    for _ in range(3):  # a callback that raised would end the whole sweep
        pruner.on_step_end(iteration=0, trials=[_TrialWhoseStorageIsGone()])
        pruner._next_check = 0.0
    pruner.on_experiment_end(trials=[_TrialWhoseStorageIsGone()])
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["fractune: old trial checkpoints are kept (FileNotFoundError: [Errno 2] No such file or "
                     "directory: '/shared/runs/gone')"]  # once, with the cause
