"""Mutant: the stopping probability is r / (1 - w) (capped at 1) instead of r / (r + 1 - w): the
mass that no longer prefix was kept is 1 - w + r, not 1 - w.

caught by: test_stop_probabilities_example, test_joint_law_follows_target, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def stop_probabilities(residual_mass, w):
    denom = 1.0 - w  # BUG: r is missing from the denominator
    ok = denom > 1e-12
    safe = torch.where(ok, denom, torch.ones_like(denom))
    return torch.where(ok, (residual_mass / safe).clamp(max=1.0), torch.ones_like(denom))
