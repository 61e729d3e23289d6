"""Mutant: any list at least as long as the indexed context is taken for its continuation; only
a shorter one starts over.

caught by: test_proposer_new_context_sharing_tokens
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch(NgramProposer)
def _same_context(self, tokens):
    return len(tokens) > self.indexed  # BUG: longer is not the same
