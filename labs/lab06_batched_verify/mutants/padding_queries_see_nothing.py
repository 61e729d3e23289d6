"""Mutant: padding queries get no visible key at all. Their softmax is over nothing, which the
attention kernel turns into NaN or garbage that can leak into the batch.

caught by: test_mask_example, test_mask_random_bruteforce
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    b, s = slot_pos.shape
    keys = slot_pos[:, None, :]
    queries = query_pos[:, :, None]
    allowed = (keys >= 0) & (keys <= queries)  # BUG: no own slot for padding queries
    mask = torch.zeros(b, query_pos.shape[1], s, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[:, None]
