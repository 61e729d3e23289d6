"""Mutant: residual_distribution returns max(p - q, 0) without dividing by its sum. rejection_sample
scales its inverse-CDF draw by the total, so the samples stay right; the function does not.

caught by: test_residual_distribution_example, test_residual_batched
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def residual_distribution(p, q):
    r = torch.clamp(p - q, min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    ok = mass > 1e-12
    return torch.where(ok, r, p)  # BUG: not renormalised
