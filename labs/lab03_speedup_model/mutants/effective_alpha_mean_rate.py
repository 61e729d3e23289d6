"""Mutant: the effective alpha is taken as the mean of the conditional per-position rates. Right
when every position has the same rate, wrong as soon as later positions are harder.

caught by: test_effective_alpha_example, test_effective_alpha_predicts_a_simulation
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def effective_alpha(per_position_acceptance):
    s = np.asarray(per_position_acceptance, dtype=float)
    if s.size == 0 or np.any((s < 0) | (s > 1)):
        raise ValueError("need one or more per-position rates in [0, 1]")
    return float(np.mean(conditional_rates(s)))  # BUG: the mean rate is not the i.i.d. equivalent
