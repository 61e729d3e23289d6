"""Planted bug: the residual is renormalised without the zero-mass guard. When p equals q the
residual is all zeros and 0/0 gives NaN.

caught by: test_residual_zero_mass_returns_p
"""
from __future__ import annotations
import torch

import importlib.util as _ilu
from pathlib import Path as _Path

# Everything not redefined below is the worked solution; the buggy functions are patched into it
# too, so the solution's other functions call them (as they would in one student file).
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


def residual_distribution(p, q):
    r = torch.clamp(p - q, min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return r / mass


_base.residual_distribution = residual_distribution
