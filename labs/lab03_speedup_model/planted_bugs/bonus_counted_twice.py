"""Planted bug: "plus one for the bonus token" added to a sum that already counts it, so every
step is credited one token too many (2 tokens per step for a drafter that is never right).

caught by: test_tokens_per_step_values, test_alpha_one_limit, test_speedup_values
"""
from __future__ import annotations
import numpy as np

import importlib.util as _ilu
from pathlib import Path as _Path

# Everything not redefined below is the worked solution; the buggy functions are patched into it
# too, so the solution's other functions call them (as they would in one student file).
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


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


_base.expected_tokens_per_step = expected_tokens_per_step
