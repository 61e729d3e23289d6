"""Planted bug: when every draft is accepted, the "bonus" is read from the target's prediction at
the last draft's position instead of the position after it -- that prediction is d_k itself, so
the last draft is emitted twice.

caught by: test_verify_greedy, test_draft_equal_to_target_accepts_everything, test_every_acceptance_length
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def verify_greedy(target_model, target_cache, pending_ids, drafted):
    pending = _ids(pending_ids)
    drafted = _ids(drafted)
    if not pending:
        raise ValueError("pending_ids is empty: the target needs at least the last committed token")
    with torch.no_grad():
        logits = _next_logits(target_model, target_cache, pending + drafted, len(drafted) + 1)
    best = logits.argmax(dim=-1).tolist()
    a = 0
    while a < len(drafted) and drafted[a] == best[a]:
        a += 1
    if a == len(drafted) and a > 0:
        return a, drafted + [best[a - 1]]  # BUG: the bonus is best[a], predicted after d_k
    return a, drafted[:a] + [best[a]]
