"""Mutant: to be safe, every call compares the whole indexed prefix with the list it is given,
even when it is the engine's list grown by a few tokens. The drafts are right, but each call
costs O(L) again.

caught by: test_proposer_reads_only_new_tokens
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch(NgramProposer)
def _same_context(self, tokens):
    if len(tokens) <= self.indexed:
        return False
    return tokens[:self.indexed] == self.seen  # BUG: O(L) on every call, also for the engine's own list
