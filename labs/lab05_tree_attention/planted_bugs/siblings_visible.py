"""Planted bug: the mask is the ordinary causal mask over the slots, so a node also sees the
earlier nodes of other branches (its siblings and cousins), as if the tree were one long text.

caught by: test_mask_small_example, test_tree_forward_matches_paths, test_mask_random_trees_bruteforce
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def tree_attention_mask(parents, past_len, dtype=torch.float32):
    n = len(_parent_list(parents))
    allowed = torch.ones(n + 1, past_len + n + 1, dtype=torch.bool).tril(diagonal=past_len)  # BUG: causal
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype)
    mask[allowed] = 0.0
    return mask[None, None]
