"""Planted bug: every row is rolled back by the number of slots the first row drops, instead of
to its own committed length (the batch shares one rollback count, as a batch-1 engine would).

caught by: test_rollback_example, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def rollback(slot_pos, keep):
    out = slot_pos.clone()
    removed = int(out[0].max()) + 1 - keep[0]  # BUG: row 0's count for everyone
    for b in range(out.shape[0]):
        length = int(out[b].max()) + 1
        out[b][out[b] >= length - removed] = -1
    return out
