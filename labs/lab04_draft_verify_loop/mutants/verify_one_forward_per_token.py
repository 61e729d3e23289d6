"""Mutant: verify_greedy runs the target once per position (pending tokens, then each draft on its
own). The accepted prefix and the cache are right, but a step costs k + 1 target forwards instead
of one, which is the whole point lost.

caught by: test_verify_greedy, test_one_target_forward_per_step
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def verify_greedy(target_model, target_cache, pending_ids, drafted):
    pending = _ids(pending_ids)
    drafted = _ids(drafted)
    if not pending:
        raise ValueError("pending_ids is empty: the target needs at least the last committed token")
    best = []
    with torch.no_grad():
        best.append(int(_next_logits(target_model, target_cache, pending, 1)[-1].argmax()))
        for d in drafted:  # BUG: one target forward per draft token
            best.append(int(_next_logits(target_model, target_cache, [d], 1)[-1].argmax()))
    a = 0
    while a < len(drafted) and drafted[a] == best[a]:
        a += 1
    return a, drafted[:a] + [best[a]]
