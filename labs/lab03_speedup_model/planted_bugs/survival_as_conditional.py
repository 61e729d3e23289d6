"""Planted bug: measured per-position acceptance S_i (already "at least i accepted") is used as
if it were the conditional rate, so the probabilities are multiplied twice.

caught by: test_effective_alpha_example
"""
from __future__ import annotations
import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def effective_alpha(per_position_acceptance):
    s = np.asarray(per_position_acceptance, dtype=float)
    if s.size == 0 or np.any((s < 0) | (s > 1)):
        raise ValueError("need one or more per-position rates in [0, 1]")
    # 1 + S_1 + ... + S_k is already E[tokens per step]: S_i = a_1 ... a_i.
    return alpha_from_tau(expected_tokens_from_position_rates(s), len(s))
