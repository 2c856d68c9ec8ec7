"""Preview a precision schedule without training (``fractune schedule``).

The global cost ratio of docs/methods.md §2: every layer at the schedule's bits,
``mean_t (a*w + g*w + a*g) / (3 * 32 * 32)`` (= ``(a^2 + 2ag) / 3072`` with ``w = a``), against FP32 and
against FW8/BW8 (0.0625). CPT 3->8 / BW8 with ``rint`` gives 0.03958, 36.7% below FW8/BW8. Auto PFQ depends
on the training loss: it is previewed with uniform stages (``deterministic: false``).

``price_schedule`` prices the same series under every cost model (engine/cost/cost_models.py) on the config's own
network, layer map and batch size: each model's total for the run, against the same run at FP32 and at
FW8/BW8 (every iteration a full batch).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

from engine.config.experiment import ExperimentConfig
from engine.cost.bitops import FW8BW8, BitOpsCounter
from engine.data.catalog import INFO
from engine.errors import ConfigError
from engine.numerics.precision import FP32, Precision
from engine.schedules.curves import build_schedule

FW8BW8_RATIO = 192 / 3072


EXACT_UP_TO = 500_000  # iterations previewed one by one; longer runs are previewed on this many evenly spaced ones


def schedule_of(cfg: ExperimentConfig):
    """The schedule to preview, its iteration count and whether the preview is exact (auto PFQ: uniform stages)."""
    sched = cfg.schedule
    if sched.gated:  # no precision schedule to preview: the gate picks each input's bits (§6)
        raise ConfigError.single("schedule.kind", sched.kind, "DFQ's and FracTrain's precision is chosen per input "
                                 "by the gate while training, so it has no schedule to preview (their cost is "
                                 "steered to schedule.target_cp); allowed: fp32, static, pfq, cpt")
    run = cfg.run_length()
    deterministic = True
    if sched.kind == "pfq" and sched.mode == "auto":
        sched = sched.model_copy(update={"mode": "manual", "switch_at": None})
        deterministic = False
    if sched.kind == "cpt" and sched.fw_min == "auto":
        raise ConfigError.single("schedule.fw_min", "auto", "chosen by the precision range test at run time; "
                                 "run `fractune prt CONFIG` first and preview with its fw_min")
    return build_schedule(sched, run), run.total_iterations, deterministic


def sample_points(n: int, points: int) -> Iterator[int]:
    """Every iteration when ``n <= points``, else ``points`` evenly spaced ones; a generator (constant memory)."""
    if n <= points:
        return iter(range(n))
    return ((2 * i + 1) * n // (2 * points) for i in range(points))


def precision_series(cfg: ExperimentConfig, points: int | None = None) -> tuple[list[tuple[int, Precision]], bool]:
    """(iteration, precision) at every iteration, or at ``points`` evenly spaced ones for a plot."""
    schedule, n, deterministic = schedule_of(cfg)
    return [(t, schedule.precision(t)) for t in sample_points(n, points or n)], deterministic


def preview(cfg: ExperimentConfig) -> dict:
    """Streams the schedule in constant memory (a count per distinct precision); runs longer than
    ``EXACT_UP_TO`` iterations are averaged over that many evenly spaced iterations (``sampled``)."""
    schedule, n, deterministic = schedule_of(cfg)
    m = min(n, EXACT_UP_TO)
    counts: Counter = Counter(schedule.precision(t) for t in sample_points(n, EXACT_UP_TO))
    ratio = math.fsum(p.relative_cost() * c for p, c in counts.items()) / m
    fw: Counter = Counter()
    bw: Counter = Counter()
    for p, c in counts.items():
        fw[p.act] += c
        bw[p.grad] += c
    out = {
        "name": cfg.name,
        "kind": cfg.schedule.kind,
        "iterations": n,
        "deterministic": deterministic,
        "mean_fw_bits": math.fsum(p.act * c for p, c in counts.items()) / m,
        "mean_bw_bits": math.fsum(p.grad * c for p, c in counts.items()) / m,
        "mean_weight_bits": math.fsum(p.weight * c for p, c in counts.items()) / m,
        "cost_ratio_vs_fp32": ratio,
        "cost_ratio_vs_fw8bw8": ratio / FW8BW8_RATIO,
        "savings_vs_fw8bw8": 1.0 - ratio / FW8BW8_RATIO,
        "fw_occupancy": {str(k): v / m for k, v in sorted(fw.items())},
        "bw_occupancy": {str(k): v / m for k, v in sorted(bw.items())},
    }
    out["costs"] = price_schedule(cfg, counts, n, m)
    if m < n:
        out["sampled"] = f"{m} evenly spaced iterations of {n}"
    if not deterministic:
        out["assumes"] = "uniform stages; the loss indicator decides the real switch points at run time"
    return out


def output_classes(cfg: ExperimentConfig) -> int:
    """The output layer's width: the data set's classes, or a language model's released vocabulary capped by
    ``data.vocab_size``."""
    info = INFO[cfg.data.dataset]
    if info.is_text and cfg.data.vocab_size is not None:
        return min(info.classes, cfg.data.vocab_size)
    return info.classes


def config_counter(cfg: ExperimentConfig) -> BitOpsCounter:
    """The counter a run of ``cfg`` uses (its network's MACs table, layer map and cost models), built on CPU."""
    import torch

    from engine.models import build_model, is_language_model

    info = INFO[cfg.data.dataset]
    # a language model's table is analytic: built on the meta device (no weights allocated)
    with torch.device("meta" if is_language_model(cfg.model.name) else "cpu"):
        model = build_model(cfg.model.name, info.channels, output_classes(cfg))
    model.set_layer_map(cfg.layer_map_of(model))
    return BitOpsCounter(model.layer_table(info.input_shape(cfg.data.seq_len)), model.layer_map, cfg.cost.models())


def price_schedule(cfg: ExperimentConfig, counts: Counter, n: int, m: int) -> dict:
    """Per cost model: the schedule's total over the run (``counts`` of each precision over ``m`` of the ``n``
    iterations, scaled to ``n``), its FP32 and FW8/BW8 references, ratios and savings."""
    counter = config_counter(cfg)
    b = cfg.data.batch_size * (cfg.data.seq_len if INFO[cfg.data.dataset].is_text else 1)  # LM: tokens
    run: dict[str, float] = {}
    for prec, count in counts.items():
        for name, value in counter.costs(prec, b).items():
            run[name] = run.get(name, 0) + count * value * n / m
    fp32, fw8 = counter.costs(FP32, b), counter.costs(FW8BW8, b)
    out = {}
    for model in counter.models:
        name = model.name
        total, f, q = run.get(name, 0), n * fp32[name], n * fw8[name]
        out[name] = {"unit": model.unit, "total": float(total), "fp32": float(f), "fw8bw8": float(q),
                     "ratio_vs_fp32": total / f if f else 0.0, "ratio_vs_fw8bw8": total / q if q else 0.0,
                     "savings_vs_fw8bw8": 1.0 - total / q if q else 0.0}
    return out

