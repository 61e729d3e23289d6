"""Planted bug: a node is checked against the argmax of its own row (what the target predicts
*after* the node) instead of its parent's row (what the target predicts *at* the node).

caught by: test_greedy_path_examples, test_greedy_random_trees_bruteforce
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
