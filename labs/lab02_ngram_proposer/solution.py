"""Lab 2 — a worked solution, written the way a student would (for instructors)."""
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
        for e in range(L - 2, n - 2, -1):  # most recent first; e <= L - 2 leaves a follower
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
        self.source = None  # the list we indexed: the engine hands us the same one every step
        self.seen = []  # its first `indexed` tokens, to recognise it when handed another list

    def _same_context(self, tokens):
        if len(tokens) <= self.indexed:
            return False  # shorter than what we indexed (plus its follower): not our context
        if tokens is self.source:
            return True  # our list, grown: committed tokens never change
        return tokens[:self.indexed] == self.seen  # another list: O(L), once per new request

    def _add_ngrams(self, tokens):
        """Index the n-grams that gained a follower since the last call."""
        for e in range(self.indexed, len(tokens) - 1):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self.index[tuple(tokens[e - n + 1:e + 1])] = e
        if len(tokens) - 1 > self.indexed:
            self.seen.extend(tokens[self.indexed:len(tokens) - 1])
            self.indexed = len(tokens) - 1

    def _find(self, tokens):
        L = len(tokens)
        for n in range(min(self.max_n, L), self.min_n - 1, -1):  # longest suffix first
            e = self.index.get(tuple(tokens[L - n:]))
            if e is not None:
                return _continue(tokens, e, self.k)
        return []

    def lookup(self, tokens):
        if self.indexed and not self._same_context(tokens):
            self.reset()  # a new context: index it from scratch
        self.source = tokens
        self._add_ngrams(tokens)
        return self._find(tokens)

    def begin(self, state):
        self.reset()

    def propose(self, state):
        draft = self.lookup(state.token_list)
        return Draft(torch.tensor(draft, dtype=torch.long, device=state.device))
