"""Planted bug: the mask tests only "position <= mine" and forgets that -1 marks an empty slot,
so every query also sees left padding and the keys of rejected drafts.

caught by: test_mask_example, test_batched_forward_equals_rows_alone, test_mask_random_bruteforce, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
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


def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    b, s = slot_pos.shape
    allowed = slot_pos[:, None, :] <= query_pos[:, :, None]  # BUG: -1 <= p, empty slots visible
    mask = torch.zeros(b, query_pos.shape[1], s, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[:, None]
