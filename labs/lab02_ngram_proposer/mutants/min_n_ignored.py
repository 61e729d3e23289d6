"""Mutant: ngram_lookup tries suffixes down to length 1 whatever min_n says.

caught by: test_min_and_max_n_respected, test_against_brute_force
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def ngram_lookup(tokens, k, min_n=1, max_n=4):
    _check(k, min_n, max_n)
    tokens = list(tokens)
    L = len(tokens)
    for n in range(min(max_n, L - 1), 0, -1):  # BUG: down to 1, not min_n
        suffix = tokens[L - n:]
        for e in range(L - 2, n - 2, -1):
            if tokens[e - n + 1:e + 1] == suffix:
                return _continue(tokens, e, k)
    return []
