"""Planted bug: the earliest occurrence of the suffix is copied instead of the most recent one
(the scan runs forwards, and the index keeps the first position it saw).

caught by: test_most_recent_occurrence, test_against_brute_force, test_proposer_matches_lookup
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution; the same mistake in both places below


@patch
def ngram_lookup(tokens, k, min_n=1, max_n=4):
    _check(k, min_n, max_n)
    tokens = list(tokens)
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n:]
        for e in range(n - 1, L - 1):  # BUG: earliest occurrence first
            if tokens[e - n + 1:e + 1] == suffix:
                return _continue(tokens, e, k)
    return []


@patch(NgramProposer)
def _add_ngrams(self, tokens):
    for e in range(self.indexed, len(tokens) - 1):
        for n in range(self.min_n, min(self.max_n, e + 1) + 1):
            self.index.setdefault(tuple(tokens[e - n + 1:e + 1]), e)  # BUG: keeps the first
    if len(tokens) - 1 > self.indexed:
        self.seen.extend(tokens[self.indexed:len(tokens) - 1])
        self.indexed = len(tokens) - 1
