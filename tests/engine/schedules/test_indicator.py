"""PFQ's loss indicator on synthetic loss sequences (docs/methods.md §4.2)."""

from __future__ import annotations

import pytest

from engine.schedules.indicator import LossIndicator


def feed(ind, losses):
    return [ind.update(x) for x in losses]


def test_fires_exactly_when_every_difference_is_within_epsilon():
    # scale S = mean of the first 10 windows = 1.0 here; K = 5 -> compares window 5 with windows 1..4
    ind = LossIndicator(epsilon=0.1, alpha=0.5, num_turning_points=3)
    assert feed(ind, [1.0, 1.0, 1.0, 1.0]) == [False] * 4  # buffer not full yet: earliest point is window 5
    assert ind.update(1.0) is True
    assert ind.turning_points == 1

    ind = LossIndicator(epsilon=0.1, alpha=0.5, num_turning_points=3)
    # window 5 differs from window 1 by 0.12 > eps: no turning point, even though the others are close
    assert feed(ind, [1.12, 1.0, 1.0, 1.0, 1.0]) == [False] * 5
    assert max(ind.last_distances) == pytest.approx(0.12 / ind.scale)
    # the FIFO drops 1.12; windows 2..6 are all within eps -> fires at window 6
    assert ind.update(1.0) is True


def test_difference_exactly_at_epsilon_fires():
    ind = LossIndicator(epsilon=0.25, alpha=1.0, num_turning_points=1, scale_windows=1)
    # S = L_1 = 2.0 (frozen after one window); |2.5 - 2.0| / 2.0 = 0.25 <= eps
    assert feed(ind, [2.0, 2.0, 2.0, 2.0, 2.5]) == [False, False, False, False, True]


def test_scale_is_mean_of_first_windows_then_frozen():
    ind = LossIndicator(epsilon=0.01, alpha=1.0, num_turning_points=1, scale_windows=3)
    feed(ind, [3.0, 2.0, 1.0])
    assert ind.scale == pytest.approx(2.0)
    feed(ind, [100.0, 100.0])
    assert ind.scale == pytest.approx(2.0)


def test_epsilon_decays_after_first_and_second_turning_points_only():
    ind = LossIndicator(epsilon=0.2, alpha=0.5, num_turning_points=3)
    eps = []
    for _ in range(3):
        assert feed(ind, [1.0] * 5)[-1] is True
        eps.append(ind.epsilon)
    assert eps == pytest.approx([0.1, 0.05, 0.05])


def test_buffer_clears_after_a_turning_point():
    ind = LossIndicator(epsilon=0.2, alpha=1.0, num_turning_points=3)
    feed(ind, [1.0] * 5)
    assert ind.buffer == []
    # the next turning point needs five new windows
    assert feed(ind, [1.0] * 5) == [False, False, False, False, True]


def test_never_fires_after_the_last_stage():
    ind = LossIndicator(epsilon=0.5, alpha=1.0, num_turning_points=2)
    fired = feed(ind, [1.0] * 40)
    assert sum(fired) == 2 and ind.done and ind.turning_points == 2
    assert fired.index(True) == 4 and [i for i, f in enumerate(fired) if f] == [4, 9]


def test_state_dict_resumes_the_same_stage_and_buffer():
    losses = [2.0, 1.5, 1.2, 1.1, 1.05, 1.04, 1.03, 1.03, 1.02, 1.02, 1.02, 1.01, 1.01, 1.01, 1.01, 1.0, 1.0, 1.0]
    a = LossIndicator(epsilon=0.05, alpha=0.5, num_turning_points=3)
    ref = feed(a, losses)
    b = LossIndicator(epsilon=0.05, alpha=0.5, num_turning_points=3)
    first = feed(b, losses[:9])
    state = b.state_dict()
    c = LossIndicator(epsilon=0.05, alpha=0.5, num_turning_points=3)
    c.load_state_dict(state)
    assert c.turning_points == b.turning_points and c.buffer == b.buffer and c.epsilon == b.epsilon
    assert first + feed(c, losses[9:]) == ref
    assert sum(ref) >= 1
