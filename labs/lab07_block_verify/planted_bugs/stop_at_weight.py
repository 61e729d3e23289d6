"""Planted bug: prefix i is kept with probability w_i, its weight, instead of r_i / (r_i + 1 - w_i):
the residual's share is left out of the stopping rule.

caught by: test_stop_probabilities_example, test_joint_law_follows_target, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def stop_probabilities(residual_mass, w):
    return w.clone()  # BUG: the weight, not r / (r + 1 - w)
