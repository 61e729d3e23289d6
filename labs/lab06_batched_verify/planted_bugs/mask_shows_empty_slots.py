"""Planted bug: the mask tests only "position <= mine" and forgets that -1 marks an empty slot,
so every query also sees left padding and the keys of rejected drafts.

caught by: test_mask_example, test_batched_forward_equals_rows_alone, test_mask_random_bruteforce, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    b, s = slot_pos.shape
    allowed = slot_pos[:, None, :] <= query_pos[:, :, None]  # BUG: -1 <= p, empty slots visible
    mask = torch.zeros(b, query_pos.shape[1], s, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[:, None]
