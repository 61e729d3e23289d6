"""Mutant: each ratio is clamped before the product, w_i = w_{i-1} * min(1, p_i/q_i): the token
rule's probability of keeping the prefix. The clamp must act on the running product, or a token
the draft under-proposes can never win back what an earlier one lost.

caught by: test_prefix_weights_example, test_num_accepted_distribution, test_lossless_in_every_case
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
        w[:, i + 1] = w[:, i] * torch.clamp(ratio[:, i], max=1.0) * valid[:, i]  # BUG: clamps each ratio
    return w
