"""Mutant: alpha is checked, k is not: k = -1 or k = 2.5 give a number instead of an error.

caught by: test_invalid_k
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
    a, kk = np.broadcast_arrays(a, kk)  # BUG: k is never checked
    safe = np.where(a < 1, a, 0.0)
    out = np.where(a < 1, (1 - safe ** (kk + 1)) / (1 - safe), kk + 1)
    return float(out) if out.ndim == 0 else out
