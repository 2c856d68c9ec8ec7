"""Read a sweep back from MLflow for the reports: its trial rows (``results.runs``, the loader every reader
uses), the ablation design, metric histories, JSON artifacts and DFQ bit allocations.

Read-only: nothing here writes to the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from results import runs, store
from results.store import artifact_json


@dataclass
class SweepData(runs.SweepRuns):
    meta: dict | None = None  # ablation.json of an ablation sweep


def load_sweep(uri: str, name: str, sweep_id: str | None = None) -> SweepData:
    """The sweep's rows (``results.runs.load``) and, for an ablation, its design."""
    loaded = runs.load(uri, name, sweep_id)
    return SweepData(**vars(loaded), meta=artifact_json(loaded.client, loaded.parent_run_id, "ablation.json"))


def histories(c, run_id: str, keys: tuple[str, ...] | list[str]) -> dict[str, list[tuple[int, float]]]:
    """Per-epoch histories ``[(step, value)]`` of the keys the run logged (others are left out)."""
    logged = set(c.get_run(run_id).data.metrics)
    out = {}
    for key in keys:
        if key in logged:
            out[key] = sorted((m.step, store.stored(m.value)) for m in c.get_metric_history(run_id, key))
    return out


def bit_allocation(c, run: dict) -> dict | None:
    """A gated run's mean forward bits per block (rows) and epoch (columns), with the options' names.

    From ``bit_allocation.json`` (per epoch: options, fractions, mean_fw_bits, mean_bw_bits); else from the
    ``alloc_fw_bNN`` metric histories."""
    alloc = artifact_json(c, run["run_id"], "bit_allocation.json")
    if alloc:
        epochs = sorted(alloc, key=int)
        fw = [alloc[e]["mean_fw_bits"] for e in epochs]
        bw = [alloc[e]["mean_bw_bits"] for e in epochs]
        return {"epochs": [int(e) for e in epochs], "fw": [list(x) for x in zip(*fw)],
                "bw": [list(x) for x in zip(*bw)], "options": alloc[epochs[-1]].get("options")}
    metrics = sorted(k for k in c.get_run(run["run_id"]).data.metrics if k.startswith("alloc_fw_b"))
    if not metrics:
        return None
    hist = histories(c, run["run_id"], metrics)
    epochs = [s for s, _ in hist[metrics[0]]]
    bw_keys = [k.replace("alloc_fw_", "alloc_bw_") for k in metrics]
    bw_hist = histories(c, run["run_id"], bw_keys)
    return {"epochs": epochs, "fw": [[v for _, v in hist[k]] for k in metrics],
            "bw": [[v for _, v in bw_hist.get(k, [])] for k in bw_keys], "options": None}
