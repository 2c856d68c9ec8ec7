"""Preview a precision schedule without training (``fractune schedule``).

The global cost ratio of docs/methods.md §2: every layer at the schedule's bits,
``mean_t (a*w + g*w + a*g) / (3 * 32 * 32)`` (= ``(a^2 + 2ag) / 3072`` with ``w = a``), against FP32 and
against FW8/BW8 (0.0625). CPT 3->8 / BW8 with ``rint`` gives 0.03958, 36.7% below FW8/BW8. Auto PFQ depends
on the training loss: it is previewed with uniform stages (``deterministic: false``).

``price_schedule`` prices the same series under every cost model (engine/cost_models.py) on the config's own
network, layer map and batch size: each model's total for the run, against the same run at FP32 and at
FW8/BW8 (every iteration a full batch).
"""

from __future__ import annotations

import math
from collections import Counter

from engine.config import ExperimentConfig
from engine.cost import FW8BW8, BitOpsCounter
from engine.data import INFO, run_length
from engine.errors import ConfigError
from engine.precision import FP32, Precision
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
    out["costs"] = price_schedule(cfg, series)
    if not deterministic:
        out["assumes"] = "uniform stages; the loss indicator decides the real switch points at run time"
    return out


def config_counter(cfg: ExperimentConfig) -> BitOpsCounter:
    """The counter a run of ``cfg`` uses (its network's MACs table, layer map and cost models), built on CPU."""
    from engine.models import build_model

    info = INFO[cfg.data.dataset]
    model = build_model(cfg.model.name, info.channels, info.classes)
    model.set_layer_map(cfg.layer_map(stem_default=model.stem_quantized_by_default))
    return BitOpsCounter(model.layer_table((info.channels, info.size, info.size)), model.layer_map, cfg.cost.models())


def price_schedule(cfg: ExperimentConfig, series: list[Precision]) -> dict:
    """Per cost model: the schedule's total over the run, its FP32 and FW8/BW8 references, ratios and savings."""
    counter = config_counter(cfg)
    b, n = cfg.data.batch_size, len(series)
    run: dict[str, float] = {}
    for prec, count in Counter(series).items():
        for name, value in counter.costs(prec, b).items():
            run[name] = run.get(name, 0) + count * value
    fp32, fw8 = counter.costs(FP32, b), counter.costs(FW8BW8, b)
    out = {}
    for model in counter.models:
        name = model.name
        total, f, q = run.get(name, 0), n * fp32[name], n * fw8[name]
        out[name] = {"unit": model.unit, "total": float(total), "fp32": float(f), "fw8bw8": float(q),
                     "ratio_vs_fp32": total / f if f else 0.0, "ratio_vs_fw8bw8": total / q if q else 0.0,
                     "savings_vs_fw8bw8": 1.0 - total / q if q else 0.0}
    return out


def downsample(series: list[Precision], points: int = 4000) -> tuple[list[int], list[int], list[int]]:
    step = max(1, len(series) // points)
    idx = list(range(0, len(series), step))
    return idx, [series[i].act for i in idx], [series[i].grad for i in idx]
