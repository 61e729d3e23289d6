"""Planted bug: regret the wrong way up, the chooser's speed over the oracle's minus 1: never
positive, and the worse the chooser, the more negative.

caught by: test_regret_example, test_regret_with_a_subset_of_candidates, test_regret_on_the_held_out_table
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def regret(table, choices, candidates):
    return float(_rate(table, choices) / _rate(table, oracle_choices(table, candidates)) - 1)  # BUG: inverted
