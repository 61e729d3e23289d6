"""Mutant: regret as the oracle's speedup minus the chooser's, a difference of speedups instead
of a ratio of speeds.

caught by: test_regret_example, test_regret_on_the_held_out_table
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def regret(table, choices, candidates):
    return pooled_speedup(table, oracle_choices(table, candidates)) - pooled_speedup(table, choices)  # BUG
