"""Planted bug: off by one in the rollback: the slot at position keep[b] (the first rejected
draft, or the newest token that the next step feeds again) stays visible.

caught by: test_rollback_example, test_rollback_edges_and_no_mutation, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def rollback(slot_pos, keep):
    out = slot_pos.clone()
    for b, k in enumerate(keep):
        out[b][out[b] > k] = -1  # BUG: > instead of >=
    return out
