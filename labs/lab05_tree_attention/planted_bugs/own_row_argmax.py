"""Planted bug: a node is checked against the argmax of its own row (what the target predicts
*after* the node) instead of its parent's row (what the target predicts *at* the node).

caught by: test_greedy_path_examples, test_greedy_random_trees_bruteforce
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
    run = []
    for i, par in enumerate(p):
        ok = tokens[i] == best[i + 1] and (par == -1 or run[par] > 0)  # BUG: own row
        run.append((1 if par == -1 else run[par] + 1) if ok else 0)
    accepted = []
    if run and max(run) > 0:
        node = run.index(max(run))
        while node != -1:
            accepted.append(node)
            node = p[node]
        accepted.reverse()
    last_slot = accepted[-1] + 1 if accepted else 0
    return accepted, [tokens[i] for i in accepted] + [best[last_slot]]


_base.tree_greedy_verify = tree_greedy_verify
