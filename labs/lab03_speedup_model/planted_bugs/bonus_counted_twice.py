"""Planted bug: "plus one for the bonus token" added to a sum that already counts it, so every
step is credited one token too many (2 tokens per step for a drafter that is never right).

caught by: test_tokens_per_step_values, test_alpha_one_limit, test_speedup_values
"""
from __future__ import annotations
import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def expected_tokens_per_step(alpha, k):
    a = np.asarray(alpha, dtype=float)
    kk = np.asarray(k, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if np.any(kk < 0) or np.any(kk != np.round(kk)):
        raise ValueError(f"k must be a whole number >= 0, got {k!r}")
    a, kk = np.broadcast_arrays(a, kk)
    safe = np.where(a < 1, a, 0.0)  # keep the division away from alpha = 1
    out = np.where(a < 1, (1 - safe ** (kk + 1)) / (1 - safe), kk + 1)
    out = out + 1  # BUG: the bonus token is already the first term of the sum
    return float(out) if out.ndim == 0 else out
