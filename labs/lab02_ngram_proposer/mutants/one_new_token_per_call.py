"""Mutant: after the first call, only the n-grams ending at L - 2 are indexed, as if the context
grew by exactly one token per call. The engine appends 1 to k + 1 tokens per step, so the n-grams
ending at the other new positions never reach the index.

caught by: test_proposer_context_grows_by_several_tokens
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch(NgramProposer)
def _add_ngrams(self, tokens):
    start = self.indexed if self.indexed == 0 else len(tokens) - 2  # BUG: one new token per call
    for e in range(max(start, 0), len(tokens) - 1):
        for n in range(self.min_n, min(self.max_n, e + 1) + 1):
            self.index[tuple(tokens[e - n + 1:e + 1])] = e
    if len(tokens) - 1 > self.indexed:
        self.seen.extend(tokens[self.indexed:len(tokens) - 1])
        self.indexed = len(tokens) - 1
