"""Planted bug: walk down from the root taking the *first* correct child at each node. With
distinct sibling tokens that is right, but when two siblings carry the same token the walk can
stop early in the shallower branch instead of taking the longest correct path.

caught by: test_greedy_duplicate_siblings_take_longest, test_greedy_random_trees_bruteforce
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


def tree_greedy_verify(target_logits, parents, draft_tokens):
    p = _parent_list(parents)
    tokens = [int(t) for t in draft_tokens]
    best = target_logits.argmax(dim=-1).tolist()
    accepted, slot = [], 0
    while True:
        nxt = next((i for i in range(len(p)) if p[i] == slot - 1 and tokens[i] == best[slot]), None)  # BUG
        if nxt is None:
            break
        accepted.append(nxt)
        slot = nxt + 1
    return accepted, [tokens[i] for i in accepted] + [best[slot]]


_base.tree_greedy_verify = tree_greedy_verify
