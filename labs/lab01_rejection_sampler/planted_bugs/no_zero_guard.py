"""Planted bug: the residual is renormalised without the zero-mass guard. When p equals q the
residual is all zeros and 0/0 gives NaN.

caught by: test_residual_zero_mass_returns_p
"""
from __future__ import annotations
import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def residual_distribution(p, q):
    r = torch.clamp(p - q, min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return r / mass
