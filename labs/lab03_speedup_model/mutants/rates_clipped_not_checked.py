"""Mutant: conditional_rates clips everything into [0, 1], so an S_i of 1.2 or -0.1 (not a rate
at all) passes silently instead of raising.

caught by: test_rates_outside_zero_one_raise
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def conditional_rates(per_position_acceptance):
    s = np.asarray(per_position_acceptance, dtype=float)  # BUG: no check, the clip hides bad input
    prev = np.concatenate([[1.0], s[:-1]])
    out = np.zeros_like(s)
    reached = prev > 0
    out[reached] = s[reached] / prev[reached]
    return np.clip(out, 0.0, 1.0)
