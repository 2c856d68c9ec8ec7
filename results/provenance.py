"""Provenance carried by every run: git sha, package versions, host; a sweep's spec file; paths and tracking URIs
as generated pages name them (relative to the repository, never a path of the machine that made the page)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fractune", "torch", "torchvision", "ray", "mlflow", "optuna", "pydantic")
SPEC_FILE_ENV = "FRACTUNE_SPEC_FILE"  # a submitted sweep's spec file as submitted (its job runs a copy)
SPEC_FOLDERS = ("search_spaces", "docs/studies")  # the presets; the one-off experiment specs behind the notes pages


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
        sha = out.stdout.strip()
        if out.returncode != 0 or not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    out["python"] = platform.python_version()
    return out


def tags() -> dict[str, str]:
    t = {"fractune.git_sha": git_sha(), "fractune.host": platform.node()}
    t.update({f"fractune.version.{k}": v for k, v in versions().items()})
    return t


def spec_file(path: str | Path | None) -> str | None:
    """The spec file a sweep runs, as its parent run records it (param ``spec_file``) and its results page names
    it: relative to the project root when inside it (``docs/studies/X.yaml``), else absolute. A submitted sweep's
    job runs a copy of the spec: the path the submitter gave, passed on in ``FRACTUNE_SPEC_FILE``."""
    if named := os.environ.get(SPEC_FILE_ENV):
        return named
    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    return p.relative_to(PROJECT_ROOT).as_posix() if p.is_relative_to(PROJECT_ROOT) else str(p)


def spec_file_of(name: str, params: dict) -> str | None:
    """The spec file that made the sweep, as its page names it: the parent run's ``spec_file`` param (relative to
    the project root when the spec was inside it); for a sweep that predates the param, the spec of the sweep's
    name in this checkout's ``search_spaces/`` or ``docs/studies/``, said to be found by name; else None."""
    from engine.config.experiment import read_yaml
    from engine.errors import ConfigError

    if recorded := params.get("spec_file"):
        return f"`{shown_path(recorded)}`"
    for folder in SPEC_FOLDERS:
        path = PROJECT_ROOT / folder / f"{name}.yaml"
        try:
            if path.is_file() and read_yaml(path, "spec").get("name") == name:
                return f"`{folder}/{name}.yaml` (found by the sweep's name: the sweep did not record its spec file)"
        except ConfigError:
            continue
    return None


def shown_path(path: str) -> str:
    """A path as a generated page names it: relative to the repository where it lies inside, else its last two
    parts after ``.../``, never a path of the machine the page was made on."""
    if not Path(path).expanduser().is_absolute():
        return path
    full = Path(path).expanduser().resolve()
    try:
        return str(full.relative_to(PROJECT_ROOT))
    except ValueError:
        return ".../" + "/".join(full.parts[-2:])


def shown_uri(uri: str) -> str:
    """A tracking URI as a generated page names it: a sqlite file or a folder by ``shown_path`` (a relative
    sqlite URI, ``sqlite:///fractune_study/fair/mlflow.db``, opens it from the repository's root); a server's
    without its credentials."""
    from results import store

    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            return scheme + shown_path(uri.removeprefix(scheme))
    if "://" not in uri:
        return shown_path(uri)
    return store.redact(uri)
