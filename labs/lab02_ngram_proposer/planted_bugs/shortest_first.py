"""Planted bug: suffix lengths are tried from min_n upwards, so the shortest match wins.

caught by: test_longest_suffix_wins, test_against_brute_force, test_proposer_matches_lookup
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution; the same mistake in both places below


@patch
def ngram_lookup(tokens, k, min_n=1, max_n=4):
    _check(k, min_n, max_n)
    tokens = list(tokens)
    L = len(tokens)
    for n in range(min_n, min(max_n, L - 1) + 1):  # BUG: shortest first
        suffix = tokens[L - n:]
        for e in range(L - 2, n - 2, -1):  # most recent first; e <= L - 2 leaves a follower
            if tokens[e - n + 1:e + 1] == suffix:
                return _continue(tokens, e, k)
    return []


@patch(NgramProposer)
def _find(self, tokens):
    L = len(tokens)
    for n in range(self.min_n, min(self.max_n, L) + 1):  # BUG: shortest first
        e = self.index.get(tuple(tokens[L - n:]))
        if e is not None:
            return _continue(tokens, e, self.k)
    return []
