"""Planted bug: the earliest occurrence of the suffix is copied instead of the most recent one
(the scan runs forwards, and the index keeps the first position it saw).

caught by: test_most_recent_occurrence, test_against_brute_force, test_proposer_matches_lookup
"""
from __future__ import annotations

import torch

from specdecode_ref.proposers import Draft, Proposer


def _check(k, min_n, max_n):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(min_n, int) or not isinstance(max_n, int) or not 1 <= min_n <= max_n:
        raise ValueError(f"need integers 1 <= min_n <= max_n, got {min_n!r}, {max_n!r}")


def _continue(tokens, e, k):
    period = len(tokens) - 1 - e  # distance from the occurrence to the suffix
    return [tokens[e + 1 + (j % period)] for j in range(k)]


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


class NgramProposer(Proposer):
    name = "student-ngram"

    def __init__(self, k=5, min_n=1, max_n=4):
        super().__init__(k)
        if not isinstance(min_n, int) or not isinstance(max_n, int) or not 1 <= min_n <= max_n:
            raise ValueError(f"need integers 1 <= min_n <= max_n, got {min_n!r}, {max_n!r}")
        self.min_n, self.max_n = min_n, max_n
        self.reset()

    def reset(self):
        self.index = {}  # n-gram -> last end position with a follower
        self.indexed = 0  # n-grams ending at positions < indexed are in the index
        self.last = None  # tokens[indexed - 1] when we indexed it

    def lookup(self, tokens):
        L = len(tokens)
        if L - 1 < self.indexed or (self.indexed and tokens[self.indexed - 1] != self.last):
            self.reset()  # not a continuation of what we indexed: a new context
        for e in range(self.indexed, L - 1):  # n-grams that gained a follower since last time
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self.index.setdefault(tuple(tokens[e - n + 1:e + 1]), e)  # BUG: keeps the first
        self.indexed = max(self.indexed, L - 1)
        self.last = tokens[self.indexed - 1] if self.indexed else None
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            e = self.index.get(tuple(tokens[L - n:]))
            if e is not None:
                return _continue(tokens, e, self.k)
        return []

    def begin(self, state):
        self.reset()

    def propose(self, state):
        draft = self.lookup(state.token_list)
        return Draft(torch.tensor(draft, dtype=torch.long, device=state.device))
