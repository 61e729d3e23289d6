"""Planted bug: walk down from the root taking the *first* correct child at each node. With
distinct sibling tokens that is right, but when two siblings carry the same token the walk can
stop early in the shallower branch instead of taking the longest correct path.

caught by: test_greedy_duplicate_siblings_take_longest, test_greedy_random_trees_bruteforce
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
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
