"""Mutant: the new tokens of a shorter row are padded on the right instead of the left, so the
rows' last tokens no longer share the last column (where verification and the next step read).

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
        for j, tok in enumerate(row):  # BUG: starts at column 0, padding ends up on the right
            ids[b, j] = tok
            pos[b, j] = lengths[b] + j
    return ids, pos
