"""Planted bug: every row's new tokens are numbered from the longest row's length (the padded
width), not from the row's own length: positions are not shifted per row, so a short row's
rotary phases are off by its padding.

caught by: test_layout_example, test_batched_forward_equals_rows_alone, test_layout_edge_cases, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def step_layout(rows_ids, lengths, pad_id=0):
    rows = [[int(t) for t in r] for r in rows_ids]
    n = max(len(r) for r in rows)
    start_pos = max(lengths)  # BUG: one offset for the whole batch
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    pos = torch.full((len(rows), n), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        start = n - len(row)
        for j, tok in enumerate(row):
            ids[b, start + j] = tok
            pos[b, start + j] = start_pos + j
    return ids, pos
