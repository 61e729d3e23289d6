"""Mutant: the periodic continuation is built by appending to the context itself (copying from
what was just appended, like an overlapping LZ77 match), so the caller's list grows by k tokens.

caught by: test_does_not_modify_input
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def ngram_lookup(tokens, k, min_n=1, max_n=4):
    _check(k, min_n, max_n)
    L = len(tokens)  # BUG: no copy of tokens
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n:]
        for e in range(L - 2, n - 2, -1):
            if tokens[e - n + 1:e + 1] == suffix:
                for j in range(k):
                    tokens.append(tokens[e + 1 + j])
                return tokens[L:]
    return []
