"""Mutant: two scalars give a 0-d numpy array instead of a float.

caught by: test_scalars_and_k_zero
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
    safe = np.where(a < 1, a, 0.0)
    return np.where(a < 1, (1 - safe ** (kk + 1)) / (1 - safe), kk + 1)  # BUG: a 0-d array for scalars
