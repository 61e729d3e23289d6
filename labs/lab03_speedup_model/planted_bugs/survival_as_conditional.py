"""Planted bug: measured per-position acceptance S_i (already "at least i accepted") is used as
if it were the conditional rate, so the probabilities are multiplied twice.

caught by: test_effective_alpha_example
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


def effective_alpha(per_position_acceptance):
    s = np.asarray(per_position_acceptance, dtype=float)
    if s.size == 0 or np.any((s < 0) | (s > 1)):
        raise ValueError("need one or more per-position rates in [0, 1]")
    # 1 + S_1 + ... + S_k is already E[tokens per step]: S_i = a_1 ... a_i.
    return alpha_from_tau(expected_tokens_from_position_rates(s), len(s))


_base.effective_alpha = effective_alpha
