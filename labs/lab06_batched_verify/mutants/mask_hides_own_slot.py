"""Mutant: a query sees only strictly earlier positions (keys < query), so a token does not
attend to itself, unlike the causal mask the model was trained with.

caught by: test_mask_example
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    b, s = slot_pos.shape
    n = query_pos.shape[1]
    keys = slot_pos[:, None, :]
    queries = query_pos[:, :, None]
    allowed = (keys >= 0) & (keys < queries)  # BUG: < instead of <=
    for j in range(n):
        own = s - n + j
        allowed[:, j, own] |= query_pos[:, j] < 0
    mask = torch.zeros(b, n, s, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[:, None]
