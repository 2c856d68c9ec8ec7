"""``run_sweep``: one sweep from its spec, plain (``orchestrator.sweep.driver``) or staged (``orchestrator.sweep.stages``).

Both kinds start the same way (``sweep.start_sweep``: the tracking store checked, Ray up, the sweep id claimed and
its folder locked) and run with Ray Tune's and MLflow's log lines in the sweep's ``fractune.log``
(``sweep.quiet_logs``); the lock is given up when the sweep ends, however it ends.
"""

from __future__ import annotations

import os

from orchestrator.sweep.driver import SweepOptions, quiet_logs, run_plain, start_sweep
from orchestrator.sweep.lifecycle import release_sweep
from orchestrator.sweep.stages import run_staged
from search_spaces.spec import LoadedSpec


def run_sweep(loaded: LoadedSpec, opts: SweepOptions) -> dict:
    """Run the sweep ``loaded`` describes with ``opts``; returns its outcome (``sweep.finish``)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Ray's own tables: fractune prints its progress itself
    uri, root, sweep_id, trainable, init_runs = start_sweep(loaded, opts)
    body = run_staged if loaded.stages else run_plain
    try:
        with quiet_logs(root / sweep_id, opts.verbose) as log_file:
            out = body(loaded, opts, uri, root, sweep_id, trainable, init_runs)
    finally:
        release_sweep(root / sweep_id)
    out["log"] = str(log_file) if log_file else None
    return out
