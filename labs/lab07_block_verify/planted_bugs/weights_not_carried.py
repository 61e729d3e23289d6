"""Planted bug: each prefix is weighed by its last token's ratio alone, min(1, p_i/q_i), as the
token rule sees it: nothing is carried along the draft, so a later token cannot make up for an
earlier one and the stopping rule no longer matches the weights.

caught by: test_prefix_weights_example, test_joint_law_follows_target, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def prefix_weights(ratio, valid):
    B, K = ratio.shape
    w = torch.ones(B, K + 1)
    for i in range(K):
        # carry the weight: clamp the running product, not each ratio on its own
        w[:, i + 1] = torch.clamp(ratio[:, i], max=1.0) * valid[:, i]  # BUG: the weight is not carried
    return w
