"""Mutant: the residual at the kept prefix is lab 1's max(p - q, 0), without the prefix's weight:
right only where w = 1.

caught by: test_prefix_residual_example, test_joint_law_follows_target, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def prefix_residual(p, q, w):
    r = torch.clamp(p - q, min=0.0)  # BUG: the weight is left out
    mass = r.sum(dim=-1, keepdim=True)
    ok = mass > 1e-12
    return torch.where(ok, r / torch.where(ok, mass, torch.ones_like(mass)), p)
