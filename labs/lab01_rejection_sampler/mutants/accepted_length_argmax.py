"""Mutant: the accepted length is the position of the first False, found with argmax (and K when
there is none). argmax of an empty row fails, so K = 0 crashes.

caught by: test_accepted_length_edge_cases, test_k_zero
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def accepted_length(accept):
    first_false = (~accept).long().argmax(dim=1)  # BUG: fails when K = 0
    return torch.where(accept.all(dim=1), torch.full_like(first_false, accept.shape[1]), first_false)
