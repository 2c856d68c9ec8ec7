"""Pareto selection on hand-built tables (ties, NaN, one point)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from results.pareto import pareto_mask, pareto_rows


def oracle(acc, cost):
    """Five-line reference: i is kept unless some j is >= in accuracy, <= in cost and better in one."""
    n = len(acc)
    ok = [math.isfinite(acc[i]) and math.isfinite(cost[i]) for i in range(n)]
    return [ok[i] and not any(ok[j] and acc[j] >= acc[i] and cost[j] <= cost[i] and (acc[j] > acc[i] or cost[j] < cost[i])
                              for j in range(n)) for i in range(n)]


def test_simple_front():
    acc = [0.90, 0.85, 0.80, 0.91, 0.70]
    cost = [10.0, 5.0, 6.0, 20.0, 1.0]
    assert pareto_mask(acc, cost).tolist() == [True, True, False, True, True]


def test_ties_are_all_kept_and_weak_domination_removes():
    acc = [0.8, 0.8, 0.8, 0.9]
    cost = [5.0, 5.0, 6.0, 5.0]
    # (0.9, 5) dominates both (0.8, 5) ties and (0.8, 6)
    assert pareto_mask(acc, cost).tolist() == [False, False, False, True]
    assert pareto_mask([0.8, 0.8], [5.0, 5.0]).tolist() == [True, True]


def test_nan_never_on_front_and_dominates_nothing():
    acc = [float("nan"), 0.5, 0.6]
    cost = [0.0, 2.0, float("inf")]
    assert pareto_mask(acc, cost).tolist() == [False, True, False]


def test_one_point_and_empty():
    assert pareto_mask([0.5], [3.0]).tolist() == [True]
    assert pareto_mask([], []).tolist() == []
    assert pareto_rows([]) == []


def test_matches_oracle_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        acc = rng.choice([0.5, 0.6, 0.7, 0.8, np.nan], n).tolist()
        cost = rng.choice([1.0, 2.0, 3.0, 4.0, np.inf], n).tolist()
        assert pareto_mask(acc, cost).tolist() == oracle(acc, cost)


def test_rows_sorted_by_cost():
    rows = [{"id": "a", "accuracy": 0.9, "train_bitops": 9.0}, {"id": "b", "accuracy": 0.7, "train_bitops": 1.0},
            {"id": "c", "accuracy": 0.6, "train_bitops": 5.0}]
    assert [r["id"] for r in pareto_rows(rows)] == ["b", "a"]


def test_shape_mismatch():
    with pytest.raises(ValueError):
        pareto_mask([1.0], [1.0, 2.0])


def test_hypervolume_by_hand():
    from results.pareto import hypervolume

    # reference: accuracy 0 at cost 10; front (2, 0.5), (5, 0.8); (6, 0.6) dominated; (10, 0.9) at the reference
    acc, cost = [0.5, 0.8, 0.6, 0.9], [2.0, 5.0, 6.0, 10.0]
    # strips: x 0.2..0.5 at 0.5, x 0.5..1.0 at 0.8 -> 0.15 + 0.4
    assert hypervolume(acc, cost, 10.0) == pytest.approx(0.55)
    assert hypervolume([0.9], [10.0], 10.0) == 0.0
    assert hypervolume([1.0], [0.0], 10.0) == 1.0
    assert hypervolume(acc, cost, float("nan")) == 0.0
