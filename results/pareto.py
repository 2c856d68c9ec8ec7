"""Pareto selection of (final accuracy: max, total training BitOPs: min) as a pure array function.

A point is on the front unless another point is at least as accurate and at most as costly, and strictly
better in one of the two. Identical points do not dominate each other, so ties are all kept. Points with
a NaN or infinite objective are never on the front and dominate nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.metrics import ACCURACY, TRAIN_BITOPS


def pareto_mask(accuracy: Sequence[float], bitops: Sequence[float]) -> np.ndarray:
    acc = np.asarray(accuracy, dtype=float)
    cost = np.asarray(bitops, dtype=float)
    if acc.shape != cost.shape or acc.ndim != 1:
        raise ValueError("accuracy and bitops must be 1-d sequences of the same length")
    valid = np.isfinite(acc) & np.isfinite(cost)
    mask = valid.copy()
    idx = np.flatnonzero(valid)
    a, c = acc[idx], cost[idx]
    for k, i in enumerate(idx):
        better_or_equal = (a >= a[k]) & (c <= c[k])
        strictly = (a > a[k]) | (c < c[k])
        if np.any(better_or_equal & strictly):
            mask[i] = False
    return mask


def pareto_rows(rows: list[dict], acc_key: str = ACCURACY, cost_key: str = TRAIN_BITOPS,
                maximize: bool = True) -> list[dict]:
    """The rows on the front, sorted by cost (cheapest first); ``maximize=False``: ``acc_key`` is a loss to
    minimise (a language model's perplexity)."""
    if not rows:
        return []
    sign = 1.0 if maximize else -1.0
    mask = pareto_mask([sign * r.get(acc_key, float("nan")) for r in rows],
                       [r.get(cost_key, float("nan")) for r in rows])
    front = [r for r, keep in zip(rows, mask) if keep]
    return sorted(front, key=lambda r: (r[cost_key], -sign * r[acc_key]))


def hypervolume(accuracy: Sequence[float], cost: Sequence[float], ref_cost: float) -> float:
    """The share of the (cost / ref_cost, accuracy) unit square the points dominate, from the reference point
    (cost = ``ref_cost``, accuracy = 0): 0 when nothing beats the reference, 1 for accuracy 1 at no cost.
    Only the front matters; points at or beyond ``ref_cost`` (or non-finite) add nothing."""
    if not ref_cost or not np.isfinite(ref_cost) or ref_cost <= 0:
        return 0.0
    mask = pareto_mask(accuracy, cost)
    pts = sorted((c / ref_cost, max(a, 0.0)) for a, c, keep in zip(accuracy, cost, mask)
                 if keep and c < ref_cost)
    area = 0.0
    for i, (x, a) in enumerate(pts):  # the front: accuracy rises with cost; strips up to the next point
        nxt = pts[i + 1][0] if i + 1 < len(pts) else 1.0
        area += (nxt - max(x, 0.0)) * a
    return float(area)
