"""Mutant: each step's new tokens are numbered 0, 1, 2, ... instead of continuing after the row's
committed length, as if every step were a new prompt.

caught by: test_layout_example, test_layout_edge_cases, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def step_layout(rows_ids, lengths, pad_id=0):
    rows = [[int(t) for t in r] for r in rows_ids]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    pos = torch.full((len(rows), n), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        start = n - len(row)
        for j, tok in enumerate(row):
            ids[b, start + j] = tok
            pos[b, start + j] = j  # BUG: forgets lengths[b]
    return ids, pos
