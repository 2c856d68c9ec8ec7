"""results.runs: which cost model a sweep's rows can be read under (``check_objective``)."""

from __future__ import annotations

import math

import pytest

from engine.errors import ConfigError
from results.runs import check_objective


def _row(**costs: float) -> dict:
    return {"train_bitops": costs.get("bitops", math.nan), "costs": {"bitops": math.nan, **costs}}


def test_a_cost_model_no_trial_logged_is_refused_naming_those_they_did():
    rows = [_row(bitops=1e9, energy=2.0), _row(bitops=2e9), _row()]
    assert check_objective("energy", rows) == "energy"
    with pytest.raises(ConfigError) as err:
        check_objective("memory", rows)
    assert str(err.value) == ("--objective: got 'memory'; no trial logged it (metric train_cost_memory); "
                              "allowed here: bitops, energy")


@pytest.mark.parametrize("rows", [[], [_row(), _row()]], ids=["no trials", "no costs yet"])
def test_a_sweep_whose_trials_logged_no_cost_is_read_under_any_model(rows):
    """A sweep just started (no epoch done) or whose every trial failed: an empty front, not an error about a
    flag nobody gave."""
    for name in ("bitops", "energy", "table:a100"):
        assert check_objective(name, rows) == name
    with pytest.raises(ConfigError, match=r"^--objective: got 'watts'; allowed: bitops, macs"):
        check_objective("watts", rows)
