"""What the API's functions take in, made ready: a config from a file, a mapping or a config; a file of any kind
(``validate``); a sweep given by name or by its result; the checkpoint ``--resume`` names."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ConfigError
from orchestrator._result_types import SweepResult

if TYPE_CHECKING:
    from engine.config.experiment import ExperimentConfig

PathLike = str | os.PathLike


def experiment_config(config, overrides: Sequence[str], data_dir: str | None) -> ExperimentConfig:
    """The validated experiment config of a file, a mapping or a config, with the overrides applied."""
    from engine.config.experiment import ExperimentConfig, apply_overrides, load_config, parse_config
    from engine.config.sections import check_path

    overrides = list(overrides)
    if data_dir is not None:  # checked naming the flag, then an override of data.data_dir
        check_path("--data-dir", data_dir)
        overrides.append(f"data.data_dir={data_dir}")
    if isinstance(config, ExperimentConfig):
        return parse_config(apply_overrides(config.model_dump(mode="json"), overrides)) if overrides else config
    if isinstance(config, Mapping):
        return parse_config(apply_overrides(copy.deepcopy(dict(config)), overrides))
    return load_config(config, overrides)


def check_resume(path: str) -> None:
    """``--resume``: a checkpoint folder written by ``--checkpoint-dir`` (or its state.pt)."""
    import stat

    from engine.checkpoint import FILENAME

    p = Path(path)
    state = p / FILENAME if p.is_dir() else p
    try:
        ok = stat.S_ISREG(state.stat().st_mode)
    except OSError:
        ok = False
    if not ok:
        raise ConfigError.single("--resume", path, f"allowed: a checkpoint folder written by --checkpoint-dir "
                                 f"(holding {FILENAME})")


def check_not_overwritten(checkpoint_dir: str, resume: str | None) -> None:
    """``--checkpoint-dir``: a run writes its state there after every epoch, so a folder that already holds
    another run's checkpoint is refused, unless it is the one the run resumes from (it carries that run on)."""
    from engine.checkpoint import FILENAME

    folder = Path(checkpoint_dir)
    if not (folder / FILENAME).exists():
        return
    if resume is not None:
        source = Path(resume)
        source = source.parent if source.name == FILENAME and not source.is_dir() else source
        if source.resolve() == folder.resolve():
            return
    raise ConfigError.single("--checkpoint-dir", checkpoint_dir, f"allowed: a folder without a checkpoint, or the "
                             f"one --resume continues; this one holds a run's {FILENAME}, which training would "
                             "overwrite")


def where(sweep: str | SweepResult, sweep_id: str | None, tracking_uri: str | None) -> tuple[str, str | None, str]:
    """(name, sweep id, normalised tracking URI) of a sweep given by name or by its ``SweepResult``."""
    from results import store

    if isinstance(sweep, SweepResult):
        return sweep.sweep, sweep_id or sweep.sweep_id, store.normalise_uri(tracking_uri or sweep._uri
                                                                            or sweep.tracking_uri)
    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    return sweep, sweep_id, uri


def load_any(path: PathLike):
    """An ablation spec (has ``ablation``), a sweep spec (``parameters``/``base``/``search``...) or an
    experiment config."""
    from engine.config.experiment import load_config, read_yaml
    from search_spaces.ablation import load_ablation
    from search_spaces.spec import load_spec

    tree = read_yaml(path)
    if "ablation" in tree:
        return "ablation", load_ablation(path)
    if any(k in tree for k in ("parameters", "base", "search", "seeds", "budget", "resources", "stages")):
        return "spec", load_spec(path)
    return "config", load_config(path)
