"""Mutant: a new context is recognised by its first max_n tokens (and its length), as if two
requests could not share a beginning (they do: a system prompt, a chat template).

caught by: test_proposer_new_context_sharing_tokens
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch(NgramProposer)
def _same_context(self, tokens):
    if len(tokens) <= self.indexed:
        return False
    return tokens[:self.max_n] == self.seen[:self.max_n]  # BUG: the beginning stands for the context
