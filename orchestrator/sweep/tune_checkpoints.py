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

Tune copies its experiment state to storage without a temporary name, so a disk that fills or turns read-only
during a copy leaves a cut file that no restore can read. ``StateKeeper`` therefore keeps the last complete copies
of Tune's state files in ``.fractune-state/`` beside the experiment, and ``restore_state`` puts them back before
a resume where the stored ones are cut or missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from ray import tune

from engine.errors import ConfigError
from results.output import write_atomic

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


# -- the experiment state, kept whole -----------------------------------------------------------------------
KEPT = ".fractune-state"  # beside the experiment: the last complete copies of Tune's state files
KEEP_GENERATIONS = 2
OWN_FILES = {"pareto.json", "fractune_tracking.json", ".fractune.lock", "stages.json", "fractune.log"}


def state_files(exp_path: Path) -> list[Path]:
    """Tune's files a restore reads, directly in the experiment folder: ``tuner.pkl``, the experiment state,
    the searcher's and the callbacks' state (everything there but fractune's own files)."""
    return sorted(p for p in exp_path.iterdir() if p.is_file() and p.name not in OWN_FILES
                  and not p.name.startswith("."))


def whole(path: Path) -> bool:
    """Whether a state file reads to its end: a pickle (whatever its name: Tune's searcher state is a pickle
    named .json) that ends with its STOP opcode, anything else JSON that parses. A file cut by a full disk
    fails; nothing is unpickled to tell."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if data[:1] == b"\x80":  # pickle protocol 2 and later
        return data[-1:] == b"."
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def keep_state(exp_path: Path) -> Path | None:
    """Copy Tune's state files, when every one is whole, to a new generation under ``.fractune-state`` (each file
    through a temporary name, the generation marked complete last); the older generations beyond
    ``KEEP_GENERATIONS`` go. Returns the generation, or None when a file was not whole (nothing changes)."""
    files = state_files(exp_path)
    if not any(CHECKPOINT_STATE.fullmatch(p.name) for p in files) or not all(whole(p) for p in files):
        return None
    root = exp_path / KEPT
    done = complete_generations(root)
    if root.is_dir():  # a copy a full disk cut short: never complete, never read
        for stale in (p for p in root.iterdir() if p.is_dir() and p not in done):
            shutil.rmtree(stale, ignore_errors=True)
    gen = root / f"{(int(done[-1].name) + 1) if done else 1:08d}"
    gen.mkdir(parents=True, exist_ok=True)
    for p in files:
        durable_copy(p, gen / p.name)
    write_atomic(gen / "COMPLETE", "\n".join(p.name for p in files))
    _sync_dir(gen)
    _sync_dir(root)
    for old in complete_generations(root)[:-KEEP_GENERATIONS]:
        shutil.rmtree(old, ignore_errors=True)
    return gen


CHECKPOINT_STATE = re.compile(r"experiment_state-.*\.json")


def durable_copy(src: Path, dst: Path) -> None:
    write_atomic(dst, src.read_bytes())


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_generations(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit() and (p / "COMPLETE").is_file())


def restore_state(exp_path: Path) -> str | None:
    """Before ``Tuner.restore``: where a state file Tune would read is missing or cut (a disk that filled while
    Tune copied it), put back the last complete generation's copies. Returns a line saying what was restored,
    or None when the state on storage is whole (or there is no copy to take)."""
    if not exp_path.is_dir():
        return None
    files = state_files(exp_path)
    broken = [p.name for p in files if not whole(p)]
    has_state = any(CHECKPOINT_STATE.fullmatch(p.name) for p in files)
    if not broken and has_state and (exp_path / "tuner.pkl").is_file():
        return None
    gens = [g for g in complete_generations(exp_path / KEPT) if _whole_generation(g)]
    if not gens:
        return None
    gen = gens[-1]
    for name in (gen / "COMPLETE").read_text().split():
        durable_copy(gen / name, exp_path / name)
    for name in broken:  # a newer state file of another session, cut: it would shadow the restored one
        if not (gen / name).is_file():
            (exp_path / name).unlink(missing_ok=True)
    what = ", ".join(broken) or "missing state files"
    return f"the sweep's state on storage was incomplete ({what}); restored its last complete copy ({gen.name})"


def _whole_generation(gen: Path) -> bool:
    """A kept generation every file of which is whole (a disk error can cut even a synced copy's neighbours)."""
    try:
        names = (gen / "COMPLETE").read_text().split()
    except OSError:
        return False
    return bool(names) and all(whole(gen / name) for name in names)


class StateKeeper(tune.Callback):
    """Keeps the last complete copies of Tune's state files beside the experiment (``keep_state``) whenever the
    stored experiment state changes, so that a disk that fills or turns read-only while Tune copies its state
    never leaves a sweep that cannot resume (``restore_state``)."""

    def __init__(self, exp_path: str) -> None:
        self.exp_path = Path(exp_path)
        self._seen: tuple | None = None
        self._next_check = 0.0

    def __getstate__(self) -> dict:
        return {"exp_path": str(self.exp_path)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["exp_path"])

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CHECK_EVERY_S
            self.safe_keep()

    def on_experiment_end(self, trials: list, **info) -> None:
        self.safe_keep()

    def safe_keep(self) -> None:
        """``keep_state`` when the stored state changed; a storage error keeps the previous copy (never raises)."""
        try:
            state = newest_state(self.exp_path)
            if state is None:
                return
            st = state.stat()
            signature = (state.name, st.st_mtime_ns, st.st_size)
            if signature != self._seen and keep_state(self.exp_path) is not None:
                self._seen = signature
        except OSError:  # full or read-only: the last complete copy stays as it is
            pass


def restored_tuner(path: Path, trainable, field_value: str):
    """``Tuner.restore`` of the sweep (or stage) at ``path``; a ``tuner.pkl`` that cannot be read back (cut,
    overwritten, from another Ray) is one line naming ``--resume``, not a traceback."""
    try:
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
    except Exception as exc:  # unpickling raises whatever the damaged bytes lead to
        raise ConfigError.single("--resume", field_value, f"allowed: a sweep folder Ray Tune can restore, not {path} ("
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'unreadable'})") from None
