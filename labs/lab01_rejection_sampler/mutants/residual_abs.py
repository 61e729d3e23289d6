"""Mutant: the residual is |p - q| renormalised instead of max(p - q, 0): tokens the draft
over-proposes are drawn again after a rejection.

caught by: test_residual_distribution_example, test_first_token_follows_p, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def residual_distribution(p, q):
    r = (p - q).abs()  # BUG: |p - q|
    mass = r.sum(dim=-1, keepdim=True)
    ok = mass > 1e-12
    return torch.where(ok, r / torch.where(ok, mass, torch.ones_like(mass)), p)
