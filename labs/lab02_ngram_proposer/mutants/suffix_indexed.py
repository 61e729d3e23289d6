"""Mutant: the index also takes the n-grams ending at the last token, which have no follower yet:
the suffix then finds itself (period 0).

caught by: test_proposer_matches_lookup, test_proposer_context_grows_by_several_tokens, test_proposer_long_context_correct
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch(NgramProposer)
def _add_ngrams(self, tokens):
    for e in range(self.indexed, len(tokens)):  # BUG: up to L - 1, the suffix included
        for n in range(self.min_n, min(self.max_n, e + 1) + 1):
            self.index[tuple(tokens[e - n + 1:e + 1])] = e
    if len(tokens) > self.indexed:
        self.seen.extend(tokens[self.indexed:len(tokens)])
        self.indexed = len(tokens)
