"""Planted bug: every row's new tokens are numbered from the longest row's length (the padded
width), not from the row's own length: positions are not shifted per row, so a short row's
rotary phases are off by its padding.

caught by: test_layout_example, test_batched_forward_equals_rows_alone, test_layout_edge_cases, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import importlib.util as _ilu
from pathlib import Path as _Path

import torch

# Everything not redefined below is the worked solution.
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


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
