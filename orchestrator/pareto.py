"""Pareto selection of (final accuracy: max, total training BitOPs: min) as a pure array function.

A point is on the front unless another point is at least as accurate and at most as costly, and strictly
better in one of the two. Identical points do not dominate each other, so ties are all kept. Points with
a NaN or infinite objective are never on the front and dominate nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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


def pareto_rows(rows: list[dict], acc_key: str = "accuracy", cost_key: str = "train_bitops",
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
