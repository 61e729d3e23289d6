"""Planted bug: the search for the best K stops one short (range(1, k_max)), so k_max itself
is never chosen.

caught by: test_optimal_k_ties_and_limits
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def optimal_k(alpha, c, verify_cost=1.0, k_max=64):
    best_k, best = 1, -1.0
    for k in range(1, k_max):  # BUG: off by one
        s = expected_speedup(alpha, k, c, verify_cost)
        if s > best:  # strictly better: ties keep the smaller k
            best_k, best = k, s
    return best_k
