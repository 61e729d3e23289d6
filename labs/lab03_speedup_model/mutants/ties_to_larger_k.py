"""Mutant: optimal_k keeps the later k on a tie (>= instead of >), so a flat speedup curve gives
k_max instead of the smallest k.

caught by: test_optimal_k_ties_and_limits
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def optimal_k(alpha, c, verify_cost=1.0, k_max=64):
    if isinstance(k_max, bool) or int(k_max) != k_max or k_max < 1:
        raise ValueError(f"k_max must be a whole number >= 1, got {k_max!r}")
    best_k, best = 1, -1.0
    for k in range(1, int(k_max) + 1):
        s = expected_speedup(alpha, k, c, verify_cost)
        if s >= best:  # BUG: a tie moves to the larger k
            best_k, best = k, s
    return best_k
