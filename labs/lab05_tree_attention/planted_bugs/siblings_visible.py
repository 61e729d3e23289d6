"""Planted bug: the mask is the ordinary causal mask over the slots, so a node also sees the
earlier nodes of other branches (its siblings and cousins), as if the tree were one long text.

caught by: test_mask_small_example, test_tree_forward_matches_paths, test_mask_random_trees_bruteforce
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


def tree_attention_mask(parents, past_len, dtype=torch.float32):
    n = len(_parent_list(parents))
    allowed = torch.ones(n + 1, past_len + n + 1, dtype=torch.bool).tril(diagonal=past_len)  # BUG: causal
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype)
    mask[allowed] = 0.0
    return mask[None, None]


_base.tree_attention_mask = tree_attention_mask
