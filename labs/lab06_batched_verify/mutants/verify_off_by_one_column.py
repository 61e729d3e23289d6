"""Mutant: a row's scores are taken from its last len(draft) columns, one too few: the column of
the last committed token (which scores the first draft token) is skipped.

caught by: test_verify_rows_examples
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def verify_rows(logits, drafts):
    n = logits.shape[1]
    emitted, accepted = [], []
    for b, draft in enumerate(drafts):
        draft = [int(t) for t in draft]
        mine = logits[b, n - len(draft):]  # BUG: one column short
        best = mine.argmax(-1).tolist() + [0]
        a = 0
        while a < len(draft) and draft[a] == best[a]:
            a += 1
        emitted.append(draft[:a] + [best[a]])
        accepted.append(a)
    return emitted, accepted
