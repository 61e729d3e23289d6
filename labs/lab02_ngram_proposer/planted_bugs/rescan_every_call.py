"""Planted bug: the proposer rescans the whole context on every call (correct drafts, but
O(L) per step and O(L^2) per generation).

caught by: test_proposer_cost_does_not_grow
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one method replaced below


@patch(NgramProposer)
def lookup(self, tokens):
    return ngram_lookup(tokens, self.k, self.min_n, self.max_n)  # BUG: a full scan every step
