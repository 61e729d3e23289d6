"""Mutant: the router is fitted on every method the table timed instead of the candidates it was
given: on a table with the live "router" and "bandit" columns it picks them, and it picks
candidates that were left out.

caught by: test_router_never_picks_a_non_candidate
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())
_solution_fit = fit_router


@patch
def fit_router(table, candidates):
    return _solution_fit(table, table["meta"]["methods"])  # BUG: not the candidates
