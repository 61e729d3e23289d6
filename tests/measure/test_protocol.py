"""The timing protocol's rules (measure/harness/protocol.py), each with a planted twin that must fail."""
from __future__ import annotations

import pytest

from specdecode_ref.measure.harness import protocol


def check_rules(order_of, wants_another_round, kept_index):
    assert order_of("abc", 0) == list("abc") and order_of("abc", 1) == list("cba"), "odd rounds run reversed"
    assert not wants_another_round([1.0, 1.2]), "rounds within the spike factor are not re-timed"
    assert wants_another_round([1.0, 2.0]), "a spike is re-timed"
    assert not wants_another_round([1.0, 2.0, 1.0, 3.0]), "re-timing stops at MAX_ROUNDS"
    assert kept_index([2.0, 1.0]) == 1, "of two agreeing rounds the faster is kept"
    assert kept_index([1.0, 5.0, 1.1]) == 2, "the median of three is kept, never the spike"


def test_rules():
    check_rules(protocol.order_of, protocol.wants_another_round, protocol.kept_index)


@pytest.mark.parametrize("twin", ["same_order", "never_retime", "keep_slowest"])
def test_planted_twins_are_caught(twin):
    order = (lambda m, r: list(m)) if twin == "same_order" else protocol.order_of
    again = (lambda s: False) if twin == "never_retime" else protocol.wants_another_round
    kept = (lambda s: max(range(len(s)), key=lambda i: s[i])) if twin == "keep_slowest" else protocol.kept_index
    with pytest.raises(AssertionError):
        check_rules(order, again, kept)


def test_tables_are_compared_or_refused():
    a = {"machine": "m", "t1_s": 0.020}
    assert protocol.comparable(a, {"machine": "m", "t1_s": 0.021})[0]
    assert not protocol.comparable(a, {"machine": "m", "t1_s": 0.030})[0], "a 50 % slower T(1) is refused"
    assert not protocol.comparable(a, {"machine": "other", "t1_s": 0.020})[0]
    with pytest.raises(ValueError, match="cannot be compared"):
        protocol.require_comparable(a, {"machine": "m", "t1_s": 0.030})
    counters = {"machine": "m", "counters": {"plain": {"target_time_s": 1.1, "prefill_time_s": 0.1, "steps": 50}}}
    assert protocol.t1_of(counters) == pytest.approx(0.020)
    with pytest.raises(ValueError, match="no T\\(1\\)"):
        protocol.t1_of({"machine": "m"})


def check_outliers(outliers):
    assert outliers({"plain": 1.0, "ngram": 0.8, "draft": 0.95, "eagle": 2.4}) == ["eagle"], \
        "a method far above the prompt's median over methods is re-timed"
    assert outliers({"plain": 1.0, "ngram": 0.8, "draft": 1.3}) == [], "an ordinary spread is left alone"
    assert outliers({"plain": 1.0, "ngram": 3.0}) == [], "two methods have no median to judge a spike by"


def test_outliers_against_the_prompts_other_methods():
    check_outliers(protocol.outliers)


@pytest.mark.parametrize("twin", ["never", "against_the_fastest"])
def test_outlier_twins_are_caught(twin):
    """Planted twins: a rule that never flags, and one that judges against the fastest method (which
    would re-time every drafter slower than n-gram lookup)."""
    wrong = (lambda kept: []) if twin == "never" else (
        lambda kept: [m for m, s in kept.items() if len(kept) >= 3 and s > protocol.OUTLIER_FACTOR * min(kept.values())])
    with pytest.raises(AssertionError):
        check_outliers(wrong)
