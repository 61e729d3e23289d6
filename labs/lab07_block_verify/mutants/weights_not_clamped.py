"""Mutant: the running product is not clamped at 1 (w_i = w_{i-1} * p_i/q_i), so weights grow
above 1 and the stopping probabilities are no longer probabilities.

caught by: test_prefix_weights_example, test_joint_law_follows_target, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def prefix_weights(ratio, valid):
    B, K = ratio.shape
    w = torch.ones(B, K + 1)
    for i in range(K):
        # carry the weight: clamp the running product, not each ratio on its own
        w[:, i + 1] = w[:, i] * ratio[:, i] * valid[:, i]  # BUG: no min(1, .)
    return w
