"""Mutant: the accepted count is the number of draft tokens that match the target anywhere, not
the length of the matching prefix, so a draft that goes wrong and then right again is accepted
past its first mistake.

caught by: test_verify_rows_random_bruteforce
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
        mine = logits[b, n - len(draft) - 1:]
        best = mine.argmax(-1).tolist()
        a = sum(int(d == t) for d, t in zip(draft, best))  # BUG: all matches, not the prefix
        emitted.append(draft[:a] + [best[a]])
        accepted.append(a)
    return emitted, accepted
