"""Planted bug: verification reads each row's scores from the first len + 1 columns, as if the
batch were right-padded; with left padding a short row then checks its draft against padding.

caught by: test_verify_rows_examples, test_verify_rows_random_bruteforce, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def verify_rows(logits, drafts):
    emitted, accepted = [], []
    for b, draft in enumerate(drafts):
        draft = [int(t) for t in draft]
        best = logits[b, : len(draft) + 1].argmax(-1).tolist()  # BUG: the padded columns
        a = 0
        while a < len(draft) and draft[a] == best[a]:
            a += 1
        emitted.append(draft[:a] + [best[a]])
        accepted.append(a)
    return emitted, accepted
