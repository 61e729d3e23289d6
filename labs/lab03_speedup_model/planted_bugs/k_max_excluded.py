"""Planted bug: the search for the best K stops one short (range(1, k_max)), so k_max itself
is never chosen.

caught by: test_optimal_k_ties_and_limits
"""
from __future__ import annotations

import importlib.util as _ilu
from pathlib import Path as _Path

# Everything not redefined below is the worked solution; the buggy functions are patched into it
# too, so the solution's other functions call them (as they would in one student file).
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


def optimal_k(alpha, c, verify_cost=1.0, k_max=64):
    best_k, best = 1, -1.0
    for k in range(1, k_max):  # BUG: off by one
        s = expected_speedup(alpha, k, c, verify_cost)
        if s > best:  # strictly better: ties keep the smaller k
            best_k, best = k, s
    return best_k


_base.optimal_k = optimal_k
