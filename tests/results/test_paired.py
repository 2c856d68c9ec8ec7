"""results.paired: the spec's rule on the deciding pairs' differences, and the t-interval of their mean."""

from __future__ import annotations

from results.paired import decide, interval
from search_spaces.schema import Paired


def test_the_paired_rule_holds_refutes_or_leaves_undecided():
    """The spec's rule on the deciding pairs' differences; control pairs never count."""
    rule = Paired(claim="c", pairs=[{"arm": {"a": 1}, "twin": {"a": 2}}], refute_margin=0.3)

    def verdict(*diffs, control=()):
        pairs = [{"control": False, "seeds": [{"difference": d} for d in diffs]},
                 {"control": True, "seeds": [{"difference": d} for d in control]}]
        return decide(pairs, rule)["verdict"]

    assert verdict(0.1, 0.0, 0.4) == "holds"
    assert verdict(0.0, 0.0) == "undecided"  # every pair >= 0 but the mean is not > 0
    assert verdict(-0.5, -0.2, -0.4) == "refuted"
    assert verdict(-0.1, -0.2, -0.3) == "undecided"  # all below 0, the mean within the margin
    assert verdict(0.5, -0.1) == "undecided"
    assert verdict(0.2, 0.3, control=(-5.0,)) == "holds"
    mean, low, high = interval([1.0, 2.0, 3.0])  # t(2) = 4.303, sd 1: half-width 4.303 / sqrt(3)
    assert (mean, round(low, 4), round(high, 4)) == (2.0, round(2 - 4.303 / 3**0.5, 4), round(2 + 4.303 / 3**0.5, 4))
