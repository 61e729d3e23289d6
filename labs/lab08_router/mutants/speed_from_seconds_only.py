"""Mutant: pooled speeds from the seconds alone (1 / total seconds), as if every method emitted
the same tokens: true of greedy decoding to the same length, wrong when a method stops early.

caught by: test_tokens_of_the_chosen_method
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def _rate(table, choices):
    _, seconds = _totals(table, choices)
    return 1.0 / seconds  # BUG: the tokens left out
