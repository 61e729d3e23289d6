"""Mutant: a new context is recognised by one token, the last one indexed (and by its length).
A new request that happens to agree there reuses the old index.

caught by: test_proposer_new_context_sharing_tokens
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch(NgramProposer)
def _same_context(self, tokens):
    if len(tokens) <= self.indexed:
        return False
    return tokens[self.indexed - 1] == self.seen[-1]  # BUG: one token stands for the whole context
