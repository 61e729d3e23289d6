"""Mutant: a verify_cost function is called once with the whole array of k. A formula such as
1 + 0.08 k survives that; a measured cost table (costs[k]) does not.

caught by: test_verify_cost_function
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def _verify(verify_cost, k):
    if callable(verify_cost):
        return np.asarray(verify_cost(k), dtype=float)  # BUG: one call with an array of k
    return np.asarray(verify_cost, dtype=float)
