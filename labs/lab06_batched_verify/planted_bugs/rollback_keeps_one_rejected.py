"""Planted bug: off by one in the rollback: the slot at position keep[b] (the first rejected
draft, or the newest token that the next step feeds again) stays visible.

caught by: test_rollback_example, test_rollback_edges_and_no_mutation, test_rollback_holes_in_a_real_forward, test_your_functions_drive_the_engine
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


def rollback(slot_pos, keep):
    out = slot_pos.clone()
    for b, k in enumerate(keep):
        out[b][out[b] > k] = -1  # BUG: > instead of >=
    return out
