"""Trial checkpoints that a killed driver can always resume from.

Ray Tune's ``CheckpointConfig(num_to_keep=k)`` deletes a trial's older checkpoints the moment a new one is
registered, while the experiment state that ``Tuner.restore`` reads is written to storage only every 10 s or
more (``TUNE_GLOBAL_CHECKPOINT_S``, "auto"). A driver killed in between leaves a state that names deleted
checkpoints: the restore fails ("does not exist on storage anymore") when the deleted one is a trial's latest,
and otherwise the resumed trial's next registration raises ``FileNotFoundError`` deleting it again.

Sweeps therefore let Ray keep every checkpoint (``num_to_keep=None``: Ray deletes nothing) and
``CheckpointPruner`` deletes a trial's checkpoints only once the experiment state *on storage* names a later one
as that trial's latest. Whenever the driver dies, the state it leaves names checkpoints that exist. A trial holds
its stored-latest checkpoint and the ones written since (those of one state period, usually one or two); a
finished trial keeps only its last. The pruned checkpoints are also dropped from the trial's in-memory list, so
the saved experiment state does not grow with the number of epochs.

Only storage on a local (or mounted shared) file system is pruned; on any other, Ray keeps every checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

from ray import tune

CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)")
STATE_GLOB = "experiment_state-*.json"  # the newest by name is the one Tuner.restore reads
CHECK_EVERY_S = 2.0  # how often the driver looks for a newer stored state (a directory listing)


def checkpoint_config() -> tune.CheckpointConfig:
    """Ray keeps every checkpoint; ``CheckpointPruner`` deletes the ones no stored state needs."""
    return tune.CheckpointConfig(num_to_keep=None)


def newest_state(exp_path: Path) -> Path | None:
    """The experiment state file ``Tuner.restore`` would read (the newest by name), or None."""
    states = sorted(exp_path.glob(STATE_GLOB))
    return states[-1] if states else None


def stored_latest(state_file: Path | None, wanted: set[str] | None = None) -> dict[str, str] | None:
    """Each trial's latest checkpoint folder name in an experiment state file (trial id -> name; only the
    ``wanted`` trials when given); None when there is no state yet or it cannot be read whole (being written):
    nothing may be deleted then."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    if state_file is None:
        return None
    try:
        state = json.loads(state_file.read_text())
        latest = {}
        for trial_json, meta_json in state["trial_data"]:
            meta = json.loads(meta_json)
            if not meta.get("checkpoint_manager"):
                continue
            trial_id = (meta.get("last_result") or {}).get("trial_id") or json.loads(trial_json)["trial_id"]
            if wanted is not None and trial_id not in wanted:
                continue  # only the trials that have something to prune are unpickled
            result = _TrainingRunMetadata.from_json_state(meta_json).checkpoint_manager.latest_checkpoint_result
            if result is not None and result.checkpoint is not None:
                latest[trial_id] = Path(result.checkpoint.path).name
        return latest
    except (OSError, ValueError, KeyError, TypeError, EOFError, AttributeError):
        return None


def checkpoint_index(name: str) -> int | None:
    m = CHECKPOINT_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def older(name: str, keep_from: int) -> bool:
    """A checkpoint folder numbered below ``keep_from`` (anything else is kept)."""
    index = checkpoint_index(name)
    return index is not None and index < keep_from


class CheckpointPruner(tune.Callback):
    """Deletes a trial's checkpoints older than the latest one the stored experiment state names (module doc)."""

    def __init__(self) -> None:
        self._seen: tuple | None = None  # (file, mtime_ns, size) of the last stored state pruned against
        self._next_check = 0.0
        self._warned = False

    def __getstate__(self) -> dict:  # pickled into tuner.pkl: a restored sweep starts afresh
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CHECK_EVERY_S
            self.safe_prune(trials)

    def on_experiment_end(self, trials: list, **info) -> None:
        self.safe_prune(trials)  # after Tune's final forced state save: finished trials keep their last checkpoint

    def safe_prune(self, trials: list) -> None:
        """``prune``, never raising: a pruning problem (storage gone, a file replaced under it) costs disk space,
        not the sweep; it is reported once on stderr."""
        try:
            self.prune(trials)
        except Exception as exc:  # noqa: BLE001 - a callback that raises would end the whole sweep
            if not self._warned:
                self._warned = True
                print(f"fractune: old trial checkpoints are kept ({type(exc).__name__}: {exc})", file=sys.stderr)

    def prune(self, trials: list) -> None:
        from pyarrow.fs import LocalFileSystem

        live = [t for t in trials if len(t.run_metadata.checkpoint_manager._checkpoint_results) > 1]
        if not live or not isinstance(live[0].storage.storage_filesystem, LocalFileSystem):
            return
        state_file = newest_state(Path(live[0].storage.experiment_fs_path))
        if state_file is None:
            return
        stat = state_file.stat()
        signature = (state_file.name, stat.st_mtime_ns, stat.st_size)
        if signature == self._seen:
            return
        latest = stored_latest(state_file, {t.trial_id for t in live})
        if latest is None:
            return
        self._seen = signature
        for trial in live:
            keep_from = checkpoint_index(latest.get(trial.trial_id, ""))
            if keep_from is not None:
                self.prune_trial(trial, keep_from)

    @staticmethod
    def prune_trial(trial, keep_from: int) -> None:
        """Delete the trial's checkpoint folders numbered below ``keep_from`` and drop them from its list."""
        trial_dir = Path(trial.storage.trial_fs_path)
        for child in trial_dir.glob("checkpoint_*"):
            if older(child.name, keep_from):
                shutil.rmtree(child, ignore_errors=True)
        manager = trial.run_metadata.checkpoint_manager
        kept = [r for r in manager._checkpoint_results if not older(Path(r.checkpoint.path).name, keep_from)]
        if len(kept) != len(manager._checkpoint_results):
            manager._checkpoint_results = kept
            trial.run_metadata.invalidate_cache()
