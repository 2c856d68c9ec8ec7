"""Preview a precision schedule without training (``fractune schedule``).

The global cost ratio of docs/methods.md §2: every layer at the schedule's bits,
``mean_t (a*w + g*w + a*g) / (3 * 32 * 32)`` (= ``(a^2 + 2ag) / 3072`` with ``w = a``), against FP32 and
against FW8/BW8 (0.0625). CPT 3->8 / BW8 with ``rint`` gives 0.03958, 36.7% below FW8/BW8. Auto PFQ depends
on the training loss: it is previewed with uniform stages (``deterministic: false``).
"""

from __future__ import annotations

import math
from collections import Counter

from engine.config import ExperimentConfig
from engine.data import run_length
from engine.errors import ConfigError
from engine.precision import Precision
from engine.schedules import build_schedule

FW8BW8_RATIO = 192 / 3072


def precision_series(cfg: ExperimentConfig) -> tuple[list[Precision], bool]:
    run = run_length(cfg)
    sched = cfg.schedule
    deterministic = True
    if sched.kind == "pfq" and sched.mode == "auto":
        sched = sched.model_copy(update={"mode": "manual", "switch_at": None})
        deterministic = False
    if sched.kind == "cpt" and sched.fw_min == "auto":
        raise ConfigError.single("schedule.fw_min", "auto", "chosen by the precision range test at run time; "
                                 "run `fractune prt CONFIG` first and preview with its fw_min")
    schedule = build_schedule(sched, run)
    return [schedule.precision(t) for t in range(run.total_iterations)], deterministic


def preview(cfg: ExperimentConfig) -> dict:
    series, deterministic = precision_series(cfg)
    n = len(series)
    ratio = math.fsum(p.relative_cost() for p in series) / n
    fw = Counter(p.act for p in series)
    bw = Counter(p.grad for p in series)
    out = {
        "name": cfg.name,
        "kind": cfg.schedule.kind,
        "iterations": n,
        "deterministic": deterministic,
        "mean_fw_bits": math.fsum(p.act for p in series) / n,
        "mean_bw_bits": math.fsum(p.grad for p in series) / n,
        "mean_weight_bits": math.fsum(p.weight for p in series) / n,
        "cost_ratio_vs_fp32": ratio,
        "cost_ratio_vs_fw8bw8": ratio / FW8BW8_RATIO,
        "savings_vs_fw8bw8": 1.0 - ratio / FW8BW8_RATIO,
        "fw_occupancy": {str(k): v / n for k, v in sorted(fw.items())},
        "bw_occupancy": {str(k): v / n for k, v in sorted(bw.items())},
    }
    if not deterministic:
        out["assumes"] = "uniform stages; the loss indicator decides the real switch points at run time"
    return out


def downsample(series: list[Precision], points: int = 4000) -> tuple[list[int], list[int], list[int]]:
    step = max(1, len(series) // points)
    idx = list(range(0, len(series), step))
    return idx, [series[i].act for i in idx], [series[i].grad for i in idx]
