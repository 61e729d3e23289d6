"""Planted bug: position ids count slots (past_len, past_len + 1, ...) instead of depths, so a
node's rotary embedding places it after every earlier node of the tree.

caught by: test_position_ids_example, test_tree_forward_matches_paths, test_position_ids_random_trees
"""
from __future__ import annotations

import importlib.util as _ilu
from pathlib import Path as _Path

import torch

# Everything not redefined below is the worked solution; the buggy functions are patched into it
# too, so the solution's other functions call them (as they would in one student file).
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


def tree_position_ids(parents, past_len):
    n = len(_parent_list(parents))
    return (torch.arange(n + 1) + past_len)[None]  # BUG: the slot, not the depth


_base.tree_position_ids = tree_position_ids
