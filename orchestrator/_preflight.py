"""Every check of a sweep before anything is created or Ray starts (``load_for_cluster``), all problems
together; the API's ``sweep``, ``ablate`` and ``validate`` call it. Private: ``orchestrator.api`` is the public
surface."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError

if TYPE_CHECKING:

    from search_spaces.spec import LoadedSpec


PathLike = str | os.PathLike


def load_for_cluster(spec: PathLike | Mapping[str, Any], address: str | None, dashboard: bool = False,
                     ablation: bool = False, tracking_uri: str | None = None, storage: str | None = None,
                     resume: bool = False, outputs: dict[str, str | None] | None = None) -> tuple[LoadedSpec, str]:
    """Everything a sweep needs checked before anything is created or started, every problem reported
    together: the spec (no Ray), the tracking URI and store (nothing created), the storage folder (not
    created), the output folders, the Ray address, and the spec's resources (against a Ray already running in
    this process, else against this machine for a local Ray, which is not started for it); then Ray starts or
    attaches and the resources are checked against it. Returns the loaded spec and the normalised tracking URI."""
    from pydantic import ValidationError

    from engine.config.experiment import read_yaml
    from orchestrator.sweep.ray_cluster import (
        attaches,
        check_local_resources,
        check_ray_address,
        check_resources,
        init_ray,
    )
    from orchestrator.sweep.storage import storage_root
    from results import store, store_checks
    from results.output import check_output_folder
    from search_spaces.ablation import load_ablation, parse_ablation
    from search_spaces.schema import Resources
    from search_spaces.spec import load_spec, parse_spec

    problems = []

    def gather(check, *a, **kw):
        try:
            return check(*a, **kw)
        except ConfigError as err:
            problems.extend((f"{err.source}: {f}" if err.source else f, v, m) for f, v, m in err.problems)
            return None

    if isinstance(spec, Mapping):
        tree = copy.deepcopy(dict(spec))
        loaded = gather(parse_ablation if ablation else parse_spec, copy.deepcopy(tree))
    else:
        tree = None
        loaded = gather(load_ablation if ablation else load_spec, spec)
    if loaded is not None and hasattr(loaded, "base_trial"):  # the data every trial reads: damaged files exit 2 here
        from engine.data.files import check_available

        gather(check_available, trial_data(loaded), here=not attaches(address))
    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    gather(store_checks.preflight, uri, mode="check")
    root = gather(storage_root, storage, create=False)
    if resume and root is not None and loaded is not None:
        from orchestrator.sweep.lifecycle import check_resume_store
        from orchestrator.sweep.storage import latest_sweep_id

        sweep_id = gather(latest_sweep_id, root, loaded.name)
        if sweep_id is not None and not any(field == "--tracking-uri" for field, _, _ in problems):
            gather(check_resume_store, uri, root / sweep_id, sweep_id)
    for field, value in (outputs or {}).items():
        if value:
            gather(check_output_folder, field, value)
    gather(check_ray_address, address)
    try:
        res = Resources.model_validate((tree if tree is not None else read_yaml(spec)).get("resources") or {})
    except (ValidationError, ConfigError, AttributeError):
        res = None
    ray_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    if res is not None and (ray_up or not attaches(address)):
        # reported with the spec's other errors: against the running Ray, or against what a local Ray would
        # get (this machine's CPUs and GPUs) without starting one; a cluster (--address, or the RAY_ADDRESS a
        # Ray job's driver is given) is asked once attached, below, never this machine
        gather(check_resources if ray_up else check_local_resources, res.cpu, res.gpu, res.workers)
    if problems:
        raise ConfigError(problems)
    if res is not None and not ray_up:
        init_ray(address, dashboard)
        try:
            check_resources(res.cpu, res.gpu, res.workers)
        except ConfigError as err:
            raise ConfigError(err.problems, None if tree is not None else str(spec)) from None
    return loaded, uri


def trial_data(loaded):
    """The data config of the spec's base trial (what its trials train on)."""
    from search_spaces import trial

    return trial.decode(loaded.base_trial()).data
