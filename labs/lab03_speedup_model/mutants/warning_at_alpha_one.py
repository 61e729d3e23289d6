"""Mutant: np.where picks k + 1 at alpha = 1, but the division is still evaluated there, so numpy
warns about dividing by zero (the values are right, the promise "no warning" is not kept).

caught by: test_no_warning_at_alpha_one
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def expected_tokens_per_step(alpha, k):
    a = np.asarray(alpha, dtype=float)
    kk = np.asarray(k, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if np.any(kk < 0) or np.any(kk != np.round(kk)):
        raise ValueError(f"k must be a whole number >= 0, got {k!r}")
    a, kk = np.broadcast_arrays(a, kk)
    out = np.where(a < 1, (1 - a ** (kk + 1)) / (1 - a), kk + 1)  # BUG: divides by 0 at alpha = 1
    return float(out) if out.ndim == 0 else out
