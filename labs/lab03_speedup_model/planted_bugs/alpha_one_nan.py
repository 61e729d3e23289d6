"""Planted bug: the closed form without the alpha = 1 case: 0/0 gives NaN exactly where drafts
are always right.

caught by: test_alpha_one_limit
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
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (1 - a ** (kk + 1)) / (1 - a)  # BUG: alpha = 1 is 0/0
    return float(out) if out.ndim == 0 else out
